"""The generated EndpointPickerConfig uses only parameters its picker accepts.

The EPP decodes plugin parameters strictly and refuses to start on an unknown
key; harness/epp/accepted_parameters.json lists, per plugin type, the keys its Go
struct takes (read from the source, docs/endpoint-picker.md). This check needs
neither a cluster nor the binary, so it runs everywhere; test_epp.py then runs
the real EPP on the same configs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.epp import accepted_parameters
from harness.epp.rendered import Rendered, example_files, load_example, render_resource
from promptcache.contract import TENANT_SALT_PARSER, TenantSaltParam

ACCEPTED: dict[str, list[str]] = accepted_parameters()
OURS_ACCEPTED = {**ACCEPTED, TENANT_SALT_PARSER: [p.value for p in TenantSaltParam]}
"""promptcache's picker also takes its tenant-salt parser (decoded strictly in Go:
picker/plugins/tenantsalt; test_epp.py starts it on these configs)."""
GIE_BASED = ("gie-v1.5", "promptcache")

VARIANTS = {
    "as-is": {},
    "sessions": {"sessionAffinity": {"enabled": True}},
    "small-blocks": {"prefixCache": {"autoTune": False, "blockSizeTokens": 16}},
    "tiered": {"prefixCache": {"tiers": [{"name": "coarse", "blockSizeTokens": 512}]}},
    "adapters": {"model": {"adapters": [{"name": "sql-lora", "path": "/model-cache/sql"}]}},
    "affinity": {"prefixCache": {"affinityFilter": {"enabled": True, "threshold": 0.5}}},
    "estimate-tokens": {"prefixCache": {"tokenProducer": "Estimate"}},
}


def key_paths(value: Any, prefix: str = "") -> set[str]:
    """Every key path in a parameters object, lists written `key[]`."""
    paths: set[str] = set()
    if isinstance(value, dict):
        for key, sub in value.items():
            path = f"{prefix}.{key}" if prefix else key
            paths.add(path)
            paths |= key_paths(sub, path)
    elif isinstance(value, list):
        for item in value:
            paths |= key_paths(item, f"{prefix}[]")
    return paths


GIE_OFF = {"sessionAffinity": {"enabled": False}, "prefixCache": {"tiers": []}}
"""What GIE v1.5.0 cannot honour (refused by the API for it), switched off for its variants."""


def rendered_configs() -> list[Any]:
    out = []
    for example in example_files():
        for variant, patch in VARIANTS.items():
            router = {**patch, "gateway": {"picker": "llm-d-router"}}
            out.append(pytest.param(example, router, id=f"{example.stem}-{variant}"))
            if variant in ("as-is", "small-blocks", "adapters", "affinity", "estimate-tokens"):
                for picker, suffix in (("gie-v1.5", "gie"), ("promptcache", "promptcache")):
                    gie = {**GIE_OFF, "gateway": {"picker": picker}}
                    for key, value in patch.items():
                        gie[key] = {**gie.get(key, {}), **value}
                    out.append(pytest.param(example, gie, id=f"{example.stem}-{variant}-{suffix}"))
    return out


@pytest.mark.parametrize(("example", "patch"), rendered_configs())
def test_every_emitted_parameter_is_accepted(example: Path, patch: dict[str, Any]) -> None:
    config = Rendered(render_resource(load_example(example, spec_patch=patch))).epp_config
    picker = patch["gateway"]["picker"]
    gie = picker in GIE_BASED
    assert config["apiVersion"] == (
        "inference.networking.x-k8s.io/v1alpha1" if gie else "llm-d.ai/v1alpha1"
    )
    assert config["kind"] == "EndpointPickerConfig"
    parser = {"parser"} if picker == "promptcache" else set()
    allowed = {"apiVersion", "kind", "featureGates", "plugins", "schedulingProfiles", *parser}
    assert set(config) <= allowed
    accepted = OURS_ACCEPTED if parser else ACCEPTED
    names = [p.get("name", p["type"]) for p in config["plugins"]]
    assert len(names) == len(set(names)), f"duplicate plugin names {names}"
    for plugin in config["plugins"]:
        assert plugin["type"] in accepted, f"{plugin['type']} was not verified against the source"
        unknown = key_paths(plugin.get("parameters") or {}) - set(accepted[plugin["type"]])
        assert not unknown, f"{plugin['type']} would be refused for {sorted(unknown)}"
    for ref in config["schedulingProfiles"][0]["plugins"]:
        assert set(ref) <= {"pluginRef", "weight"}
        assert ref["pluginRef"] in names


@pytest.mark.parametrize(("example", "patch"), rendered_configs())
def test_config_says_what_the_epp_really_does(example: Path, patch: dict[str, Any]) -> None:
    """llm-d-router: block sizes are emitted at the 64-token floor; sessions use the
    session_id strategy. GIE: block sizes as given, and no flag it would refuse."""
    rendered = Rendered(render_resource(load_example(example, spec_patch=patch)))
    config = rendered.epp_config
    gie = patch["gateway"]["picker"] in GIE_BASED
    if gie:
        assert "--allow-experimental-plugins" not in rendered.epp_args
        assert "raised to 64" not in rendered.epp_config_text
    for plugin in config["plugins"]:
        params = plugin.get("parameters") or {}
        if plugin["type"] == "approx-prefix-cache-producer" and not gie:
            assert params.get("blockSizeTokens", 16) >= 64, params
        if plugin["type"].startswith("session-affinity"):
            assert params.get("strategy") == "session_id", "the default strategy never sticks"
            assert "--allow-experimental-plugins" in rendered.epp_args
    assert "--config-text" not in rendered.epp_args or "--config-file" not in rendered.epp_args

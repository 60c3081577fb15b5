"""`spec.gateway.picker`: each Endpoint Picker gets only what its binary accepts.

GIE v1.5.0 decodes only the `inference.networking.x-k8s.io/v1alpha1` config, stops on
flags it does not know (`--allow-experimental-plugins`, `--drain-timeout`), has no 64-token
block floor, and cannot honour prefix tiers, sessions or a custom LRU size: the API refuses
those with one message, in the CLI (pydantic) and at the API server (the same rule as CEL,
checked in e2e/test_crd_validation.py), and the renderer refuses them when the operator's
default picker is GIE's underneath (`gie-v1.5`, or `promptcache`, the built-in default),
saying that the empty field got the default.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from promptcache.api import InvalidResourceError, OperatorDefaults, parse_resource
from promptcache.api.rules import (
    GIE_LRU_MESSAGE,
    GIE_SESSIONS_MESSAGE,
    GIE_TIERS_MESSAGE,
    picker_refusals,
)
from promptcache.api.spec import PickerName
from promptcache.contract import DEFAULT_PICKER, PickerTarget
from promptcache.render import RenderError, render, resolved

BASE: dict[str, Any] = {
    "apiVersion": "serving.promptcache.io/v1alpha1",
    "kind": "PromptCacheDeployment",
    "metadata": {"name": "chat", "namespace": "serving"},
    "spec": {"model": {"name": "org/model", "replicas": 2}, "isolation": {"mode": "Shared"}},
}


def doc_with(**spec: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["spec"].update(spec)
    return doc


def epp(manifests: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    (dep,) = [
        m for m in manifests if m["kind"] == "Deployment" and m["metadata"]["name"].endswith("-epp")
    ]
    (cm,) = [m for m in manifests if m["kind"] == "ConfigMap"]
    (container,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "epp"]
    return container, cm["data"]["config.yaml"]


def test_the_api_field_is_the_contracts_enum() -> None:
    """Typed like the isolation mode: the resource, the defaults and render share one enum."""
    assert get_args(PickerName)[0] is PickerTarget
    assert parse_resource(doc_with(gateway={"picker": "gie-v1.5"})).spec.gateway.picker is (
        PickerTarget.GIE
    )
    assert OperatorDefaults(picker=PickerTarget.GIE).picker is PickerTarget.GIE


def test_gie_gets_its_config_dialect_image_and_flags() -> None:
    small = {"autoTune": False, "blockSizeTokens": 16}
    container, text = epp(render(parse_resource(doc_with(
        gateway={"picker": "gie-v1.5"}, prefixCache=small
    ))))  # fmt: skip
    config = yaml.safe_load(text)
    assert config["apiVersion"] == "inference.networking.x-k8s.io/v1alpha1"
    assert container["image"] == "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"
    assert "--allow-experimental-plugins" not in container["args"]
    assert not any(a.startswith("--drain-timeout") for a in container["args"])
    producer = next(p for p in config["plugins"] if p["type"] == "approx-prefix-cache-producer")
    assert producer["parameters"]["blockSizeTokens"] == 16  # no floor on GIE
    assert "raised to 64" not in text
    assert "gie-v1.5" in text.splitlines()[0]


def test_the_built_in_default_is_promptcaches_own_picker() -> None:
    """A resource that names no picker renders exactly as one naming `promptcache`."""
    assert DEFAULT_PICKER is PickerTarget.PROMPTCACHE
    assert OperatorDefaults().picker is PickerTarget.PROMPTCACHE
    for isolation in ({"mode": "Shared"}, {"mode": "PerKey"}):
        named = doc_with(gateway={"picker": "promptcache"}, isolation=isolation)
        assert render(parse_resource(doc_with(isolation=isolation))) == render(
            parse_resource(named)
        )


def test_llm_d_router_keeps_its_dialect_and_the_floor() -> None:
    small = {"autoTune": False, "blockSizeTokens": 16}
    router = OperatorDefaults(picker=PickerTarget.LLM_D_ROUTER)
    for picker in (None, "llm-d-router"):
        gateway = {} if picker is None else {"picker": picker}
        container, text = epp(render(parse_resource(doc_with(
            gateway=gateway, prefixCache=small, sessionAffinity={"enabled": True}
        )), router))  # fmt: skip
        config = yaml.safe_load(text)
        assert config["apiVersion"] == "llm-d.ai/v1alpha1"
        assert container["image"] == "ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.10.0"
        assert "--allow-experimental-plugins" in container["args"]
        producer = next(p for p in config["plugins"] if p["type"] == "approx-prefix-cache-producer")
        assert producer["parameters"]["blockSizeTokens"] == 64
        assert "raised to 64" in text


REFUSED = [
    pytest.param({"prefixCache": {"tiers": [{"name": "coarse"}]}}, GIE_TIERS_MESSAGE, id="tiers"),
    pytest.param({"sessionAffinity": {"enabled": True}}, GIE_SESSIONS_MESSAGE, id="sessions"),
    pytest.param({"prefixCache": {"lruCapacityPerServer": 8000}}, GIE_LRU_MESSAGE, id="lru"),
]


@pytest.mark.parametrize(("spec", "message"), REFUSED)
def test_gie_refuses_what_it_cannot_honour(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidResourceError) as refused:
        parse_resource(doc_with(gateway={"picker": "gie-v1.5"}, **spec))
    assert any(message in str(p) for p in refused.value.problems), refused.value.problems
    # The same resource without a picker is fine for llm-d-router, named or the default...
    pcd = parse_resource(doc_with(**spec))
    render(pcd, OperatorDefaults(picker=PickerTarget.LLM_D_ROUTER))
    render(parse_resource(doc_with(gateway={"picker": "llm-d-router"}, **spec)))
    # ...and refused with the same message when the operator's default is GIE, saying that
    # the empty field got the default.
    with pytest.raises(RenderError) as failed:
        render(pcd, OperatorDefaults(picker=PickerTarget.GIE))
    assert message in str(failed.value)
    assert "gateway.picker is empty, so the operator's default picker gie-v1.5 applies" in str(
        failed.value
    )
    # The built-in default refuses what its rules refuse, in the same words.
    if message in picker_refusals(pcd.spec, DEFAULT_PICKER.value):
        with pytest.raises(RenderError) as failed:
            render(pcd)
        assert str(failed.value).startswith(
            "spec: gateway.picker is empty, so the operator's default picker promptcache "
            "applies (set gateway.picker to choose another): "
        )
        assert message in str(failed.value)
        assert failed.value.reason == "PickerCannotHonour"


def test_an_explicit_picker_beats_the_operator_default() -> None:
    gie = OperatorDefaults(picker=PickerTarget.GIE)
    pcd = parse_resource(doc_with(gateway={"picker": "llm-d-router"}))
    assert resolved(pcd, gie).spec.gateway.picker == "llm-d-router"
    unset = parse_resource(doc_with())
    assert resolved(unset, gie).spec.gateway.picker == "gie-v1.5"
    assert "spec.gateway.picker" in resolved(unset, gie).filled


def test_cli_refuses_with_the_same_message(tmp_path: Path) -> None:
    path = tmp_path / "pcd.yaml"
    path.write_text(yaml.safe_dump(doc_with(prefixCache={"tiers": [{"name": "coarse"}]})))
    cli = [sys.executable, "-m", "promptcache.cli", "render", "-f", str(path)]
    ok = subprocess.run(
        [*cli, "--picker", "llm-d-router"], capture_output=True, text=True, check=False
    )
    assert ok.returncode == 0, ok.stderr
    for picker in ([], ["--picker", "gie-v1.5"]):
        refused = subprocess.run([*cli, *picker], capture_output=True, text=True, check=False)
        assert refused.returncode == 2
        assert GIE_TIERS_MESSAGE in refused.stderr
        assert "gateway.picker is empty, so the operator's default picker" in refused.stderr
        assert "Traceback" not in refused.stderr

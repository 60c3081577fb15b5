"""`sessionAffinity` on `gateway.picker: promptcache`: the picker's own session plugin
(`picker/plugins/sessionaffinity`) is registered with every parameter the resource sets,
and placed first among the profile's filters, so a pinned session keeps its pod whatever
the prefix filter or the scorers prefer (picker/README.md, docs/endpoint-picker.md)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from harness.epp import accepted_parameters
from harness.resources import BASE, rendered
from promptcache.api import parse_resource
from promptcache.api.rules import GIE_SESSIONS_MESSAGE, picker_refusals
from promptcache.contract import (
    DEFAULT_MAX_SESSIONS,
    DEFAULT_SESSION_HEADER,
    SESSION_AFFINITY_PLUGIN,
    SessionParam,
    SessionSource,
)
from promptcache.contract.picker_profiles import SESSION_FILTER
from promptcache.render.epp_config import AFFINITY_FILTER

OURS = {"picker": "promptcache"}


def config(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    (cm,) = [
        m for m in manifests if m["kind"] == "ConfigMap" and m["metadata"]["name"].endswith("-epp")
    ]
    doc: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return doc


def epp_container(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    (dep,) = [
        m for m in manifests if m["kind"] == "Deployment" and m["metadata"]["name"].endswith("-epp")
    ]
    containers: list[dict[str, Any]] = dep["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["epp"], "no policy step in front of our picker"
    return containers[0]


def session_plugin(doc: dict[str, Any]) -> dict[str, Any]:
    (plugin,) = [p for p in doc["plugins"] if p["type"] == SESSION_AFFINITY_PLUGIN]
    found: dict[str, Any] = plugin
    return found


def test_sessions_register_the_plugin_with_the_resources_settings() -> None:
    manifests = rendered(
        gateway=OURS,
        sessionAffinity={"enabled": True, "header": "x-chat", "ttlSeconds": 90},
        prefixCache={"affinityFilter": {"enabled": True}},
    )
    doc = config(manifests)
    assert session_plugin(doc)["parameters"] == {
        "header": "x-chat",
        "sources": ["header", "prompt_cache_key", "user"],
        "ttlSeconds": 90,
        "maxSessions": DEFAULT_MAX_SESSIONS,
    }
    refs = [p["pluginRef"] for p in doc["schedulingProfiles"][0]["plugins"]]
    assert refs[0] == SESSION_AFFINITY_PLUGIN, "the pin comes before every other filter"
    assert refs.index(AFFINITY_FILTER) > 0
    entry = doc["schedulingProfiles"][0]["plugins"][0]
    assert "weight" not in entry, "a filter takes no weight"
    assert SESSION_FILTER not in {p["type"] for p in doc["plugins"]}  # llm-d-router's
    assert "--allow-experimental-plugins" not in epp_container(manifests)["args"]


def test_every_parameter_is_written_and_named_by_the_contract() -> None:
    """The plugin decodes strictly and defaults nothing: the renderer writes every
    `SessionParam`, with sources the plugin knows."""
    params = session_plugin(config(rendered(gateway=OURS, sessionAffinity={"enabled": True})))[
        "parameters"
    ]
    assert set(params) == {p.value for p in SessionParam}
    assert params["header"] == DEFAULT_SESSION_HEADER
    assert params["ttlSeconds"] == 300
    assert {SessionSource(s) for s in params["sources"]} == set(SessionSource)


def test_without_the_user_field_user_names_no_session() -> None:
    doc = config(rendered(gateway=OURS, sessionAffinity={"enabled": True, "useUserField": False}))
    assert session_plugin(doc)["parameters"]["sources"] == ["header", "prompt_cache_key"]


@pytest.mark.parametrize("picker", ["promptcache", "gie-v1.5", "llm-d-router"])
def test_sessions_off_register_no_session_plugin(picker: str) -> None:
    types = {p["type"] for p in config(rendered(gateway={"picker": picker}))["plugins"]}
    assert SESSION_AFFINITY_PLUGIN not in types
    assert SESSION_FILTER not in types


def test_the_api_takes_sessions_for_our_picker_and_still_refuses_them_for_gie() -> None:
    """The refusal that covered both GIE-based pickers now covers the upstream one only."""
    doc = {**BASE, "spec": {**BASE["spec"], "gateway": OURS, "sessionAffinity": {"enabled": True}}}
    pcd = parse_resource(doc)
    assert GIE_SESSIONS_MESSAGE not in picker_refusals(pcd.spec, "promptcache")
    assert GIE_SESSIONS_MESSAGE in picker_refusals(pcd.spec, "gie-v1.5")
    assert "promptcache" in GIE_SESSIONS_MESSAGE  # the message names the way out


def test_the_harness_accepts_exactly_the_contracts_parameters() -> None:
    """`harness/epp/accepted_parameters.json` (what the config tests hold every emitted
    parameter to) lists the session plugin's keys as the contract names them; the Go
    struct is held to the same names by the shared vectors."""
    assert set(accepted_parameters()[SESSION_AFFINITY_PLUGIN]) == {p.value for p in SessionParam}


def test_the_config_text_says_what_the_pin_does() -> None:
    manifests = rendered(gateway=OURS, sessionAffinity={"enabled": True})
    (cm,) = [
        m for m in manifests if m["kind"] == "ConfigMap" and m["metadata"]["name"].endswith("-epp")
    ]
    text: str = cm["data"]["config.yaml"]
    assert f"# {SESSION_AFFINITY_PLUGIN}: a session stays on its pod" in text
    assert "gie-v1.5" not in text

"""The checked-in CRD is exactly what the models generate: `crds/` can never drift from `api/`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from promptcache.api.crd import custom_resource_definition
from promptcache.api.rules import RULES
from promptcache.yamlio import dump_all

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "serving.promptcache.io_promptcachedeployments.yaml"


def test_checked_in_crd_is_fresh() -> None:
    assert CRD_FILE.read_text(encoding="utf-8") == dump_all([custom_resource_definition()]), (
        "crds/ is stale: run `promptcache crd > crds/serving.promptcache.io_promptcachedeployments.yaml`"
    )


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        out.append((path, node))
        for key in ("properties",):
            for name, child in node.get(key, {}).items():
                out += _walk(child, f"{path}.{name}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                out += _walk(node[key], f"{path}[{key}]")
    return out


def test_schema_is_structural() -> None:
    """What the API server demands of a structural schema: a type everywhere (but on
    int-or-string and preserve-unknown-fields nodes), no refs, no `additionalProperties:
    false`, `anyOf` only in the int-or-string form."""
    schema = custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "$ref" not in node, path
        assert "title" not in node, path
        assert node.get("additionalProperties") is not False, path
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string") is True, path
        elif node.get("x-kubernetes-preserve-unknown-fields") is not True:
            assert "type" in node, f"{path} has no type"
        assert not ("properties" in node and "additionalProperties" in node), path


def test_every_cross_field_rule_is_in_the_crd() -> None:
    schema = custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    found = [
        (v["rule"], v["message"])
        for _, node in _walk(schema)
        for v in node.get("x-kubernetes-validations", [])
    ]
    # Every rule sits on the object its CEL is written for (never on a list of them).
    for path, node in _walk(schema):
        if node.get("x-kubernetes-validations"):
            assert node.get("type") == "object", path
    # A rule of a shared object (a pod template's metadata) sits once per use.
    assert set(found) == {(rule.cel, rule.message) for rule in RULES}


def test_scale_subresource_and_printer_columns() -> None:
    version = custom_resource_definition()["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.model.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Hit-Ratio"] == ".status.prefixCache.recentHitRatio"  # the last 5 minutes
    assert set(columns) >= {"Model", "Replicas", "Ready", "Isolation", "Hit-Ratio", "Age"}


def test_defaults_reach_nested_objects() -> None:
    """An object field defaults to its full default object: the API server checks the CEL
    rules of an object against its default without filling nested defaults first, so `{}`
    made the CRD invalid (`no such key: mode evaluating rule`)."""
    spec = custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"
    ]["spec"]
    assert spec["properties"]["isolation"]["default"]["mode"] == "PerKey"
    assert spec["properties"]["isolation"]["properties"]["mode"]["default"] == "PerKey"
    assert spec["properties"]["prefixCache"]["properties"]["lruCapacityPerServer"] == {
        "default": 31250,
        "description": spec["properties"]["prefixCache"]["properties"]["lruCapacityPerServer"][
            "description"
        ],
        "exclusiveMinimum": True,
        "minimum": 0,
        "type": "integer",
    }


def test_checked_in_api_reference_is_fresh() -> None:
    from promptcache.api.reference import api_reference_markdown

    assert (ROOT / "docs" / "api-reference.md").read_text(encoding="utf-8") == (
        api_reference_markdown()
    ), "docs/api-reference.md is stale: run `promptcache docs > docs/api-reference.md`"

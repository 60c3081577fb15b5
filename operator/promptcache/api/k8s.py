"""Kubernetes' own types inside the resource (affinity, volumes, env, ...), one schema for both
sides.

The schemas come from the upstream OpenAPI definitions (`tools/k8s_schemas.py` extracts them
into `k8s_schemas.json`). The CRD embeds them, so the API server checks these fields exactly
as it checks a PodSpec; the CLI checks the same schema here, so `promptcache render` refuses
what the API server would.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from importlib import resources
from typing import Annotated, Any

from pydantic import PlainValidator, WithJsonSchema

SUBPATH_MARK = "@"
"""A validation message `@sub.path: text` is reported at the field's path plus `sub.path`."""

_LIMITS: dict[str, int] = {"name": 253, "mountPath": 4096, "topologyKey": 316}
"""Length bounds the API server needs to estimate the cost of the CEL rules over these
fields (PodSpec validation enforces tighter ones when the pod is created)."""


@cache
def _schemas() -> dict[str, Any]:
    text = resources.files("promptcache.api").joinpath("k8s_schemas.json").read_text("utf-8")
    schemas: dict[str, Any] = json.loads(text)["schemas"]
    return schemas


def kubernetes_version() -> str:
    text = resources.files("promptcache.api").joinpath("k8s_schemas.json").read_text("utf-8")
    version: str = json.loads(text)["kubernetesVersion"]
    return version


@cache
def _bounded_schema(name: str) -> dict[str, Any]:
    return _bounded(_schemas()[name])


def _bounded(schema: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(schema)
    for name, child in out.get("properties", {}).items():
        if name in _LIMITS and child.get("type") == "string":
            child["maxLength"] = _LIMITS[name]
    return out


def _describe(kind: str) -> str:
    return {
        "object": "must be an object",
        "array": "must be a list",
        "string": "must be a string",
        "integer": "must be an integer",
        "number": "must be a number",
        "boolean": "must be true or false",
    }.get(kind, f"must be {kind}")


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def check(  # noqa: C901 - one branch per schema keyword, as the API server checks them
    schema: dict[str, Any], value: Any, path: str = ""
) -> list[tuple[str, str]]:
    """(sub-path, message) for each way `value` breaks the structural `schema`."""
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, int | str):
            return [(path, "must be an integer or a string")]
        return []
    kind = schema.get("type")
    if kind == "object":
        if not isinstance(value, dict):
            return [(path, _describe(kind))]
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return []
        out: list[tuple[str, str]] = []
        props: dict[str, Any] = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if key in props:
                out += check(props[key], item, _join(path, key))
            elif isinstance(extra, dict):
                out += check(extra, item, _join(path, key))
            else:
                out.append((_join(path, key), "unknown field"))
        out += [
            (_join(path, key), "required field is missing")
            for key in schema.get("required", [])
            if key not in value
        ]
        return out
    if kind == "array":
        if not isinstance(value, list):
            return [(path, _describe(kind))]
        items = schema.get("items", {})
        return [p for i, item in enumerate(value) for p in check(items, item, _join(path, i))]
    ok = {
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
    }.get(kind or "", True)
    if not ok:
        return [(path, _describe(kind or ""))]
    if isinstance(value, str) and len(value) > schema.get("maxLength", len(value)):
        return [(path, f"must be at most {schema['maxLength']} characters")]
    if "enum" in schema and value not in schema["enum"]:
        return [(path, "must be one of: " + ", ".join(str(v) for v in schema["enum"]))]
    return []


def _validator(name: str) -> Any:
    def validate(value: Any) -> Any:
        problems = check(_bounded_schema(name), value)
        if problems:
            raise ValueError(
                "\n".join(f"{SUBPATH_MARK}{sub}: {message}" if sub else message
                          for sub, message in problems)
            )  # fmt: skip
        return value

    return validate


def kubernetes_type(name: str) -> Any:
    """A field typed by Kubernetes' own schema of core/v1 `name` (e.g. `Affinity`)."""
    return Annotated[
        dict[str, Any],
        PlainValidator(_validator(name)),
        WithJsonSchema(_bounded_schema(name)),
    ]


Affinity = kubernetes_type("Affinity")
TopologySpreadConstraint = kubernetes_type("TopologySpreadConstraint")
LocalObjectReference = kubernetes_type("LocalObjectReference")
Volume = kubernetes_type("Volume")
VolumeMount = kubernetes_type("VolumeMount")
EnvVar = kubernetes_type("EnvVar")

"""Generate the CustomResourceDefinition from the pydantic models.

pydantic emits JSON Schema 2020-12 with `$ref`s; the API server wants a
structural OpenAPI v3 schema without references, with `nullable` instead of
`null` unions and with defaults it can apply server-side. This module does that
translation and nothing else, so `crds/` can never drift from `api/`.
"""

from __future__ import annotations

import copy
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema, to_jsonable_python

from promptcache.api.constants import (
    CATEGORIES,
    CRD_NAME,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
)
from promptcache.api.podtemplate import (
    GatewayContainerOverlay,
    GatewayPodSpecOverlay,
    ModelContainerOverlay,
    ModelPodSpecOverlay,
    PodMetadataOverlay,
)
from promptcache.api.rules import rules_for
from promptcache.api.spec import (
    AutoscalingSpec,
    EngineSpec,
    GatewaySpec,
    IsolationSpec,
    LoraAdapter,
    ModelSpec,
    PrefixCacheSpec,
    PromptCacheDeploymentSpec,
)
from promptcache.api.status import PromptCacheDeploymentStatus

_RULE_SCOPES: dict[type[BaseModel], str] = {
    PromptCacheDeploymentSpec: "spec",
    ModelSpec: "model",
    LoraAdapter: "adapter",
    AutoscalingSpec: "autoscaling",
    EngineSpec: "engine",
    PodMetadataOverlay: "podMetadata",
    ModelPodSpecOverlay: "modelPodSpec",
    ModelContainerOverlay: "modelContainer",
    GatewayPodSpecOverlay: "gatewayPodSpec",
    GatewayContainerOverlay: "gatewayContainer",
    GatewaySpec: "gateway",
    IsolationSpec: "isolation",
    PrefixCacheSpec: "prefixCache",
}
_DROP_KEYS = ("title", "$defs", "discriminator")


class _DefaultsIncluded(GenerateJsonSchema):
    """Include `default_factory` results as defaults, so the API server fills nested objects."""

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        factory = schema.get("default_factory")
        if factory is None:
            return super().default_schema(schema)
        json_schema = self.generate_inner(schema["schema"])
        value = factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            value = value.model_dump(mode="json", by_alias=True, exclude_none=True)
        json_schema["default"] = to_jsonable_python(value)
        return json_schema


def _model_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(
        by_alias=True, mode="validation", schema_generator=_DefaultsIncluded
    )
    schema: dict[str, Any] = _structural(raw, raw.get("$defs", {}))
    return schema


def _resolve(ref: str, defs: dict[str, Any]) -> dict[str, Any]:
    name = ref.rsplit("/", 1)[-1]
    return copy.deepcopy(defs[name])


def _structural(node: Any, defs: dict[str, Any]) -> Any:  # noqa: C901 - one case per keyword
    """Rewrite one JSON-schema node into the API server's structural dialect."""
    if isinstance(node, list):
        return [_structural(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        target = _resolve(node.pop("$ref"), defs)
        target.update(node)  # the field's own description/default win over the class's
        node = target
    if "allOf" in node and len(node["allOf"]) == 1:
        target = node.pop("allOf")[0]
        target = _resolve(target["$ref"], defs) if "$ref" in target else target
        target.update(node)
        node = target
    any_of = node.get("anyOf")
    if any_of and not node.get("x-kubernetes-int-or-string"):
        non_null = [option for option in any_of if option.get("type") != "null"]
        if len(non_null) == 1 and len(non_null) < len(any_of):
            node.pop("anyOf")
            merged = _structural(non_null[0], defs)
            merged.update({k: v for k, v in node.items() if k != "default" or v is not None})
            merged["nullable"] = True
            node = merged
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if "enum" in node and "type" not in node:
        node["type"] = "string" if all(isinstance(v, str) for v in node["enum"]) else "integer"
    if isinstance(node.get("exclusiveMinimum"), int | float) and not isinstance(
        node.get("exclusiveMinimum"), bool
    ):
        node["minimum"] = node.pop("exclusiveMinimum")
        node["exclusiveMinimum"] = True
    if isinstance(node.get("exclusiveMaximum"), int | float) and not isinstance(
        node.get("exclusiveMaximum"), bool
    ):
        node["maximum"] = node.pop("exclusiveMaximum")
        node["exclusiveMaximum"] = True
    if node.get("default", 0) is None:
        node.pop("default")
    if node.get("additionalProperties") is False:
        node.pop("additionalProperties")  # forbidden in structural schemas; pruning does the job
    for key in _DROP_KEYS:
        node.pop(key, None)
    for key in ("properties",):
        if key in node:
            node[key] = {name: _structural(child, defs) for name, child in node[key].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            node[key] = _structural(node[key], defs)
    if "anyOf" in node:
        node["anyOf"] = [_strip_types_for_int_or_string(o) for o in node["anyOf"]]
    return node


def _strip_types_for_int_or_string(option: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in option.items() if k == "type"}


def _attach_rules(schema: dict[str, Any], model: type[BaseModel], path: list[str]) -> None:
    """Add `x-kubernetes-validations` of each rule scope at its object's schema."""
    scope = _RULE_SCOPES.get(model)
    if scope:
        rules = [
            {
                "rule": r.cel,
                "message": r.message,
                **({"fieldPath": r.field_path} if r.field_path else {}),
            }
            for r in rules_for(scope)
        ]
        if rules:
            schema["x-kubernetes-validations"] = rules
    for name, field in model.model_fields.items():
        annotation = field.annotation
        alias = field.alias or name
        child = schema.get("properties", {}).get(alias)
        if child is None:
            continue
        model_type = _optional_model(annotation)
        if model_type is not None:
            _attach_rules(child, model_type, [*path, alias])
        item = _list_item_model(annotation)
        if item is not None and isinstance(child.get("items"), dict):
            _attach_rules(child["items"], item, [*path, alias, "[]"])


def _optional_model(annotation: Any) -> type[BaseModel] | None:
    """`X` of a field typed `X` or `X | None` where X is a model."""
    union = get_origin(annotation) in (Union, UnionType)
    options = [a for a in get_args(annotation) if a is not type(None)] if union else [annotation]
    if len(options) == 1 and isinstance(options[0], type) and issubclass(options[0], BaseModel):
        return options[0]
    return None


def _list_item_model(annotation: Any) -> type[BaseModel] | None:
    """`X` of a `list[X]` field whose items are models (rules attach to `items`)."""
    if get_origin(annotation) is not list:
        return None
    (item,) = get_args(annotation)
    while get_origin(item) is Annotated:
        item = get_args(item)[0]
    return item if isinstance(item, type) and issubclass(item, BaseModel) else None


def _status_schema() -> dict[str, Any]:
    schema = _model_schema(PromptCacheDeploymentStatus)
    conditions = schema["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    return schema


_WITHOUT_DEFAULTS: tuple[tuple[str, ...], ...] = (
    ("model", "podTemplate"),
    ("gateway", "podTemplate"),
)
"""Overlays the API server stores as written: no defaults filled in (the rules use `has`)."""


def _drop_defaults(node: Any) -> None:
    if isinstance(node, dict):
        node.pop("default", None)
        for child in node.values():
            _drop_defaults(child)
    elif isinstance(node, list):
        for child in node:
            _drop_defaults(child)


def openapi_schema() -> dict[str, Any]:
    """The `openAPIV3Schema` of the resource."""
    spec = _model_schema(PromptCacheDeploymentSpec)
    _attach_rules(spec, PromptCacheDeploymentSpec, ["spec"])
    for path in _WITHOUT_DEFAULTS:
        node = spec
        for key in path:
            node = node["properties"][key]
        _drop_defaults(node)
    return {
        "type": "object",
        "description": (
            "PromptCacheDeployment turns one model into a prompt-cache-aware serving stack: "
            "vLLM model servers, a cache front, an InferencePool and its Endpoint Picker."
        ),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": _status_schema(),
        },
    }


PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".spec.model.replicas"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
    {"name": "Isolation", "type": "string", "jsonPath": ".spec.isolation.mode"},
    {
        "name": "Hit-Ratio",
        "type": "number",
        "description": "Prefix-cache hit ratio over the last 5 minutes",
        "jsonPath": ".status.prefixCache.recentHitRatio",
    },
    {
        "name": "Status",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def custom_resource_definition() -> dict[str, Any]:
    """The whole CRD object, ready to apply."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {
                "app.kubernetes.io/name": "promptcache",
                "app.kubernetes.io/part-of": "promptcache",
            },
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": list(CATEGORIES),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.model.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }

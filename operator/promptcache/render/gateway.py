"""The gateway side: the InferencePool the Endpoint Picker serves, and the HTTPRoute to it.

With `gateway.route.routeByModel` several resources share one Gateway: the route matches the
body-based router's base-model header, and a ConfigMap tells the router which names (the
served model and its adapters) belong to this resource (`contract.router`).
"""

from __future__ import annotations

from typing import Any

from promptcache.api import PromptCacheDeployment
from promptcache.contract import SERVING_PORT
from promptcache.contract.router import (
    BASE_MODEL_HEADER,
    MAPPING_ADAPTERS_KEY,
    MAPPING_BASE_MODEL_KEY,
    MAPPING_FINALIZER,
    MAPPING_LABEL,
)
from promptcache.render.epp import GRPC_PORT, POOL_GROUP
from promptcache.render.names import Component, Names, metadata, selector_labels
from promptcache.yamlio import dump

ROUTE_REQUEST_TIMEOUT = "300s"
"""Long generations outlive Envoy's 15 s default route timeout."""


def inference_pool(pcd: PromptCacheDeployment, names: Names) -> dict[str, Any]:
    return {
        "apiVersion": f"{POOL_GROUP}/v1",
        "kind": "InferencePool",
        "metadata": metadata(names, names.pool, Component.GATEWAY),
        "spec": {
            "selector": {"matchLabels": selector_labels(names, Component.MODEL_SERVER)},
            "targetPorts": [{"number": SERVING_PORT}],
            "endpointPickerRef": {
                "group": "",
                "kind": "Service",
                "name": names.epp,
                "port": {"number": GRPC_PORT},
                "failureMode": pcd.spec.gateway.failure_mode,
            },
        },
    }


def http_route(pcd: PromptCacheDeployment, names: Names) -> dict[str, Any] | None:
    """None when no Gateway is named: the pool is then reached by whatever the user wires."""
    route = pcd.spec.gateway.route
    if not route.parent_refs:
        return None
    spec: dict[str, Any] = {
        "parentRefs": [
            ref.model_dump(by_alias=True, exclude_none=True) for ref in route.parent_refs
        ],
        "rules": [
            {
                "matches": [_match(pcd)],
                "backendRefs": [{"group": POOL_GROUP, "kind": "InferencePool", "name": names.pool}],
                "timeouts": {"request": ROUTE_REQUEST_TIMEOUT},
            }
        ],
    }
    if route.hostnames:
        spec["hostnames"] = list(route.hostnames)
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": metadata(names, names.route, Component.GATEWAY),
        "spec": spec,
    }


def _match(pcd: PromptCacheDeployment) -> dict[str, Any]:
    """Every request, or (routeByModel) those the router found to be for this model."""
    match: dict[str, Any] = {"path": {"type": "PathPrefix", "value": "/"}}
    if pcd.spec.gateway.route.route_by_model:
        served = pcd.spec.model.effective_served_name
        match["headers"] = [{"type": "Exact", "name": BASE_MODEL_HEADER, "value": served}]
    return match


def model_map(pcd: PromptCacheDeployment, names: Names) -> dict[str, Any] | None:
    """The body-based router's mapping of this resource's adapters to its served model
    (routeByModel only). The served model maps to itself once it is listed here, so the
    router's base-model header is set for both, and stays empty for a name no resource on
    the Gateway serves: no rule matches it and the Gateway answers 404."""
    if not pcd.spec.gateway.route.route_by_model:
        return None
    meta = metadata(names, names.model_map, Component.GATEWAY)
    meta["labels"] = {**meta["labels"], MAPPING_LABEL: "true"}  # type: ignore[dict-item]
    # It goes only once the router has seen it unlabelled (controller/router_map.py).
    meta["finalizers"] = [MAPPING_FINALIZER]
    adapters = [a.name for a in pcd.spec.model.adapters]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {
            MAPPING_BASE_MODEL_KEY: pcd.spec.model.effective_served_name,
            MAPPING_ADAPTERS_KEY: dump(adapters) if adapters else "",
        },
    }

"""The gateway side: the InferencePool the Endpoint Picker serves, and the HTTPRoute to it."""

from __future__ import annotations

from typing import Any

from promptcache.api import PromptCacheDeployment
from promptcache.contract import SERVING_PORT
from promptcache.render.epp import GRPC_PORT, POOL_GROUP
from promptcache.render.names import Component, Names, metadata, selector_labels

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
                "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
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

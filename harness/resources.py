"""The smallest valid resource and its manifests, for tests that change one field; and
finding one manifest (or the Endpoint Picker's containers, or a container's env) among them."""

from __future__ import annotations

import argparse
import copy
from typing import Any

from promptcache.api import parse_resource
from promptcache.contract import Command
from promptcache.gateway.command import settings_from
from promptcache.gateway.settings import GatewayPolicySettings
from promptcache.render import render

BASE: dict[str, Any] = {
    "apiVersion": "serving.promptcache.io/v1alpha1",
    "kind": "PromptCacheDeployment",
    "metadata": {"name": "chat", "namespace": "serving"},
    "spec": {"model": {"name": "org/model", "replicas": 2}},
}


def rendered(**spec: Any) -> list[dict[str, Any]]:
    """The manifests of BASE with `spec` merged over its top-level spec fields."""
    doc = copy.deepcopy(BASE)
    doc["spec"].update(spec)
    return render(parse_resource(doc))


def by_kind(
    manifests: list[dict[str, Any]], kind: str, component: str | None = None
) -> dict[str, Any]:
    """The one manifest of `kind` (and component label, when given) in `manifests`."""
    found = [
        m
        for m in manifests
        if m["kind"] == kind
        and (
            component is None or m["metadata"]["labels"]["app.kubernetes.io/component"] == component
        )
    ]
    assert len(found) == 1, f"{kind}/{component}: {len(found)}"
    return found[0]


def epp_deployment(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    """The Endpoint Picker's Deployment (its name ends in `-epp`)."""
    (dep,) = [
        m for m in manifests if m["kind"] == "Deployment" and m["metadata"]["name"].endswith("-epp")
    ]
    return dep


def epp_containers(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The Endpoint Picker pod's containers, by name."""
    pod = epp_deployment(manifests)["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["containers"]}


def env_of(container: dict[str, Any]) -> dict[str, str]:
    """A container's env entries that carry a literal value (not those from a Secret)."""
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def gateway_policy_settings(container: dict[str, Any]) -> GatewayPolicySettings:
    """What `promptcache gateway-policy` makes of the rendered container (args are the CLI's)."""
    assert container["args"] == [Command.GATEWAY_POLICY]
    return settings_from(argparse.Namespace(), env_of(container))


def routed_resource(
    name: str,
    served: str,
    adapters: list[str],
    *,
    namespace: str = "team",
    route_by_model: bool = True,
    ready: int | None = 1,
    ready_adapters: list[str] | None = None,
    parent: dict[str, str] | None = None,
    **route: Any,
) -> dict[str, Any]:
    """A resource serving `served` and `adapters` on the Gateway `gw/shared` (or `parent`),
    routing by model, with the status the operator writes when `ready` replicas are ready
    and `ready_adapters` (default: all) are served on them; `ready=None`: no status."""
    served_adapters = adapters if ready_adapters is None else ready_adapters
    doc: dict[str, Any] = {
        "apiVersion": "serving.promptcache.io/v1alpha1",
        "kind": "PromptCacheDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {
                "name": f"org/{served}",
                "servedModelName": served,
                "adapters": [{"name": a, "path": f"/model-cache/{a}"} for a in adapters],
            },
            "gateway": {
                "route": {
                    "parentRefs": [parent or {"name": "shared", "namespace": "gw"}],
                    "routeByModel": route_by_model,
                    **route,
                }
            },
        },
    }
    if ready is not None:
        doc["status"] = {"readyReplicas": ready}
        if adapters:
            doc["status"]["adapters"] = [
                {"name": a, "readyReplicas": ready if a in served_adapters else 0} for a in adapters
            ]
    return doc

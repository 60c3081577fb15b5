"""Pure rendering: a PromptCacheDeployment in, the list of Kubernetes manifests out.

No cluster access, no clock, no randomness: the same resource always renders to
the same bytes, which is what lets GitOps users commit the output and lets the
operator skip writes when nothing changed. Owner references and generated
Secrets are the controller's business, not render's.

    >>> manifests = render(parse_resource(doc))
    >>> [m["kind"] for m in manifests][:2]
    ['ServiceAccount', 'Role']
"""

from __future__ import annotations

from typing import Any

from promptcache.api import (
    BUILT_IN_DEFAULTS,
    OperatorDefaults,
    PromptCacheDeployment,
    ResolvedDeployment,
    resolved,
)
from promptcache.api.rules import picker_refusals
from promptcache.render.autoscaling import autoscaler
from promptcache.render.epp import (
    epp_cluster_role_binding,
    epp_config_map,
    epp_deployment,
    epp_network_policy,
    epp_role,
    epp_role_binding,
    epp_service,
    epp_service_account,
)
from promptcache.render.gateway import http_route, inference_pool, model_map
from promptcache.render.model_server import (
    model_server_deployment,
    model_server_pdb,
    model_server_service,
)
from promptcache.render.monitoring import MONITORING_KINDS, pod_monitors
from promptcache.render.names import Names, RenderError, names_of
from promptcache.render.picker import picker_of

__all__ = [
    "GATEWAY_KINDS",
    "MONITORING_KINDS",
    "Names",
    "RenderError",
    "names_of",
    "render",
    "resolved",
]

PICKER_PATH = "spec.gateway.picker"

GATEWAY_KINDS = frozenset({"InferencePool", "HTTPRoute"})
"""Kinds whose CRDs come from Gateway API / GIE and may be missing from a cluster."""


def _refusal(refused: list[str], pcd: ResolvedDeployment) -> str:
    """The rules' messages; when the resource named no picker, first which one it got, since
    the messages name pickers the user never wrote (the default became promptcache after 0.1.0)."""
    text = "; ".join(refused)
    if PICKER_PATH not in pcd.filled:
        return text
    return (
        f"gateway.picker is empty, so the operator's default picker {picker_of(pcd).value} "
        f"applies (set gateway.picker to choose another): {text}"
    )


def render(
    pcd: PromptCacheDeployment, defaults: OperatorDefaults = BUILT_IN_DEFAULTS
) -> list[dict[str, Any]]:
    """Every child of the resource, in an order that applies cleanly (RBAC and config first).

    The resource is rendered as `resolved` (api.resolve) gives it: `defaults` fill what it
    leaves empty (the operator's, or `render`'s flags), and nothing below reads a default of
    its own. A resource resolved already renders the same whatever `defaults`. Raises
    `RenderError` when the picker the resource resolves to cannot honour a field (the API
    server refuses the same when `gateway.picker` names it)."""
    pcd = resolved(pcd, defaults)
    refused = picker_refusals(pcd.spec, picker_of(pcd))
    if refused:
        raise RenderError("spec", _refusal(refused, pcd), reason="PickerCannotHonour")
    names = names_of(pcd)
    picker_role = pcd.operator.endpoint_picker_cluster_role
    rbac: list[dict[str, Any] | None] = (
        [epp_cluster_role_binding(names, picker_role)]
        if picker_role
        else [epp_role(pcd, names), epp_role_binding(names)]
    )
    manifests: list[dict[str, Any] | None] = [
        epp_service_account(names),
        *rbac,
        epp_config_map(pcd, names),
        model_server_service(names),
        epp_service(names),
        epp_network_policy(pcd, names),
        model_server_deployment(pcd, names),
        epp_deployment(pcd, names),
        model_server_pdb(names),
        inference_pool(pcd, names),
        http_route(pcd, names),
        model_map(pcd, names),
        *pod_monitors(pcd, names),
        autoscaler(pcd, names),
    ]
    return [m for m in manifests if m is not None]

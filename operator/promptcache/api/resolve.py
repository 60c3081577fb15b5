"""The resource as it is deployed: every operator-wide default filled in, in one place.

A resource may leave fields empty that an operator-wide default fills (`OperatorDefaults`:
the picker, the images, the PodMonitors), and the operator has facts no resource field
names (the vLLM container's UID, the picker's static ClusterRole). `resolved` applies all
of them once and returns a `ResolvedDeployment`; render, status and the controller read
only that. A module that reads an empty defaulted field instead of the resolved one gets
`UnresolvedError`, not a silent built-in default: that silent fallback is how the status once
described a picker other than the one render deployed.

    >>> pcd = resolved(parse_resource(doc), OperatorDefaults(pod_monitors=True))
    >>> pcd.spec.monitoring.enabled, "spec.monitoring.enabled" in pcd.filled
    (True, True)
    >>> resolved(pcd, BUILT_IN_DEFAULTS) is pcd  # a resolved resource is final
    True
"""

from __future__ import annotations

from typing import Annotated, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from promptcache.api.base import ObjectName
from promptcache.api.defaults import BUILT_IN_DEFAULTS, OperatorDefaults
from promptcache.api.resource import PromptCacheDeployment

__all__ = ["OperatorFacts", "ResolvedDeployment", "UnresolvedError", "filled", "resolved"]

T = TypeVar("T")


class UnresolvedError(RuntimeError):
    """A defaulted field read before `resolved` filled it (a programming error)."""


def filled(value: T | None, path: str) -> T:
    """`value` of the defaulted field at `path`; `UnresolvedError` when it is still empty."""
    if value is None:
        raise UnresolvedError(f"{path} is empty: read the resolved resource (api.resolved)")
    return value


class OperatorFacts(BaseModel):
    """What the operator decides that no resource field names (from `OperatorDefaults`)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    model_server_user: Annotated[int, Field(ge=1, le=2**31 - 1)] | None
    """UID (and GID, fsGroup) of the vLLM container; None leaves it to the platform."""
    endpoint_picker_cluster_role: ObjectName | None
    """The chart's static ClusterRole each picker binds to; None: a Role per picker."""


class ResolvedDeployment(PromptCacheDeployment):
    """A resource with every operator default applied: no defaulted field is empty.

    A subclass, so every function of a `PromptCacheDeployment` takes it; the two extra
    fields are not part of the resource (never dumped, never in the CRD)."""

    operator: OperatorFacts = Field(exclude=True)
    """The operator's facts for this resource."""
    filled: frozenset[str] = Field(exclude=True)
    """Paths of the fields the operator filled (the resource left them empty): a message
    may then say which default applied, e.g. a picker the user never named."""


def resolved(
    pcd: PromptCacheDeployment, defaults: OperatorDefaults = BUILT_IN_DEFAULTS
) -> ResolvedDeployment:
    """The resource as it is deployed: each field it leaves empty that an operator-wide
    default fills, filled; the operator's other facts attached.

    Idempotent, and final: a resolved resource is returned as it is, whatever `defaults`
    (`resolved(resolved(p, d), e) is resolved(p, d)`)."""
    if isinstance(pcd, ResolvedDeployment):
        return pcd
    spec = pcd.spec
    empty: set[str] = set()

    def fill(path: str, value: T | None, default: T) -> T:
        if value is not None:
            return value
        empty.add(path)
        return default

    gateway = spec.gateway.model_copy(
        update={
            "picker": fill("spec.gateway.picker", spec.gateway.picker, defaults.picker),
            "gateway_policy_image": fill(
                "spec.gateway.gatewayPolicyImage",
                spec.gateway.gateway_policy_image,
                defaults.gateway_policy_image,
            ),
        }
    )
    front = spec.front.model_copy(
        update={"image": fill("spec.front.image", spec.front.image, defaults.front_image)}
    )
    monitoring = spec.monitoring.model_copy(
        update={
            "enabled": fill(
                "spec.monitoring.enabled", spec.monitoring.enabled, defaults.pod_monitors
            )
        }
    )
    new_spec = spec.model_copy(
        update={"gateway": gateway, "front": front, "monitoring": monitoring}
    )
    facts = OperatorFacts(
        model_server_user=defaults.model_server_user,
        endpoint_picker_cluster_role=defaults.endpoint_picker_cluster_role,
    )
    fields = {name: getattr(pcd, name) for name in PromptCacheDeployment.model_fields}
    return ResolvedDeployment.model_construct(
        _fields_set=set(pcd.model_fields_set),
        **{**fields, "spec": new_spec, "operator": facts, "filled": frozenset(empty)},
    )

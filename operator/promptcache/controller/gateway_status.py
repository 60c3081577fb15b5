"""GatewayReady from what the Gateway's controller says, not from "we applied it" (pure).

A Gateway controller reports on every route and InferencePool it handles, one
entry per parent Gateway in `status.parents[]`, each with the conditions
`Accepted` and `ResolvedRefs` (Gateway API; the Inference Extension uses the
same shape for InferencePools). GatewayReady is True only when every Gateway the
HTTPRoute names accepted it with its references resolved, and the InferencePool
is accepted by its parents. Otherwise the condition quotes the controller's own
reason and message, naming the object and the Gateway.

The address clients use is read from the parent Gateways' `status.addresses`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from promptcache.api.status import ConditionType, Reason
from promptcache.controller.conditions import Desired

GATEWAY_GROUP: Final[str] = "gateway.networking.k8s.io"


@dataclass(frozen=True)
class ParentKey:
    """A parent Gateway, normalised (defaults filled from the child's namespace)."""

    namespace: str
    name: str
    section: str = ""

    def __str__(self) -> str:
        return f"Gateway {self.namespace}/{self.name}" + (
            f" (listener {self.section})" if self.section else ""
        )


@dataclass
class GatewayView:
    """The outcome: the condition and the addresses clients reach the model on."""

    condition: Desired
    addresses: list[str] = field(default_factory=list)
    parents: list[ParentKey] = field(default_factory=list)


def _key(ref: Mapping[str, Any], namespace: str) -> ParentKey | None:
    if ref.get("group", GATEWAY_GROUP) != GATEWAY_GROUP or ref.get("kind", "Gateway") != "Gateway":
        return None
    return ParentKey(
        str(ref.get("namespace") or namespace), str(ref.get("name", "")), ref.get("sectionName", "")
    )


def _parents_status(obj: Mapping[str, Any] | None, namespace: str) -> dict[ParentKey, list[Any]]:
    out: dict[ParentKey, list[Any]] = {}
    for entry in ((obj or {}).get("status") or {}).get("parents") or []:
        key = _key(entry.get("parentRef") or {}, namespace)
        if key is not None:
            out[key] = list(entry.get("conditions") or [])
    return out


def _cond(conditions: Sequence[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def _said(cond: Mapping[str, Any]) -> str:
    message = str(cond.get("message") or "").strip()
    return f"{cond.get('reason', '?')}{': ' + message if message else ''}"


def _judge(
    what: str,
    conditions: Sequence[Mapping[str, Any]],
    parent: ParentKey,
    reasons: tuple[str, str],
    generation: int | None,
) -> Desired | None:
    """False naming the parent's own words when it did not accept or resolve; else None."""
    not_accepted, not_resolved = reasons
    accepted = _cond(conditions, "Accepted")
    if accepted is None or accepted.get("status") != "True":
        said = _said(accepted) if accepted else "no Accepted condition yet"
        return Desired(
            ConditionType.GATEWAY_READY, "False", not_accepted, f"{what}: {parent} says {said}"
        )
    stale = accepted.get("observedGeneration")
    if generation is not None and stale is not None and int(stale) < generation:
        return Desired(
            ConditionType.GATEWAY_READY,
            "False",
            not_accepted,
            f"{what}: {parent} has not reported on generation {generation} yet (last saw {stale})",
        )
    resolved = _cond(conditions, "ResolvedRefs")
    if resolved is not None and resolved.get("status") != "True":
        return Desired(
            ConditionType.GATEWAY_READY,
            "False",
            not_resolved,
            f"{what}: {parent} cannot resolve its references: {_said(resolved)}",
        )
    return None


def gateway_addresses(gateways: Sequence[Mapping[str, Any]]) -> list[str]:
    """`status.addresses[].value` of the parent Gateways, in order, without duplicates."""
    seen: list[str] = []
    for gw in gateways:
        for addr in (gw.get("status") or {}).get("addresses") or []:
            value = str(addr.get("value") or "")
            if value and value not in seen:
                seen.append(value)
    return seen


def route_parents(route: Mapping[str, Any] | None, namespace: str) -> list[ParentKey]:
    """The Gateways the HTTPRoute's spec names (the ones whose verdict counts)."""
    keys = [_key(r, namespace) for r in ((route or {}).get("spec") or {}).get("parentRefs") or []]
    return [k for k in keys if k is not None]


def gateway_view(
    *,
    namespace: str,
    pool_name: str,
    pool: Mapping[str, Any] | None,
    route_name: str,
    route: Mapping[str, Any] | None,
    gateways: Sequence[Mapping[str, Any]] = (),
) -> GatewayView:
    """GatewayReady from the HTTPRoute's and the InferencePool's parent status."""
    pool_what = f"InferencePool {pool_name}"
    pool_status = _parents_status(pool, namespace)
    pool_gen = ((pool or {}).get("metadata") or {}).get("generation")
    addresses = gateway_addresses(gateways)
    if route is not None:
        route_what = f"HTTPRoute {route_name}"
        wanted = route_parents(route, namespace)
        reported = _parents_status(route, namespace)
        route_gen = (route.get("metadata") or {}).get("generation")
        for parent in wanted:
            conditions = reported.get(parent)
            if conditions is None:
                return GatewayView(
                    Desired(
                        ConditionType.GATEWAY_READY,
                        "False",
                        Reason.ROUTE_PENDING,
                        f"{route_what}: no status from {parent} yet; check that the Gateway "
                        "exists and its controller is running",
                    ),
                    addresses,
                    wanted,
                )
            verdict = _judge(
                route_what,
                conditions,
                parent,
                (Reason.ROUTE_NOT_ACCEPTED, Reason.ROUTE_REFS_NOT_RESOLVED),
                route_gen,
            )
            if verdict is not None:
                return GatewayView(verdict, addresses, wanted)
        parents = wanted
    else:
        parents = list(pool_status)
        if not parents:
            return GatewayView(
                Desired(
                    ConditionType.GATEWAY_READY,
                    "False",
                    Reason.NO_ROUTE,
                    f"{pool_what} applied, but no HTTPRoute routes to it: set "
                    "spec.gateway.route.parentRefs to a Gateway, or reference the pool from "
                    "an HTTPRoute of your own",
                ),
            )
    for parent in parents:
        conditions = pool_status.get(ParentKey(parent.namespace, parent.name))
        if conditions is None:
            conditions = pool_status.get(parent)
        if conditions is None:
            return GatewayView(
                Desired(
                    ConditionType.GATEWAY_READY,
                    "False",
                    Reason.POOL_PENDING,
                    f"{pool_what}: no status from {parent} yet; does its Gateway controller "
                    "support the Inference Extension?",
                ),
                addresses,
                parents,
            )
        verdict = _judge(
            pool_what,
            conditions,
            parent,
            (Reason.POOL_NOT_ACCEPTED, Reason.POOL_REFS_NOT_RESOLVED),
            pool_gen,
        )
        if verdict is not None:
            return GatewayView(verdict, addresses, parents)
    names = ", ".join(str(p) for p in parents)
    via = f"HTTPRoute {route_name} and {pool_what}" if route is not None else pool_what
    where = f"; clients use {', '.join(addresses)}" if addresses else ""
    return GatewayView(
        Desired(
            ConditionType.GATEWAY_READY,
            "True",
            Reason.ACCEPTED,
            f"{via} accepted by {names}{where}",
        ),
        addresses,
        parents,
    )

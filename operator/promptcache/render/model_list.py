"""One `GET /v1/models` answer per shared Gateway, from the resources that route by model.

Pure, like the rest of render: resources in, OpenAI `ModelList` objects out, so the list
can never disagree with the routes and mappings the same resources render. Resources
without `gateway.route.routeByModel` answer `/v1/models` through their own pool and are left
out. A resource's route attaches to each of its `parentRefs` (a Gateway, optionally one
listener) for each of its hostnames; one without hostnames is reachable under every hostname
of that Gateway, so it is in every list of it. The responder that serves these lists is a
design in docs/multi-model.md, not built yet.

    >>> lists = model_lists([pcd_a, pcd_b])
    >>> lists[GatewayKey("gw", "shared", "", "")]["data"][0]["id"]
    'base-a'
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from promptcache.api import PromptCacheDeployment


@dataclass(frozen=True, order=True)
class GatewayKey:
    """Where a list is answered: a Gateway, a listener of it (empty: any), a hostname
    (empty: requests without a hostname the routes name)."""

    namespace: str
    name: str
    section: str
    hostname: str


@dataclass(frozen=True)
class NameConflict:
    """A name two resources on one Gateway both serve: the router's mapping is global, so
    one of them would win silently."""

    gateway: GatewayKey
    name: str
    resources: tuple[str, ...]


def served_entries(pcd: PromptCacheDeployment) -> list[dict[str, Any]]:
    """The resource's served model and adapters as OpenAI model objects."""
    owner = f"{pcd.metadata.namespace}/{pcd.metadata.name}"
    base = pcd.spec.model.effective_served_name
    entries: list[dict[str, Any]] = [{"id": base, "object": "model", "owned_by": owner}]
    entries += [
        {"id": a.name, "object": "model", "owned_by": owner, "parent": base}
        for a in pcd.spec.model.adapters
    ]
    return entries


def _keys(pcd: PromptCacheDeployment) -> list[GatewayKey]:
    route = pcd.spec.gateway.route
    hostnames = list(route.hostnames) or [""]
    return [
        GatewayKey(ref.namespace or pcd.metadata.namespace, ref.name, ref.section_name or "", host)
        for ref in route.parent_refs
        for host in hostnames
    ]


def _grouped(pcds: Iterable[PromptCacheDeployment]) -> dict[GatewayKey, list[dict[str, Any]]]:
    routed = [p for p in pcds if p.spec.gateway.route.route_by_model]
    by_key: dict[GatewayKey, list[dict[str, Any]]] = defaultdict(list)
    for pcd in routed:
        for key in _keys(pcd):
            by_key[key] += served_entries(pcd)
    # A route without hostnames is reachable under every hostname of its Gateway.
    for key in list(by_key):
        if key.hostname:
            any_host = GatewayKey(key.namespace, key.name, key.section, "")
            by_key[key] += [e for e in by_key.get(any_host, []) if e not in by_key[key]]
    return by_key


def model_lists(pcds: Iterable[PromptCacheDeployment]) -> dict[GatewayKey, dict[str, Any]]:
    """Per Gateway (listener, hostname), the `/v1/models` answer: every served model and
    adapter, sorted by id."""
    return {
        key: {"object": "list", "data": sorted(entries, key=lambda e: (e["id"], e["owned_by"]))}
        for key, entries in sorted(_grouped(pcds).items())
    }


def name_conflicts(pcds: Iterable[PromptCacheDeployment]) -> list[NameConflict]:
    """Names more than one resource serves on the same Gateway (listener, hostname)."""
    out = []
    for key, entries in sorted(_grouped(pcds).items()):
        owners: dict[str, set[str]] = defaultdict(set)
        for e in entries:
            owners[e["id"]].add(e["owned_by"])
        out += [
            NameConflict(key, name, tuple(sorted(who)))
            for name, who in sorted(owners.items())
            if len(who) > 1
        ]
    return out

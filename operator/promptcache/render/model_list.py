"""What `GET /v1/models` answers on a shared Gateway, from the resources that route by model.

Pure, like the rest of render: resources in, an OpenAI `ModelList` out, so the list can
never disagree with the routes and mappings the same resources render. The model-list
responder (`promptcache.catalog`) calls it per request with the resources it watches and
where the request arrived (`Arrival`: the Gateway the responder's HTTPRoute names, and the
request's Host).

- **Which resources:** those with `gateway.route.routeByModel` whose route attaches to that
  Gateway (a listener the route names must be the one the responder's route names, when
  both name one) and whose hostnames admit the request's Host (none: every hostname; Gateway
  API's wildcard `*.example.com` matches one or more labels). Resources without
  `routeByModel` answer `/v1/models` through their own pool and are never listed.
- **Served means ready:** a base model is listed once its resource reports a ready replica,
  an adapter once `status.adapters` reports it on a ready pod. A resource whose pods are still
  starting is absent: a client that picks a name from the list can use it now.
  `known_names` is the spec's view (ready or not), so a request for a name that is merely not
  ready yet can be told "starting", not "does not exist".

    >>> model_list([pcd_a, pcd_b], Arrival("gw", "shared", host="api.example.com"))["data"][0]
    {'id': 'base-a', 'object': 'model', 'owned_by': 'team/a'}
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from promptcache.api import PromptCacheDeployment


@dataclass(frozen=True)
class Arrival:
    """Where a request arrived: a Gateway, the listener the responder's route names (empty:
    any), and the request's Host without port (empty: none sent)."""

    namespace: str
    name: str
    section: str = ""
    host: str = ""


def hostname_matches(pattern: str, host: str) -> bool:
    """Gateway API hostname matching: exact, or `*.suffix` for one or more labels before it."""
    pattern, host = pattern.lower(), host.lower()
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return pattern == host


def attached(pcd: PromptCacheDeployment, at: Arrival) -> bool:
    """Whether the resource's model-routed HTTPRoute takes requests arriving `at`."""
    route = pcd.spec.gateway.route
    if not route.route_by_model:
        return False
    if route.hostnames and not any(hostname_matches(h, at.host) for h in route.hostnames):
        return False
    return any(
        (ref.namespace or pcd.metadata.namespace, ref.name) == (at.namespace, at.name)
        and (not ref.section_name or not at.section or ref.section_name == at.section)
        for ref in route.parent_refs
    )


def owner(pcd: PromptCacheDeployment) -> str:
    """`<namespace>/<name>`: the `owned_by` of every entry the resource serves."""
    return f"{pcd.metadata.namespace}/{pcd.metadata.name}"


def served_entries(pcd: PromptCacheDeployment, *, ready_only: bool = True) -> list[dict[str, Any]]:
    """The resource's model and adapters as OpenAI model objects; with `ready_only`, only
    those its status reports on a ready pod (the base: `readyReplicas`; an adapter: its
    `status.adapters[].readyReplicas`)."""
    base = pcd.spec.model.effective_served_name
    status = pcd.status
    ready_adapters = (
        {a.name for a in (status.adapters or []) if a.ready_replicas > 0} if status else set()
    )
    base_ready = status is not None and status.ready_replicas > 0
    entries: list[dict[str, Any]] = []
    if base_ready or not ready_only:
        entries.append({"id": base, "object": "model", "owned_by": owner(pcd)})
    entries += [
        {"id": a.name, "object": "model", "owned_by": owner(pcd), "parent": base}
        for a in pcd.spec.model.adapters
        if not ready_only or (base_ready and a.name in ready_adapters)
    ]
    return entries


def model_list(
    pcds: Iterable[PromptCacheDeployment],
    at: Arrival,
    *,
    created: Mapping[str, int] | None = None,
    ready_only: bool = True,
) -> dict[str, Any]:
    """The `/v1/models` answer for a request arriving `at`, sorted by id then owner.
    `created` (by `owned_by`) adds each entry's `created`, in Unix seconds."""
    entries = [e for p in pcds if attached(p, at) for e in served_entries(p, ready_only=ready_only)]
    if created:
        for entry in entries:
            if entry["owned_by"] in created:
                entry["created"] = created[entry["owned_by"]]
    return {"object": "list", "data": sorted(entries, key=lambda e: (e["id"], e["owned_by"]))}


def known_names(pcds: Iterable[PromptCacheDeployment], at: Arrival) -> set[str]:
    """Every name the resources attached at `at` declare, ready or not."""
    return {e["id"] for p in pcds if attached(p, at) for e in served_entries(p, ready_only=False)}


@dataclass(frozen=True)
class NameConflict:
    """A name more than one model-routed resource declares. The body-based router's mapping
    is one map for every Gateway it serves, so one of them wins silently, whatever Gateway
    or hostname each route names."""

    name: str
    resources: tuple[str, ...]


def name_conflicts(pcds: Iterable[PromptCacheDeployment]) -> list[NameConflict]:
    """Names that several resources routing by model declare, sorted."""
    owners: dict[str, set[str]] = defaultdict(set)
    for pcd in pcds:
        if pcd.spec.gateway.route.route_by_model:
            for entry in served_entries(pcd, ready_only=False):
                owners[entry["id"]].add(owner(pcd))
    return [
        NameConflict(name, tuple(sorted(who)))
        for name, who in sorted(owners.items())
        if len(who) > 1
    ]

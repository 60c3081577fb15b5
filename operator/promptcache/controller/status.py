"""The status the operator reports, computed from what it observed (pure).

The reconcile gathers observations; this module turns them into the `.status`
object, with the conditions `controller/conditions.py` builds. The caller
compares the result with the live status and writes only when they differ.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from promptcache.api import PromptCacheDeployment
from promptcache.api.status import (
    Condition,
    ConditionType,
    GatewayStatus,
    PrefixCacheStatus,
    PromptCacheDeploymentStatus,
    PromptEmbedsStatus,
)
from promptcache.controller import conditions as conditions_of
from promptcache.controller.conditions import set_condition
from promptcache.controller.observation import Observation, Problem
from promptcache.controller.scrape import ScrapedPrefixCache
from promptcache.render.picker import picker_target

__all__ = [
    "Observation",
    "Problem",
    "compute_status",
    "format_bytes",
    "prefix_cache_status",
    "selector_string",
    "status_differs",
]

_UNITS = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def format_bytes(n: int) -> str:
    """Bytes as the exact, shortest binary quantity (`8Gi`, `1536Mi`, `0`)."""
    for suffix, size in _UNITS:
        if n and n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)


def prefix_cache_status(
    pcd: PromptCacheDeployment, scraped: ScrapedPrefixCache
) -> PrefixCacheStatus:
    """The pods' reports, and what the Endpoint Picker makes of them and of the spec.

    Only the main producer is described: tiers are configured values the config shows."""
    spec = pcd.spec.prefix_cache
    picker = picker_target(pcd)
    return PrefixCacheStatus(
        scraped_pods=scraped.scraped_pods,
        block_size=scraped.block_size,
        num_gpu_blocks=scraped.num_gpu_blocks,
        hit_ratio=scraped.hit_ratio,
        effective_block_size_tokens=picker.block_size(
            auto_tune=spec.auto_tune, configured=spec.block_size_tokens, scraped=scraped.block_size
        ),
        index_capacity_per_pod=picker.index_capacity(
            auto_tune=spec.auto_tune,
            configured=spec.lru_capacity_per_server,
            gpu_blocks=scraped.num_gpu_blocks,
        ),
    )


def compute_status(
    obs: Observation, previous: Mapping[str, Any] | None, *, now: str
) -> dict[str, Any]:
    """The full `.status` (no None values), keeping transition times that did not move."""
    conditions = list((previous or {}).get("conditions") or [])
    wanted = [
        conditions_of.ready(obs),
        conditions_of.progressing(obs),
        conditions_of.degraded(obs),
        conditions_of.gateway(obs),
    ]
    if obs.monitoring is not None:
        wanted.append(obs.monitoring)
    elif obs.blocked is None:
        conditions = [c for c in conditions if c.get("type") != ConditionType.MONITORING_READY]
    if obs.blocked is None:  # retired: an older operator's condition goes
        conditions = [c for c in conditions if c.get("type") != ConditionType.DEPRECATED_FIELDS]
    if obs.cache_delivering is not None:
        wanted.append(obs.cache_delivering)
    elif obs.blocked is None:
        conditions = [c for c in conditions if c.get("type") != ConditionType.CACHE_DELIVERING]
    for desired in wanted:
        conditions, _ = set_condition(conditions, desired, generation=obs.generation, now=now)
    st = dict((obs.model_server or {}).get("status") or {})
    ceiling = obs.ceiling
    status = PromptCacheDeploymentStatus(
        observed_generation=obs.generation,
        conditions=[Condition.model_validate(c) for c in conditions],
        replicas=int(st.get("replicas") or 0),
        ready_replicas=int(st.get("readyReplicas") or 0),
        selector=obs.selector,
        prompt_embeds=PromptEmbedsStatus(
            per_pod_bytes=ceiling.per_pod_bytes if ceiling else 0,
            total_bytes=ceiling.total_bytes if ceiling else 0,
            per_pod=format_bytes(ceiling.per_pod_bytes) if ceiling else "0",
        ),
        prefix_cache=obs.prefix_cache,
        cache=obs.cache,
        gateway=GatewayStatus(addresses=list(obs.gateway_addresses))
        if obs.gateway_addresses
        else None,
        adapters=list(obs.adapters) or None,
    )
    written: dict[str, Any] = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    return written


def _drop_none(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def status_differs(new: Mapping[str, Any], live: Mapping[str, Any] | None) -> bool:
    """True when writing `new` would change the stored status."""
    return bool(_drop_none(dict(new)) != _drop_none(dict(live or {})))


def selector_string(labels: Mapping[str, str]) -> str:
    """A label selector string in a stable order, as the scale subresource reports it."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))

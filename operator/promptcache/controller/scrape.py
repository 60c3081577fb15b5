"""Observed prefix-cache settings and served adapters: scrape the ready model-server pods.

vLLM (and the cache front, which merges vLLM's metrics into its own) reports
`vllm:cache_config_info{block_size=..., num_gpu_blocks=...}` and the counters
`vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total`. The status
shows what the pods really run with, which is what the Endpoint Picker
auto-tunes to. Scrapes are concurrent, bounded and short: a slow pod costs at
most the timeout and never blocks other resources.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from promptcache.contract import LadderCounter
from promptcache.controller.adapters import served_models
from promptcache.controller.options import DEFAULT_SCRAPE_PORT

CACHE_CONFIG = "vllm:cache_config_info"
HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
MAX_METRICS_BYTES = 4 * 1024 * 1024
"""A pod answering with more than this is not a vLLM metrics page; stop reading."""
T = TypeVar("T")
MODELS_PATH = "/v1/models"
MAX_MODELS_BYTES = 1024 * 1024
"""32 adapters and a base model list in a few KiB; more is not vLLM's answer."""


LADDER: tuple[LadderCounter, ...] = tuple(LadderCounter)
"""The ladder's counters, in the order `PodMetrics.ladder` holds them (`controller.ladder`)."""


@dataclass(frozen=True)
class PodMetrics:
    block_size: int | None
    num_gpu_blocks: int | None
    hits: float
    queries: float
    ladder: tuple[float, ...] = (0.0,) * len(LADDER)
    """The cache front's ladder counters (`LADDER` order), summed over scope classes."""


def _int_label(labels: Mapping[str, str], name: str) -> int | None:
    raw = labels.get(name)
    try:
        return int(float(raw)) if raw not in (None, "", "None") else None
    except ValueError:
        return None


_WANTED = (
    CACHE_CONFIG,
    HITS.removesuffix("_total"),
    QUERIES.removesuffix("_total"),
    *(c.value for c in LADDER),
)
_LADDER_INDEX = {c.sample: i for i, c in enumerate(LADDER)}


def relevant_lines(text: str) -> str:
    """Only the samples of the metrics the status reads. A vLLM page has hundreds of
    lines (histogram buckets above all); parsing all of them for three values was most of
    a scrape's cost, and scraping grows with the fleet."""
    return "".join(line + "\n" for line in text.splitlines() if line.startswith(_WANTED))


def parse_metrics(text: str) -> PodMetrics:
    """Pick the prefix-cache facts out of Prometheus text exposition (sums over labels)."""
    block_size = num_blocks = None
    hits = queries = 0.0
    ladder = [0.0] * len(LADDER)
    for family in text_string_to_metric_families(relevant_lines(text)):
        for sample in family.samples:
            if sample.name == CACHE_CONFIG:
                block_size = _int_label(sample.labels, "block_size")
                num_blocks = _int_label(sample.labels, "num_gpu_blocks")
            elif sample.name == HITS:
                hits += float(sample.value)
            elif sample.name == QUERIES:
                queries += float(sample.value)
            elif (at := _LADDER_INDEX.get(sample.name)) is not None:
                ladder[at] += float(sample.value)
    return PodMetrics(block_size, num_blocks, hits, queries, tuple(ladder))


@dataclass(frozen=True)
class ScrapedPrefixCache:
    """What the ready pods that answered say, before the spec is taken into account."""

    scraped_pods: int = 0
    block_size: int | None = None
    """The most common `block_size` across pods."""
    num_gpu_blocks: int | None = None
    """The smallest `num_gpu_blocks` across pods."""
    hit_ratio: float | None = None


def aggregate(pods: Sequence[PodMetrics]) -> ScrapedPrefixCache:
    """Combine the pods that answered."""
    sizes = Counter(p.block_size for p in pods if p.block_size is not None)
    blocks = [p.num_gpu_blocks for p in pods if p.num_gpu_blocks is not None]
    queries = sum(p.queries for p in pods)
    return ScrapedPrefixCache(
        scraped_pods=len(pods),
        block_size=sizes.most_common(1)[0][0] if sizes else None,
        num_gpu_blocks=min(blocks) if blocks else None,
        hit_ratio=(
            round(min(1.0, sum(p.hits for p in pods) / queries), 4) if queries > 0 else None
        ),
    )


def selected(
    objects: Iterable[Mapping[str, Any]], match_labels: Mapping[str, str]
) -> list[dict[str, Any]]:
    """The objects whose labels include every one of `match_labels` (a label selector)."""
    return [
        dict(o)
        for o in objects
        if all(
            ((o.get("metadata") or {}).get("labels") or {}).get(k) == v
            for k, v in match_labels.items()
        )
    ]


def ready_pod_ips(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """IPs of pods that are Ready and not terminating."""
    ips = []
    for pod in pods:
        if pod.get("metadata", {}).get("deletionTimestamp"):
            continue
        status = pod.get("status", {})
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        if ready and status.get("podIP"):
            ips.append(str(status["podIP"]))
    return ips


async def _get(
    session: aiohttp.ClientSession, url: str, timeout_s: float, cap: int
) -> bytes | None:
    """The body of a 200 answer, at most `cap` bytes (None: no answer, or another status)."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            if response.status != 200:
                return None
            return await response.content.read(cap)
    except (aiohttp.ClientError, TimeoutError):
        return None


def _url(ip: str, port: int, path: str) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}{path}"


async def _scrape_one(
    session: aiohttp.ClientSession, ip: str, port: int, timeout_s: float
) -> PodMetrics | None:
    body = await _get(session, _url(ip, port, "/metrics"), timeout_s, MAX_METRICS_BYTES)
    if body is None:
        return None
    try:
        return parse_metrics(body.decode("utf-8", errors="replace"))
    except (ValueError, UnicodeError):
        return None


async def _each_pod(
    ips: Sequence[str],
    fetch: Callable[[str], Awaitable[T | None]],
    limit: asyncio.Semaphore | None,
) -> dict[str, T]:
    """`fetch` every IP concurrently under the gate; those that gave nothing are left out."""
    gate = limit or asyncio.Semaphore(16)

    async def one(ip: str) -> tuple[str, T | None]:
        async with gate:
            return ip, await fetch(ip)

    results = await asyncio.gather(*(one(ip) for ip in ips))
    return {ip: r for ip, r in results if r is not None}


async def scrape(
    session: aiohttp.ClientSession,
    ips: Sequence[str],
    *,
    port: int = DEFAULT_SCRAPE_PORT,
    timeout_s: float = 2.0,
    limit: asyncio.Semaphore | None = None,
) -> list[PodMetrics]:
    """Scrape every IP concurrently; pods that fail or time out are left out."""
    found = await scrape_by_ip(session, ips, port=port, timeout_s=timeout_s, limit=limit)
    return list(found.values())


async def scrape_by_ip(
    session: aiohttp.ClientSession,
    ips: Sequence[str],
    *,
    port: int = DEFAULT_SCRAPE_PORT,
    timeout_s: float = 2.0,
    limit: asyncio.Semaphore | None = None,
) -> dict[str, PodMetrics]:
    """Like `scrape`, keyed by pod IP (the windowed hit ratio follows each pod's counters)."""
    return await _each_pod(ips, lambda ip: _scrape_one(session, ip, port, timeout_s), limit)


async def served_models_by_ip(
    session: aiohttp.ClientSession,
    ips: Sequence[str],
    *,
    port: int = DEFAULT_SCRAPE_PORT,
    timeout_s: float = 2.0,
    limit: asyncio.Semaphore | None = None,
) -> dict[str, dict[str, str]]:
    """What each pod's `GET /v1/models` lists (id -> root), through the front (a read-only
    route that needs no isolation key), keyed by IP; pods that fail or time out are left
    out."""

    async def fetch(ip: str) -> dict[str, str] | None:
        body = await _get(session, _url(ip, port, MODELS_PATH), timeout_s, MAX_MODELS_BYTES)
        return None if body is None else served_models(body)

    return await _each_pod(ips, fetch, limit)

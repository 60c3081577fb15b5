"""The front's Prometheus metrics, and the merge with vLLM's own.

The front owns the pod's serving port, so the Endpoint Picker scrapes the
front: `/metrics` must carry vLLM's `vllm:*` series unchanged, followed by the
front's own `promptcache_front_*` series. The names never collide, so a plain
concatenation of the two text expositions is a valid exposition.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from promptcache.contract import LadderCounter
from promptcache.embeds.cache import PromptEmbedsCacheStats
from promptcache.front.hits import ScopeClass, Tally

PREFIX: Final = "promptcache_front"
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"


class _CacheCollector(Collector):
    """Reads the prompt-embeds cache's own counters at scrape time (spec/000 stats)."""

    def __init__(self, stats: Callable[[], PromptEmbedsCacheStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        p = f"{PREFIX}_prompt_embeds_cache"
        yield CounterMetricFamily(f"{p}_hits", "Cache lookups that found a payload.", s.hits)
        yield CounterMetricFamily(f"{p}_lookups", "Cache lookups made.", s.lookups)
        yield GaugeMetricFamily(
            f"{p}_hit_ratio", "Fraction of lookups that hit (0 before any).", s.hit_ratio
        )
        yield GaugeMetricFamily(f"{p}_entries", "Payloads held.", s.entries)
        yield GaugeMetricFamily(f"{p}_used_bytes", "Bytes charged to the cache.", s.used_bytes)
        yield GaugeMetricFamily(
            f"{p}_capacity_bytes", "Bytes the cache may hold (0 = disabled).", s.capacity_bytes
        )
        yield CounterMetricFamily(f"{p}_inserts", "Payloads stored.", s.inserts)
        yield CounterMetricFamily(
            f"{p}_evictions", "Entries evicted (least recently used) to make room.", s.evictions
        )
        yield CounterMetricFamily(
            f"{p}_oversize_rejections",
            "Payloads never cached because they were larger than the whole cache.",
            s.oversize_rejections,
        )


_LADDER: Final = tuple(LadderCounter)
_ACCOUNTED, _PREDICTED, _DELIVERED, _ESTIMATED, _WORKLOAD, _CAPACITY = (
    _LADDER.index(c)
    for c in (
        LadderCounter.ACCOUNTED,
        LadderCounter.PREDICTED,
        LadderCounter.DELIVERED,
        LadderCounter.ESTIMATED,
        LadderCounter.WORKLOAD,
        LadderCounter.CAPACITY,
    )
)
_LADDER_HELP: Final[dict[LadderCounter, str]] = {
    LadderCounter.ACCOUNTED: "Prompt tokens of requests that carried a valid prediction of "
    "promptcache's picker and whose usage reported cached_tokens, by isolation scope class: "
    "the denominator of the predicted and delivered hit ratios.",
    LadderCounter.PREDICTED: "Of those, the tokens the picker expected the pod to hold (its "
    "prefix match: its share of the prompt's blocks, of the prompt tokens), by scope class.",
    LadderCounter.DELIVERED: "Of those, the tokens vLLM served from its prefix cache "
    "(cached_tokens), by scope class.",
    LadderCounter.ESTIMATED: "Of the accounted prompt tokens, those whose prediction carried "
    "the picker's workload and capacity estimates, by scope class: their denominator.",
    LadderCounter.WORKLOAD: "Of those, the tokens a perfect, infinitely large cache would "
    "have served (the prefix was seen in the pool, in its scope, within the picker's "
    "window), by scope class.",
    LadderCounter.CAPACITY: "Of those, the tokens a cache of the pool's KV size would have "
    "served (the picker's LRU simulation), by scope class.",
}


class _LadderCollector(Collector):
    """The ladder's counters (docs/monitoring.md, the ladder), from the front's totals."""

    def __init__(self, totals: dict[ScopeClass, list[float]]) -> None:
        self._totals = totals

    def collect(self) -> Iterator[Metric]:
        for i, counter in enumerate(_LADDER):
            family = CounterMetricFamily(counter.value, _LADDER_HELP[counter], labels=["scope"])
            for scope, values in self._totals.items():
                family.add_metric([scope.value], values[i])
            yield family


class _ByOutcome(Collector):
    """A counter by one label whose value the caller counts in `counts`: plain floats the
    event loop adds to, read at scrape time (as the ladder's), for a count made on every
    request where `Counter.labels(...).inc()` and its lock would be most of the cost."""

    def __init__(self, name: str, documentation: str, label: str) -> None:
        self._name, self._documentation, self._label = name, documentation, label
        self.counts: dict[str, float] = {}
        """By label value: only values counted at least once are exposed."""

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self._name, self._documentation, labels=[self._label])
        for value, count in list(self.counts.items()):  # a copy made in one C call
            family.add_metric([value], count)
        yield family


class FrontMetrics:
    """One registry per app, so tests can run several fronts in one process."""

    def __init__(self, cache_stats: Callable[[], PromptEmbedsCacheStats]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            f"{PREFIX}_requests",
            "Requests answered, by endpoint and HTTP status.",
            ["endpoint", "code"],
            registry=r,
        )
        self.refusals = Counter(
            f"{PREFIX}_refusals",
            "Requests the front answered itself with an error, by the error's stable code.",
            ["code"],
            registry=r,
        )
        self.id_lookups = Counter(
            f"{PREFIX}_prompt_embeds_id_lookups",
            "Prompt-embeds identifiers referenced by clients, by endpoint and result.",
            ["endpoint", "result"],
            registry=r,
        )
        self.uploads = Counter(
            f"{PREFIX}_prompt_embeds_uploads",
            "Uploaded prompt-embeds payloads, by verification result.",
            ["result"],
            registry=r,
        )
        self.bytes_saved = Counter(
            f"{PREFIX}_prompt_embeds_bytes_saved",
            "Payload bytes clients did not send because they referenced an identifier.",
            registry=r,
        )
        self.isolation = Counter(
            f"{PREFIX}_isolation_decisions",
            "Isolation decisions, by configured mode and outcome.",
            ["mode", "decision"],
            registry=r,
        )
        self.fair_share_waits = Counter(
            f"{PREFIX}_fair_share_waits",
            "Large request bodies held back for their key's fair share while other keys were "
            "active (front.fair_share); those refused instead are refusals{code="
            '"fair_share_exceeded"}.',
            registry=r,
        )
        self.fair_share_wait_seconds = Counter(
            f"{PREFIX}_fair_share_wait_seconds",
            "Time large request bodies spent waiting for their key's fair share.",
            registry=r,
        )
        self.client_salt_removed = Counter(
            f"{PREFIX}_client_cache_salt_removed",
            "Requests that arrived with a cache_salt other than the one the isolation policy "
            "derives (a client's own or a forged one), which the front replaced or removed; "
            "the salt the gateway's policy step set is not counted.",
            registry=r,
        )
        self.attestations = Counter(
            f"{PREFIX}_identity_attestations",
            "What the front made of the policy step's signed account on requests to a "
            "deployment isolated by account: valid, absent, malformed, forged, expired, "
            "future, replayed or ambiguous (every outcome but valid means no account).",
            ["outcome"],
            registry=r,
        )
        self.max_len_not_enforced = Counter(
            f"{PREFIX}_prompt_cache_max_len_not_enforced",
            "Requests with a positive prompt_cache_max_len, which vLLM cannot enforce.",
            registry=r,
        )
        self.controls_removed = Counter(
            f"{PREFIX}_client_controls_removed",
            "vLLM request controls a client sent that the front did not forward: the "
            "x-request-id header and request_id field (replaced by a fresh id), the "
            "x-vllm-priority header (unless client priorities are allowed).",
            ["control"],
            registry=r,
        )
        self.upstream_errors = Counter(
            f"{PREFIX}_upstream_errors",
            "Requests vLLM could not answer, by kind.",
            ["kind"],
            registry=r,
        )
        self.write_timeouts = Counter(
            f"{PREFIX}_write_timeouts",
            "Answers cut off because the client stopped reading for the write timeout.",
            registry=r,
        )
        self.deadlines = Counter(
            f"{PREFIX}_deadlines",
            "Deadlines that fired, by deadline: header (a connection sent no complete "
            "request head, or stayed idle, for the header timeout; it is closed), body (a "
            "body did not arrive within the body timeout; 408), write (a client read nothing "
            "of its answer for the write timeout; cut). Each freed what its request held.",
            ["deadline"],
            registry=r,
        )
        self.share_refusals = Counter(
            f"{PREFIX}_tenant_share_refusals",
            "Requests refused (429 tenant_share_exceeded) because their client identity held "
            "its share of a resource: slots (maxConcurrency), body_reads "
            "(maxConcurrentBodyReads) or memory (memoryBudgetBytes).",
            ["resource"],
            registry=r,
        )
        self.client_disconnects = Counter(
            f"{PREFIX}_client_disconnects",
            "Requests the client abandoned; the upstream request was cancelled.",
            registry=r,
        )
        self.prompt_tokens = Counter(
            f"{PREFIX}_usage_prompt_tokens",
            "Prompt tokens vLLM reported in the usage of answered requests.",
            registry=r,
        )
        self.cached_prompt_tokens = Counter(
            f"{PREFIX}_usage_cached_prompt_tokens",
            "Of those, tokens served from the prefix cache (usage.prompt_tokens_details."
            "cached_tokens; counted only when vLLM reports it).",
            registry=r,
        )
        self.predictions = _ByOutcome(
            f"{PREFIX}_predictions",
            "What the front made of the picker's signed predicted-match header "
            "(x-promptcache-predicted): valid, absent, malformed, forged, expired, future, "
            "replayed, ambiguous, or unverifiable (this front has no salt key to check it). "
            "Only valid ones are counted as predicted.",
            "outcome",
        )
        r.register(self.predictions)
        self.in_flight = Gauge(
            f"{PREFIX}_in_flight_requests", "Requests being worked on now.", registry=r
        )
        self.upstream_metrics_up = Gauge(
            f"{PREFIX}_upstream_metrics_up",
            "1 if the last scrape of vLLM's /metrics succeeded, else 0.",
            registry=r,
        )
        r.register(_CacheCollector(cache_stats))
        self._request_children: dict[tuple[str, int], Counter] = {}
        self._refusal_children: dict[str, Counter] = {}
        self._decision_children: dict[tuple[str, str], Counter] = {}
        self._control_children: dict[str, Counter] = {}
        self.ladder = {scope: [0.0] * len(LadderCounter) for scope in ScopeClass}
        """Per scope class, the ladder's counters (`LadderCounter` order): plain floats the
        event loop adds to, read at scrape time (an increment of a client counter, with its
        lock, cost more than the whole accounting)."""
        r.register(_LadderCollector(self.ladder))

    def waited_for_share(self, seconds: float) -> None:
        """A request waited `seconds` for its key's fair share (`tenancy.fair_share`)."""
        self.fair_share_waits.inc()
        self.fair_share_wait_seconds.inc(seconds)

    def deadline_fired(self, deadline: str) -> None:
        """Count one firing of the header, body or write deadline."""
        self.deadlines.labels(deadline=deadline).inc()

    def share_refused(self, resource: str) -> None:
        """Count one refusal of a client over its share of `resource` (`tenancy.shares`)."""
        self.share_refusals.labels(resource=resource).inc()

    def refuse(self, code: str) -> None:
        """Count one refusal by its stable error code."""
        child = self._refusal_children.get(code)
        if child is None:
            child = self._refusal_children[code] = self.refusals.labels(code=code)
        child.inc()

    def control_removed(self, control: str) -> None:
        """Count one client control (header or field) not forwarded to vLLM."""
        child = self._control_children.get(control)
        if child is None:
            child = self._control_children[control] = self.controls_removed.labels(control=control)
        child.inc()

    def decided(self, mode: str, decision: str) -> None:
        """Count one isolation decision."""
        key = (mode, decision)
        child = self._decision_children.get(key)
        if child is None:
            child = self._decision_children[key] = self.isolation.labels(
                mode=mode, decision=decision
            )
        child.inc()

    def answered(self, endpoint: str, status: int) -> None:
        """Count one answer by route template and status (children cached: both sets are
        bounded, and `labels()` costs more than the increment)."""
        key = (endpoint, status)
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = self.requests.labels(
                endpoint=endpoint, code=str(status)
            )
        child.inc()

    def observe_usage(
        self, prompt_tokens: int, cached_tokens: int | None, tally: Tally | None = None
    ) -> None:
        """Count one response's usage: the cached-token share the dashboard shows, and,
        for a request the picker predicted (`tally`), the predicted/delivered triple."""
        prompt = max(0, prompt_tokens)
        self.prompt_tokens.inc(prompt)
        if cached_tokens is None:
            return
        cached = min(max(0, cached_tokens), prompt)
        self.cached_prompt_tokens.inc(max(0, cached_tokens))
        if tally is None or tally.prediction is None:
            return
        p, w = tally.prediction, tally.weight
        predicted, workload, capacity = p.ladder(prompt)
        totals = self.ladder[tally.scope]
        totals[_ACCOUNTED] += w * prompt
        totals[_PREDICTED] += w * predicted
        totals[_DELIVERED] += w * cached
        if p.seen_blocks is not None and p.held_blocks is not None:  # p.estimated
            totals[_ESTIMATED] += w * prompt
            totals[_WORKLOAD] += w * workload
            totals[_CAPACITY] += w * capacity

    def predicted(self, outcome: str, weight: float = 1.0) -> None:
        """Count what the front made of one request's predicted-match header (`weight`:
        the requests it stands for, `front.sampling`)."""
        counts = self.predictions.counts
        counts[outcome] = counts.get(outcome, 0.0) + weight

    def render(self) -> bytes:
        """The front's own exposition text."""
        return generate_latest(self.registry)


def merge_expositions(upstream: bytes | None, own: bytes) -> bytes:
    """vLLM's exposition followed by the front's, as one valid text exposition."""
    if not upstream:
        return own
    text = upstream
    # An OpenMetrics '# EOF' must only end the whole document; drop vLLM's.
    lines = text.rstrip(b"\n").split(b"\n")
    if lines and lines[-1].strip() == b"# EOF":
        lines = lines[:-1]
    return b"\n".join(lines) + b"\n" + own

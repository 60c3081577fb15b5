"""The operator's own Prometheus metrics, in a registry of its own.

A private registry (not the process-global default) keeps two operators in one
test process apart and exposes nothing the operator did not define.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from promptcache.controller.kube import WRITE_VERBS, plural_of


@dataclass
class OperatorMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.reconciles = Counter(
            "promptcache_reconciles",
            "Reconciles of PromptCacheDeployments, by trigger and result.",
            ["trigger", "result"],
            registry=r,
        )
        self.failures = Counter(
            "promptcache_reconcile_failures",
            "Reconciles that ended in an error or a Degraded condition, by reason.",
            ["reason"],
            registry=r,
        )
        self.duration = Histogram(
            "promptcache_reconcile_duration_seconds",
            "Wall time of one reconcile.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.children_applied = Counter(
            "promptcache_children_applied",
            "Children written with server-side apply, by kind.",
            ["kind"],
            registry=r,
        )
        self.status_writes = Counter(
            "promptcache_status_writes", "Status subresource writes.", registry=r
        )
        self.api_requests = Counter(
            "promptcache_api_requests",
            "Requests the operator sent to the API server, by HTTP verb.",
            ["verb"],
            registry=r,
        )
        self.api_writes = Counter(
            "promptcache_api_writes",
            "Write requests the operator sent, by resource (plural[/subresource]).",
            ["resource"],
            registry=r,
        )
        self.leader = Gauge(
            "promptcache_leader", "1 while this replica holds the leader Lease.", registry=r
        )
        self.managed = Gauge(
            "promptcache_resources", "PromptCacheDeployments this operator manages.", registry=r
        )

    def count_request(self, verb: str, path: str) -> None:
        self.api_requests.labels(verb).inc()
        if verb in WRITE_VERBS:
            self.api_writes.labels(plural_of([p for p in path.split("/") if p])).inc()

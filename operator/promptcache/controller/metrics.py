"""The operator's own Prometheus metrics, in a registry of its own.

A private registry (not the process-global default) keeps two operators in one
test process apart and exposes nothing the operator did not define.
"""

from __future__ import annotations

import contextlib
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
        self.throttles = Counter(
            "promptcache_api_throttled",
            "429 answers from the API server, each waited out for its Retry-After.",
            registry=r,
        )
        self.throttle_wait = Counter(
            "promptcache_api_throttle_wait_seconds",
            "Seconds the Retry-After of those 429s asked for (before jitter).",
            registry=r,
        )
        self.watch_errors = Counter(
            "promptcache_watch_errors",
            "Failed lists or watches of the informers, by error.",
            ["reason"],
            registry=r,
        )
        self.cache_objects = Gauge(
            "promptcache_cache_objects",
            "Objects held by the informers, by kind (as of the last full resync).",
            ["kind"],
            registry=r,
        )
        self.cache_bytes = Gauge(
            "promptcache_cache_bytes",
            "Bytes of compact JSON the informers hold, by kind (as of the last full resync).",
            ["kind"],
            registry=r,
        )
        self.scrapes = Counter(
            "promptcache_pod_scrapes",
            "Model-server pod /metrics scrapes, by result (ok, failed).",
            ["result"],
            registry=r,
        )
        self.scrape_duration = Histogram(
            "promptcache_scrape_duration_seconds",
            "Wall time of one resource's pod scrapes (all its ready pods).",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.leader = Gauge(
            "promptcache_leader", "1 while this replica holds the leader Lease.", registry=r
        )
        self.managed = Gauge(
            "promptcache_resources",
            "PromptCacheDeployments this operator manages (as of its last full resync).",
            registry=r,
        )
        # Per resource, for alerting (docs/monitoring.md); labels name the resource, so the
        # operator's ServiceMonitor honours them (honorLabels).
        per_resource = ["namespace", "promptcache_deployment"]
        self.model_server_desired = Gauge(
            "promptcache_model_server_replicas_desired",
            "Model-server replicas the resource asks for (spec.model.replicas).",
            per_resource,
            registry=r,
        )
        self.model_server_ready = Gauge(
            "promptcache_model_server_replicas_ready",
            "Model-server replicas ready (the Deployment's readyReplicas).",
            per_resource,
            registry=r,
        )

    def set_replicas(self, namespace: str, name: str, desired: int, ready: int) -> None:
        self.model_server_desired.labels(namespace, name).set(desired)
        self.model_server_ready.labels(namespace, name).set(ready)

    def drop_resource(self, namespace: str, name: str) -> None:
        for gauge in (self.model_server_desired, self.model_server_ready):
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, name)

    def throttled(self, wait_s: float) -> None:
        self.throttles.inc()
        self.throttle_wait.inc(wait_s)

    def count_request(self, verb: str, path: str) -> None:
        self.api_requests.labels(verb).inc()
        if verb in WRITE_VERBS:
            self.api_writes.labels(plural_of([p for p in path.split("/") if p])).inc()

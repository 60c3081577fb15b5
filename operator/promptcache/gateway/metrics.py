"""The policy step's own counters, served on `--metrics-listen`."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from promptcache.tenancy.errors import FrontError


class PolicyMetrics:
    """The step's own counters (served by `serve` on `--metrics-listen`)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.refusals = Counter(
            "promptcache_gateway_policy_refusals",
            "Requests the policy step answered itself, by error code",
            ["code"],
            registry=self.registry,
        )
        self.internal_errors = Counter(
            "promptcache_gateway_policy_internal_errors",
            "Failures inside the step, each answered with a refusal (it fails closed)",
            registry=self.registry,
        )
        self.fair_share_waits = Counter(
            "promptcache_gateway_policy_fair_share_waits",
            "Requests held back for their key's fair share while other keys were active "
            '(those refused instead are refusals{code="fair_share_exceeded"})',
            registry=self.registry,
        )
        self.fair_share_wait_seconds = Counter(
            "promptcache_gateway_policy_fair_share_wait_seconds",
            "Time requests spent waiting for their key's fair share",
            registry=self.registry,
        )
        self.deadlines = Counter(
            "promptcache_gateway_policy_deadlines",
            "Deadlines that fired, by deadline: body (a held request's body did not end "
            "within the body timeout; 408, and what it held is freed)",
            ["deadline"],
            registry=self.registry,
        )
        self.share_refusals = Counter(
            "promptcache_gateway_policy_tenant_share_refusals",
            "Requests refused (429 tenant_share_exceeded) because their client identity held "
            "its share of the step's budget for request bodies",
            registry=self.registry,
        )
        self.decided = Counter(
            "promptcache_gateway_policy_decided",
            "Requests decided and forwarded to the picker",
            registry=self.registry,
        )

    def waited_for_share(self, seconds: float) -> None:
        self.fair_share_waits.inc()
        self.fair_share_wait_seconds.inc(seconds)

    def refused(self, error: FrontError) -> None:
        self.refusals.labels(code=error.code).inc()

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

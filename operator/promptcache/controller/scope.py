"""What one reconcile carries from phase to phase, and what it reports when it ends.

`Scope` is the renderable resource's reconcile: its plan and what each phase learned and
did; `Outcome` is what the handlers, metrics and tests see of a reconcile afterwards. The
phases live in `reconcile.py` (and the two that hold state of their own, in
`router_exit.py` and `pod_observer.py`); they share these types and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from promptcache.api import ResolvedDeployment
from promptcache.controller.observation import Observation, Problem
from promptcache.controller.plan import Plan
from promptcache.render import Names


@dataclass
class Outcome:
    """What one reconcile did: for handlers (events, retries), metrics and tests."""

    applied: list[str] = field(default_factory=list)
    status_written: bool = False
    transitions: list[dict[str, Any]] = field(default_factory=list)
    problem: Problem | None = None
    requeue_after_s: float | None = None
    """Reconcile again this soon (a router mapping on its way out), whatever the period."""

    def requeue(self, after_s: float) -> None:
        self.requeue_after_s = min(after_s, self.requeue_after_s or after_s)


@dataclass
class Scope:
    """One reconcile of a renderable resource: its plan, what the phases learned so far,
    and what they did. Each phase reads and fills it in turn."""

    raw: dict[str, Any]
    plan: Plan
    fresh: bool
    """Just created: its children cannot exist yet (their names derive from it and their
    owner is this very object), so they are applied without reading them first and nothing
    is pruned. Every other trigger reads first, so an unchanged resource costs no writes."""
    obs: Observation
    outcome: Outcome
    plan_key: str = ""
    """What the plan was rendered from (`plan.plan_key`)."""
    served: dict[str, bool] = field(default_factory=dict)
    """Optional kinds by name: whether discovery says the cluster serves them."""
    live: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    """The children as the API server holds them after apply, by `Kind/name`."""

    @property
    def uid(self) -> str:
        return str(self.raw["metadata"]["uid"])

    @property
    def pcd(self) -> ResolvedDeployment:
        return self.plan.pcd

    @property
    def names(self) -> Names:
        return self.plan.names


def label_of(manifest: Mapping[str, Any]) -> str:
    return f"{manifest['kind']}/{manifest['metadata']['name']}"


def degrade(obs: Observation, reason: str, message: str) -> None:
    """Keep the first problem of a reconcile: it is the one to fix first."""
    obs.degraded = obs.degraded or Problem(reason, message[:1000])

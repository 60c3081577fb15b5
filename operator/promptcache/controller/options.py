"""The operator's own settings and their defaults, written once.

`promptcache run` builds its flags from these, and the parts that take a setting
(handlers, reconciler, leader election) default to the same values. Imports nothing
heavy: the CLI reads it to build its parser.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from promptcache.api import BUILT_IN_DEFAULTS, OperatorDefaults
from promptcache.contract import SERVING_PORT
from promptcache.controller.window import WINDOW_S

DEFAULT_BIND_ADDRESS: Final[str] = "0.0.0.0"  # noqa: S104 - probes reach the pod IP
DEFAULT_HEALTH_PORT: Final[int] = 8080
DEFAULT_METRICS_PORT: Final[int] = 9090
DEFAULT_RESYNC_SECONDS: Final[float] = 60.0
DEFAULT_SCRAPE_PORT: Final[int] = SERVING_PORT
"""The model-server pods' metrics port: the cache front's (or vLLM's without one)."""
DEFAULT_SCRAPE_TIMEOUT_SECONDS: Final[float] = 2.0
DEFAULT_STATUS_WINDOW_SECONDS: Final[float] = WINDOW_S
"""The window of the status' recent hit ratio and hit-ratio ladder (`controller.window`)."""
DEFAULT_LEASE_NAMESPACE: Final[str] = "default"
DEFAULT_LEASE_NAME: Final[str] = "promptcache-operator"
DEFAULT_LEASE_SECONDS: Final[int] = 15
DEFAULT_MAX_CONCURRENT: Final[int] = 16
"""Reconciles in flight at once, all triggers together."""


@dataclass(frozen=True)
class OperatorOptions:
    """Everything `promptcache run` was told."""

    namespaces: tuple[str, ...] = ()
    all_namespaces: bool = False
    bind_address: str = DEFAULT_BIND_ADDRESS
    health_port: int = DEFAULT_HEALTH_PORT
    metrics_port: int = DEFAULT_METRICS_PORT
    resync_s: float = DEFAULT_RESYNC_SECONDS
    scrape_port: int = DEFAULT_SCRAPE_PORT
    scrape_timeout_s: float = DEFAULT_SCRAPE_TIMEOUT_SECONDS
    status_window_s: float = DEFAULT_STATUS_WINDOW_SECONDS
    events: bool = True
    leader_election: bool = True
    lease_namespace: str = DEFAULT_LEASE_NAMESPACE
    lease_name: str = DEFAULT_LEASE_NAME
    lease_s: int = DEFAULT_LEASE_SECONDS
    identity: str = DEFAULT_LEASE_NAME
    defaults: OperatorDefaults = field(default_factory=lambda: BUILT_IN_DEFAULTS)
    """Operator-wide defaults for what a resource leaves empty (`promptcache run` flags)."""


@dataclass(frozen=True)
class ReconcileSettings:
    """What the reconciler and the pod observer are told (from `OperatorOptions`); here,
    not in `reconcile`, so the observer needs no import of the reconciler that owns it."""

    scrape_port: int = DEFAULT_SCRAPE_PORT
    scrape_timeout_s: float = DEFAULT_SCRAPE_TIMEOUT_SECONDS
    defaults: OperatorDefaults = BUILT_IN_DEFAULTS
    """Operator-wide defaults for what a resource leaves empty (`promptcache run` flags)."""
    max_concurrent: int = DEFAULT_MAX_CONCURRENT
    status_window_s: float = WINDOW_S
    """The window of the status' recent hit ratio and ladder (`controller.window`)."""
    scrape_interval_s: float = 0.0
    """A resource's pods are scraped at most this often (the same ready pods): a burst of
    child events during a rollout must not become a burst of scrapes. `promptcache run`
    sets half the resync period."""

"""What one reconcile observed, and what a condition should say: the status's inputs.

Plain values, no I/O: the phases of a reconcile fill an `Observation`;
`conditions.py` turns it into `Desired` conditions and `status.py` into `.status`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from promptcache.api import PromptEmbedsCeiling
from promptcache.api.status import AdapterStatus, CacheLadderStatus, PrefixCacheStatus

if TYPE_CHECKING:
    from promptcache.controller.diagnose import Diagnosis

Status = Literal["True", "False", "Unknown"]


@dataclass(frozen=True)
class Desired:
    """What one condition should say now."""

    type: str
    status: Status
    reason: str
    message: str = ""


@dataclass(frozen=True)
class Problem:
    """Why the resource is degraded: a condition reason and a message a user can act on."""

    reason: str
    message: str


@dataclass
class Observation:
    """Everything one reconcile learned, as inputs to the status."""

    generation: int | None
    desired_replicas: int = 0
    blocked: Problem | None = None
    """The resource cannot be rendered at all (invalid spec, name too long)."""
    degraded: Problem | None = None
    """Rendered and applied, but something the user must fix stands in the way."""
    model_server: Mapping[str, Any] | None = None
    endpoint_picker: Mapping[str, Any] | None = None
    gateway: Desired | None = None
    selector: str = ""
    ceiling: PromptEmbedsCeiling | None = None
    prefix_cache: PrefixCacheStatus = field(default_factory=PrefixCacheStatus)
    pods: Diagnosis | None = None
    """Why model-server pods are not ready, from the pods (None: all ready, or none yet)."""
    gateway_addresses: list[str] = field(default_factory=list)
    monitoring: Desired | None = None
    """MonitoringReady while monitoring is enabled; None removes the condition."""
    adapters: list[AdapterStatus] = field(default_factory=list)
    """Per `model.adapters[]`: where it is served and why not (empty without adapters)."""
    cache: CacheLadderStatus | None = None
    """The hit-ratio ladder (`controller.ladder`); None: no verdict yet."""
    cache_delivering: Desired | None = None
    """CacheDelivering while there is a ladder; None removes the condition."""

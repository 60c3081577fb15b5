"""The hit-ratio ladder (issue 39): from the fronts' counters over the recent window to four
rungs, the largest loss between them, one sentence saying what to change, and a condition.

    workload  = workload / estimated     what a perfect, infinite cache could serve
    capacity  = capacity / estimated     what the pool's real KV size could hold
    routing   = predicted / accounted    what the picker expected the chosen pod to hold
    delivered = delivered / accounted    what the engines served from cache

Each step down below the workload is a loss a change could win back (`Loss`): capacity
(the working set does not fit), routing (requests not sent where their prefix is: spread
over replicas, sessions off), delivery (the index believes more than the pods hold:
autoTune / `lruCapacityPerServer`). The largest is named when it is worth naming
(`NAMED_LOSS`); when none is and most prompts repeat nothing (`LOW_WORKLOAD`), the
workload is named: nothing to gain. Below `MIN_PROMPT_TOKENS` in the window there is no
verdict at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from promptcache.api.status import CacheLadderStatus, ConditionType, Reason
from promptcache.contract import LadderCounter
from promptcache.controller.observation import Desired
from promptcache.controller.scrape import LADDER

MIN_PROMPT_TOKENS: Final[float] = 1000.0
"""Fewer accounted prompt tokens in the window than this: too few to judge."""
NAMED_LOSS: Final[float] = 0.1
"""A step down of at least this share of the prompt tokens is named; below, the ladder is
flat enough that nothing is."""
LOW_WORKLOAD: Final[float] = 0.5
"""Below this workload rung, with no step worth naming, the workload itself is named."""
DELIVERED_SHARE: Final[float] = 0.5
"""CacheDelivering is False when delivered is below this share of routing ..."""
DELIVERY_GAP: Final[float] = 0.1
"""... and the gap is at least this share of the prompt tokens."""


class Loss(StrEnum):
    NONE = "None"
    WORKLOAD = "Workload"
    CAPACITY = "Capacity"
    ROUTING = "Routing"
    DELIVERY = "Delivery"


_ADVICE: Final[dict[Loss, str]] = {
    Loss.WORKLOAD: "the requests share little prefix within their isolation scopes, so "
    "there is little for any cache to gain (a finer isolation mode splits what could be "
    "shared)",
    Loss.CAPACITY: "the pods' KV cache is too small for the working set: add replicas or "
    "GPU memory (engine.gpuMemoryUtilization), or shorten what must be cached",
    Loss.ROUTING: "requests do not reach the pod that holds their prefix: for a chat "
    "workload turn on sessionAffinity, or raise prefixCache weights against load",
    Loss.DELIVERY: "the picker's index believes more than the pods hold: turn on "
    "prefixCache.autoTune or lower prefixCache.lruCapacityPerServer to the pods' KV size",
}


@dataclass(frozen=True)
class Rungs:
    workload: float | None
    capacity: float | None
    routing: float
    delivered: float
    prompt_tokens: float
    span_s: float

    def losses(self) -> dict[Loss, float]:
        """Each step down below the workload, as a share of the prompt tokens (never
        negative): what a change to the deployment could win back."""
        out = {Loss.DELIVERY: max(0.0, self.routing - self.delivered)}
        if self.workload is not None and self.capacity is not None:
            out[Loss.CAPACITY] = max(0.0, self.workload - self.capacity)
            out[Loss.ROUTING] = max(0.0, self.capacity - self.routing)
        return out

    def largest(self) -> tuple[Loss, float]:
        """The step to name and its size: the largest that a change could win back, when it
        is worth naming; else the workload's own, when most prompts repeat nothing (there
        is nothing to gain); else none."""
        loss, size = max(self.losses().items(), key=lambda kv: kv[1])
        if size >= NAMED_LOSS:
            return loss, size
        if self.workload is not None and self.workload < LOW_WORKLOAD:
            return Loss.WORKLOAD, 1.0 - self.workload
        return Loss.NONE, size


def _share(part: float, whole: float) -> float:
    return min(1.0, max(0.0, part / whole))


def rungs(increases: Sequence[float], span_s: float) -> Rungs | None:
    """The rungs from the window's counter increases (`scrape.LADDER` order); None with too
    few prompt tokens to judge."""
    c = dict(zip(LADDER, increases, strict=True))
    accounted = c[LadderCounter.ACCOUNTED]
    if accounted < MIN_PROMPT_TOKENS:
        return None
    estimated = c[LadderCounter.ESTIMATED]
    known = estimated >= MIN_PROMPT_TOKENS
    return Rungs(
        workload=_share(c[LadderCounter.WORKLOAD], estimated) if known else None,
        capacity=_share(c[LadderCounter.CAPACITY], estimated) if known else None,
        routing=_share(c[LadderCounter.PREDICTED], accounted),
        delivered=_share(c[LadderCounter.DELIVERED], accounted),
        prompt_tokens=accounted,
        span_s=span_s,
    )


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{round(100 * x)}%"


def _span(seconds: float) -> str:
    """The span the window really covered: in seconds below two minutes (a window that
    covered 20 s is not "the last 1 min"), else in minutes."""
    if seconds < 120:
        return f"{max(1, round(seconds))} s"
    return f"{round(seconds / 60)} min"


def sentence(r: Rungs) -> str:
    """What `kubectl describe` shows: the rungs, then the largest loss and what to change."""
    head = (
        f"Of the prompt tokens of the last {_span(r.span_s)}, a perfect cache could have served "
        f"{_pct(r.workload)}, the pods' KV size {_pct(r.capacity)}, the picker predicted "
        f"{_pct(r.routing)} and the engines served {_pct(r.delivered)} from cache"
    )
    loss, size = r.largest()
    if loss is Loss.NONE:
        return f"{head}; no step loses more than {round(100 * NAMED_LOSS)} points."
    points = round(100 * size)
    return f"{head}; the largest loss is {loss.value.lower()} ({points} points): {_ADVICE[loss]}."


def status(r: Rungs) -> CacheLadderStatus:
    def rounded(x: float | None) -> float | None:
        return None if x is None else round(x, 4)

    return CacheLadderStatus(
        workload=rounded(r.workload),
        capacity=rounded(r.capacity),
        routing=rounded(r.routing),
        delivered=rounded(r.delivered),
        prompt_tokens=round(r.prompt_tokens),
        window_seconds=round(r.span_s),
        largest_loss=r.largest()[0].value,
        message=sentence(r),
    )


def delivering(r: Rungs) -> Desired:
    """CacheDelivering: False while the engines serve far less from cache than the picker
    predicted (the index and the pods disagree: the delivery loss)."""
    gap = r.routing - r.delivered
    if r.delivered < DELIVERED_SHARE * r.routing and gap >= DELIVERY_GAP:
        return Desired(
            ConditionType.CACHE_DELIVERING,
            "False",
            Reason.DELIVERED_BELOW_PREDICTED,
            f"the picker predicted {_pct(r.routing)} of the prompt tokens cached on the "
            f"chosen pods, the engines served {_pct(r.delivered)}: {_ADVICE[Loss.DELIVERY]}",
        )
    return Desired(
        ConditionType.CACHE_DELIVERING,
        "True",
        Reason.AS_PREDICTED,
        f"predicted {_pct(r.routing)}, delivered {_pct(r.delivered)}",
    )

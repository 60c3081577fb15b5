"""The prefix-cache hit ratio over a recent window, from counter deltas between scrapes.

`vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total` since each pod
started says little about now: a day of warm traffic hides a collapse of the last
minutes. Each reconcile scrapes the ready pods; this keeps their counters per pod
for `WINDOW_S` and reports

    sum over pods of increase(hits) / sum over pods of increase(queries)

between each pod's oldest scrape still inside the window and its newest, the same
thing `increase()` over the window computes in Prometheus. A counter that went down
(the pod restarted) counts from zero, as `increase()` does; a pod first seen in the
newest scrape (new, or its earlier scrapes failed) contributes nothing yet, since what
it counted before cannot be placed in time. No queries in the window: no ratio (None),
rather than a stale one. The span really covered is reported with it:
scrapes happen at every resync (60 s by default), so the first minutes after the
operator starts cover less than the full window.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

WINDOW_S: Final[float] = 300.0
"""The window the status' `recentHitRatio` and ladder cover: five minutes, like a dashboard's
rate() (`promptcache run --status-window-seconds` sets another)."""


@dataclass(frozen=True)
class Snapshot:
    at: float
    counters: Mapping[str, tuple[float, ...]]
    """Pod key -> its counters: (hits, queries) for the hit ratio; the ladder's six for
    `controller.ladder`."""


@dataclass(frozen=True)
class WindowedRatio:
    ratio: float | None
    span_s: float
    queries: float


def _increase(new: float, old: float) -> float:
    if new < old:
        return new  # a counter reset (restart): everything since it started
    return new - old


@dataclass
class HitWindow:
    """Scrapes of one resource's pods inside the window (oldest first)."""

    window_s: float = WINDOW_S
    _snapshots: deque[Snapshot] = field(default_factory=deque)

    def add(self, at: float, counters: Mapping[str, tuple[float, ...]]) -> WindowedRatio:
        """Record a scrape taken at `at` (monotonic seconds) and return the windowed ratio."""
        self.record(at, counters)
        return self.ratio()

    def record(self, at: float, counters: Mapping[str, tuple[float, ...]]) -> None:
        """Record a scrape taken at `at` (monotonic seconds)."""
        self._snapshots.append(Snapshot(at, dict(counters)))
        # Keep the newest snapshot at or before the window's start as the baseline.
        while len(self._snapshots) > 1 and self._snapshots[1].at <= at - self.window_s:
            self._snapshots.popleft()

    def increases(self, width: int) -> tuple[list[float], float]:
        """Each of the first `width` counters' increase over the window, summed over pods,
        and the span covered (zeros and 0.0 before two scrapes)."""
        sums = [0.0] * width
        if len(self._snapshots) < 2:
            return sums, 0.0
        old, new = self._snapshots[0], self._snapshots[-1]
        for pod, values in new.counters.items():
            # The pod's own oldest scrape in the window is its baseline.
            # (A pod first seen in the newest scrape is its own baseline: it adds nothing yet.)
            before = next(s.counters[pod] for s in self._snapshots if pod in s.counters)
            for i in range(width):
                sums[i] += _increase(values[i], before[i])
        return sums, new.at - old.at

    def ratio(self) -> WindowedRatio:
        if len(self._snapshots) < 2:
            return WindowedRatio(None, 0.0, 0.0)
        (hits, queries), span = self.increases(2)
        if queries <= 0:
            return WindowedRatio(None, span, 0.0)
        return WindowedRatio(round(min(1.0, max(0.0, hits / queries)), 4), span, queries)

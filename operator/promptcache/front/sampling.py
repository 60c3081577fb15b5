"""Which of the picker's predictions the front checks and counts: all of them at a modest
rate, a weighted random sample above it (issue 39's budget of 2 % of a request's CPU).

Checking a signed prediction (`tenancy.prediction`: its pattern, its MAC, the replay guard)
and counting it costs the front about 20-30 µs of a request's 300-400 µs wherever it is
optimised, because a request's other work evicts the check's code and data from the CPU's
caches between two checks (bench/ladder_overhead.py, docs/monitoring.md). The ladder needs
ratios of token counts, not every request: so each process checks at most
`CHECKS_PER_SECOND` predictions a second: each request carrying one is drawn with
probability p = CHECKS_PER_SECOND / r, where r is the rate of such requests (a moving
estimate with a one-second time constant, updated on every request, so a burst after a
quiet spell is sampled after its first twenty or so), and a drawn one is counted with
weight 1/p. Since p is fixed before the draw, the weighted counts are unbiased estimates of
the totals (Horvitz-Thompson) however the rate moves; at the rates of a small pool, and in
tests, p is 1 and every prediction is checked and counted exactly as before.

What a sample changes, and what it does not: no unchecked prediction is ever believed (a
request not drawn carries no prediction into the counts, and the header is removed before
vLLM either way), so a client still cannot skew the figures with a forged one; the
verdict counts (`promptcache_front_predictions_total`) are weighted estimates too. A replayed
header is caught when its first use was drawn as well; one whose first use was not drawn
counts once, as a genuine prediction for another request: at worst one more sample, never
an isolation matter. The choice is the front's own random draw, so a client cannot pick
which of its requests are checked.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from typing import Final

CHECKS_PER_SECOND: Final[float] = 20.0
"""Predictions one front process checks a second at most, about: at ~25 µs each, 0.05 % of
a core, and 6,000 samples in the operator's five-minute window, a standard error of about
half a point on any of the ladder's shares. Per request, the check then costs a share of
the front's CPU that falls with the rate: at 400 predicted requests a second about 2 µs
of a request's ~300 (bench/ladder_overhead.py); below 20 a second every one is checked,
whatever it costs a front that is nearly idle."""
RATE_TIME_CONSTANT_S: Final[float] = 1.0
"""How fast the rate estimate follows the traffic."""


class PredictionSampler:
    """Draws, per request that carries a prediction, whether to check it and its weight."""

    __slots__ = ("_clock", "_draw", "_last", "_per_second", "_rate", "_tau")

    def __init__(
        self,
        per_second: float = CHECKS_PER_SECOND,
        clock: Callable[[], float] = time.monotonic,
        draw: Callable[[], float] = random.random,
        time_constant_s: float = RATE_TIME_CONSTANT_S,
    ) -> None:
        self._per_second, self._tau = per_second, time_constant_s
        self._clock, self._draw = clock, draw
        self._last = clock()
        self._rate = 0.0

    def weight(self) -> float:
        """0.0: leave this one unchecked; else check it and count it this many times."""
        now = self._clock()
        elapsed, self._last = max(0.0, now - self._last), now
        # Events a second, decaying with the time constant: n events in an instant add n/tau.
        self._rate = self._rate * math.exp(-elapsed / self._tau) + 1.0 / self._tau
        if self._rate <= self._per_second:
            return 1.0
        chance = self._per_second / self._rate
        return 1.0 / chance if self._draw() < chance else 0.0

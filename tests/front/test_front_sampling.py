"""`front.sampling`: the front checks every prediction at a modest rate and a weighted random
sample above it, so the ladder's counters stay unbiased estimates at a bounded cost."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.clock import Clock
from promptcache.front.sampling import PredictionSampler


def _run(sampler: PredictionSampler, clock: Clock, per_second: list[int]) -> list[list[float]]:
    """The weights drawn, second by second, for that many requests evenly spread over each
    second (an idle second for 0)."""
    out = []
    for n in per_second:
        second = []
        for _ in range(n):
            clock.now += 1.0 / n
            second.append(sampler.weight())
        clock.now += 0.0 if n else 1.0
        out.append(second)
    return out


def test_at_or_below_the_rate_every_prediction_is_checked_once() -> None:
    clock = Clock()
    sampler = PredictionSampler(per_second=100, clock=clock, draw=random.Random(1).random)
    seconds = _run(sampler, clock, [90, 90, 37, 0, 90, 1])
    assert all(w == 1.0 for second in seconds for w in second)


def test_above_the_rate_a_weighted_sample_stands_for_every_request() -> None:
    clock = Clock()
    sampler = PredictionSampler(per_second=100, clock=clock, draw=random.Random(7).random)
    seconds = _run(sampler, clock, [1000] * 20)
    assert all(w == 1.0 for w in seconds[0][:90]), "a burst's first ones are all checked"
    for second in seconds[6:]:  # the estimate has settled (1 - e^-6 of the rate): 1000 a second
        drawn = [w for w in second if w]
        assert all(w == pytest.approx(10.0, rel=0.01) for w in drawn)
        assert 60 <= len(drawn) <= 140, len(drawn)  # about the rate
    total = sum(w for second in seconds for w in second)
    assert abs(total - 20_000) < 0.05 * 20_000, total  # the weights sum to the requests


def test_a_burst_after_a_quiet_spell_is_checked_whole_at_first() -> None:
    clock = Clock()
    sampler = PredictionSampler(per_second=100, clock=clock, draw=random.Random(3).random)
    _run(sampler, clock, [1000, 1000])
    clock.now += 5.0  # nothing for five seconds: the estimate has decayed
    burst = []
    for _ in range(50):
        clock.now += 0.001
        burst.append(sampler.weight())
    assert burst == [1.0] * 50


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=400), min_size=1, max_size=12),
    st.floats(min_value=0.0, max_value=0.999),
)
def test_a_weight_is_a_skip_or_at_least_one(rates: list[int], draw: float) -> None:
    clock = Clock()
    sampler = PredictionSampler(per_second=50, clock=clock, draw=lambda: draw)
    for second in _run(sampler, clock, rates):
        assert all(w == 0.0 or w >= 1.0 for w in second)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=45), min_size=1, max_size=12))
def test_below_the_rate_nothing_is_skipped(rates: list[int]) -> None:
    clock = Clock()
    sampler = PredictionSampler(per_second=50, clock=clock, draw=lambda: 0.999)
    assert all(w == 1.0 for second in _run(sampler, clock, rates) for w in second)

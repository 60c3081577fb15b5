"""The per-key meter of decoding work (`tenancy.fair_share`), on a clock the test moves.

The meter is shared by the front and the gateway's policy step; both are tested over real
sockets in `tests/front/test_front_fair_share.py` and `tests/gateway/test_policy_fair_share.py`.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.waiting import eventually
from promptcache.tenancy import errors
from promptcache.tenancy.fair_share import (
    ACTIVE_SECONDS,
    MAX_DEBT_SECONDS,
    MAX_KEYS,
    MAX_WAITERS,
    FairShare,
    Refusal,
    share_exceeded,
)

RATE = 1000.0
A, B = FairShare.key_of("tenant-a"), FairShare.key_of("tenant-b")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def meter() -> tuple[FairShare, Clock]:
    clock = Clock()
    return FairShare(RATE, clock=clock), clock


def test_a_key_alone_is_never_held_back() -> None:
    share, clock = meter()
    for _ in range(50):
        share.seen(A)
        share.charge(A, 1_000_000)
        assert share.owed_seconds(A) == 0
        clock.now += 0.01


def test_a_key_over_its_share_waits_while_another_is_active() -> None:
    share, clock = meter()
    share.seen(B)
    share.seen(A)
    share.charge(A, 3000)  # 1 s of burst, then 2 s of debt
    assert share.owed_seconds(A) == pytest.approx(2.0)
    assert share.owed_seconds(B) == 0  # B owes nothing: never held back
    clock.now += 0.5
    share.seen(B)
    assert share.owed_seconds(A) == pytest.approx(1.5)


def test_the_wait_ends_when_the_others_go_quiet() -> None:
    share, clock = meter()
    share.seen(B)
    share.seen(A)
    share.charge(A, 5000)
    assert share.owed_seconds(A) > 0
    clock.now += ACTIVE_SECONDS + 0.01
    share.seen(A)
    assert share.owed_seconds(A) == 0


def test_debt_is_capped_so_no_wait_is_longer_than_the_cap() -> None:
    share, _ = meter()
    share.seen(B)
    share.seen(A)
    share.charge(A, 10**12)
    assert share.owed_seconds(A) == pytest.approx(MAX_DEBT_SECONDS)


def test_keys_are_hashed_and_their_number_is_bounded() -> None:
    share, clock = meter()
    assert FairShare.key_of("", "Bearer x") == FairShare.key_of("Bearer x")
    assert FairShare.key_of("a", "Bearer x") == FairShare.key_of("a")
    assert FairShare.key_of("", "") == FairShare.key_of()
    assert len(FairShare.key_of("x" * 10_000)) == 16
    for i in range(MAX_KEYS + 100):
        key = FairShare.key_of(f"k{i}")
        share.seen(key)
        share.charge(key, 10)
        clock.now += 1e-6
    assert share.remembered() == MAX_KEYS


def test_off_when_the_rate_is_zero() -> None:
    assert not FairShare(0).enabled
    assert FairShare(1).enabled


async def test_waiters_past_the_cap_are_refused_with_429() -> None:
    share = FairShare(RATE)
    share.seen(B)
    share.seen(A)
    share.charge(A, 2000)  # owes about 1 s

    async def keep_b_active() -> None:
        for _ in range(40):
            share.seen(B)
            await asyncio.sleep(0.05)

    active = asyncio.create_task(keep_b_active())
    waiting = [asyncio.create_task(share.admit(A)) for _ in range(MAX_WAITERS)]
    await eventually(
        lambda: share.waiting(A), f"{MAX_WAITERS} of A's requests waiting", within_s=10,
        until=lambda n: n == MAX_WAITERS,
    )  # fmt: skip
    refused = await share.admit(A)
    assert isinstance(refused, Refusal)
    error = share_exceeded(refused)
    assert (error.status, error.code) == (429, errors.FAIR_SHARE_EXCEEDED)
    assert int(error.headers["Retry-After"]) >= 1
    assert await share.admit(B) is None  # B owes nothing: not held back
    started = asyncio.get_running_loop().time()
    assert await asyncio.gather(*waiting) == [None] * MAX_WAITERS
    assert asyncio.get_running_loop().time() - started > 0.5
    active.cancel()
    assert share._waiting == {}


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.integers(0, 50_000),
            st.floats(0, 3, allow_nan=False),
        ),
        max_size=60,
    )
)
def test_invariants_over_any_sequence(steps: list[tuple[str, int, float]]) -> None:
    """Whatever keys send, costs and pauses: no key owes more than the cap, and none owes
    anything while alone."""
    share, clock = meter()
    for name, cost, pause in steps:
        key = FairShare.key_of(name)
        clock.now += pause
        share.seen(key)
        owed = share.owed_seconds(key)
        assert 0 <= owed <= MAX_DEBT_SECONDS + 1e-9
        if not share.contended(key):
            assert owed == 0
        if owed == 0:
            share.charge(key, cost)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, int(RATE * MAX_DEBT_SECONDS)), st.floats(0, 0.9)),
        min_size=1,
        max_size=80,
    )
)
def test_a_contended_key_gets_no_more_than_its_share(steps: list[tuple[int, float]]) -> None:
    """With another key always active, what a key is let through over a stretch is at most
    its burst, its rate times the stretch, and the one charge that put it in debt."""
    share, clock = meter()
    started, admitted = clock.now, 0
    for cost, pause in steps:
        clock.now += pause
        share.seen(B)
        share.seen(A)
        if share.owed_seconds(A) == 0:
            share.charge(A, cost)
            admitted += cost
    bound = share.capacity + RATE * (clock.now - started) + max(c for c, _ in steps)
    assert admitted <= bound + 1e-6

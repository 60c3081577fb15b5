"""The per-identity ledger both processes admit by (`tenancy.shares`): its two rules, and
the identity a request counts under."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from promptcache.tenancy import errors
from promptcache.tenancy.shares import (
    Ledger,
    Verdict,
    identity_key,
    share_of,
    share_refusal,
)

A, B, C = b"a", b"b", b"c"


def test_an_identity_alone_takes_all_but_the_reserve() -> None:
    """The share is no cap on a pod nobody else uses: one identity (all traffic behind a
    gateway with no keys) takes 240 of 256 slots, the reserve staying free for a newcomer."""
    slots = Ledger(256, share_of(256, 50))
    assert (slots.share, slots.reserve) == (128, 16)
    taken = sum(slots.take(A, 1) is Verdict.TAKE for _ in range(300))
    assert taken == 256 - 16
    assert slots.check(A, 1) is Verdict.OVER_SHARE  # into the reserve: its own refusal (429)
    assert slots.take(B, 1) is Verdict.TAKE  # a newcomer finds the reserve


def test_once_another_holds_the_share_binds() -> None:
    """Beside another holder an identity takes up to its share, no more; one that took more
    while alone is refused until it is back under its share, then takes up to it again."""
    slots = Ledger(256, share_of(256, 50))
    slots.take(B, 1)
    assert sum(slots.take(A, 1) is Verdict.TAKE for _ in range(300)) == 128
    assert slots.check(A, 1) is Verdict.OVER_SHARE
    slots.give(B, 1)  # alone again: the share no longer binds
    assert slots.check(A, 1) is Verdict.TAKE
    slots.hold(A, 100)  # took 228 while alone
    slots.take(B, 1)
    slots.give(A, 99)  # back to 129: still over its share of 128
    assert slots.check(A, 1) is Verdict.OVER_SHARE
    slots.give(A, 1)
    assert slots.check(A, 1) is Verdict.OVER_SHARE  # 128: at its share, not under it
    slots.give(A, 1)
    assert slots.take(A, 1) is Verdict.TAKE  # 127 + 1: within its share
    assert slots.check(A, 1) is Verdict.OVER_SHARE


def test_a_first_slot_goes_before_a_hundredth() -> None:
    """Of 256 slots a sixteenth (16) is kept for identities holding little: one holding 100
    takes more only while 16 stay free after it, one holding 3 while 3 do, one holding none
    takes the very last."""
    slots = Ledger(256, 200)
    assert slots.reserve == 16
    slots.hold(A, 100)
    slots.hold(B, 139)  # 17 free
    assert slots.check(A, 1) is Verdict.TAKE  # 16 stay free
    slots.hold(B, 1)  # 16 free
    assert slots.check(A, 1) is Verdict.OVER_SHARE  # 15 would: the reserve is others'
    assert slots.check(C, 1) is Verdict.TAKE
    slots.hold(C, 3)  # 13 free
    assert slots.check(C, 1) is Verdict.TAKE  # holds 3: 12 >= 3 stay free
    slots.hold(b"d", 12)  # 1 free
    assert slots.check(C, 1) is Verdict.OVER_SHARE
    assert slots.check(b"new", 1) is Verdict.TAKE
    slots.hold(b"new", 1)
    assert slots.check(b"newer", 1) is Verdict.EXHAUSTED  # holds nothing, none free: 503


def test_busy_tenants_can_use_all_but_the_reserve() -> None:
    """Four tenants each pressing for all they can get use 240 of 256 slots together (the
    reserve is what stays free), not 4/5 of them."""
    slots = Ledger(256, 128)
    keys = [b"t0", b"t1", b"t2", b"t3"]
    while [slots.take(key, 1) for key in keys].count(Verdict.TAKE):  # each asks in turn
        pass
    assert slots.used == 256 - slots.reserve
    assert [slots.held(key) for key in keys] == [60] * 4
    assert slots.check(b"newcomer", 1) is Verdict.TAKE


def test_an_amount_over_the_share_can_never_be_taken() -> None:
    """Not even to an identity that is alone: whether one request fits does not depend on
    who else happens to be using the process."""
    memory = Ledger(1000, share_of(1000, 25))
    assert memory.check(A, 251) is Verdict.NEVER
    assert memory.check(A, 250) is Verdict.TAKE


def test_a_share_of_everything_turns_the_rules_off() -> None:
    reads = Ledger(4, share_of(4, 100))
    assert not reads.enforced
    assert [reads.take(A, 1) for _ in range(5)] == [Verdict.TAKE] * 4 + [Verdict.EXHAUSTED]


def test_giving_back_forgets_an_identity_that_holds_nothing() -> None:
    memory = Ledger(100, 50)
    memory.take(A, 30)
    memory.give(A, 10)
    assert (memory.held(A), memory.used, memory.holders()) == (20, 20, 1)
    memory.give(A, 1000)  # never more than it holds
    assert (memory.held(A), memory.used, memory.holders()) == (0, 0, 0)


KEYS = [A, B, C]
Step = tuple[bytes, int, bool]
STEPS = st.lists(
    st.tuples(st.sampled_from(KEYS), st.integers(1, 40), st.booleans()), max_size=80
)  # (who, how many, give back instead of take)


def _play(memory: Ledger, steps: list[Step]) -> None:
    for key, n, give in steps:
        if give:
            memory.give(key, n)
        else:
            memory.take(key, n)


@given(STEPS)
def test_no_sequence_takes_more_than_the_capacity(steps: list[Step]) -> None:
    memory = Ledger(100, 50)
    for key, n, give in steps:
        _play(memory, [(key, n, give)])
        assert 0 <= memory.used <= memory.capacity
        assert memory.used == sum(memory.snapshot().values())


@given(STEPS, st.sampled_from(KEYS), st.integers(1, 40))
def test_with_another_holder_nobody_takes_above_its_share(
    steps: list[Step], key: bytes, n: int
) -> None:
    memory = Ledger(100, 50)
    _play(memory, steps)
    before = memory.held(key)
    if memory.others_hold(key) and memory.take(key, n) is Verdict.TAKE:
        assert memory.held(key) == before + n <= memory.share


@given(STEPS, st.sampled_from(KEYS), st.integers(1, 40))
def test_a_take_by_a_heavy_holder_leaves_the_reserve_free(
    steps: list[Step], key: bytes, n: int
) -> None:
    memory = Ledger(100, 50)
    _play(memory, steps)
    before = memory.held(key)
    if memory.take(key, n) is Verdict.TAKE:
        assert memory.capacity - memory.used >= min(before, memory.reserve)


@given(STEPS, st.integers(1, 40))
def test_a_newcomer_is_never_refused_while_its_request_fits(steps: list[Step], n: int) -> None:
    """Whatever the others did, one holding nothing takes what fits in what is free (within
    a share): in particular one unit whenever any is free, and the reserve whenever it is."""
    memory = Ledger(100, 50)
    _play(memory, steps)
    verdict = memory.check(b"newcomer", n)
    if n <= min(memory.share, memory.capacity - memory.used):
        assert verdict is Verdict.TAKE
    else:
        assert verdict in (Verdict.EXHAUSTED, Verdict.NEVER)


def test_the_identity_is_the_first_source_present_each_in_its_namespace() -> None:
    def key(account: str | None = None, iso: str = "", cred: str = "", src: str = "") -> bytes:
        return identity_key(account=account, isolation_key=iso, credential=cred, source=src)

    assert key("acme", "k1", "Bearer t", "10.0.0.1") == key("acme", "k2", "", "10.0.0.2")
    assert key(None, "k1", "Bearer t", "10.0.0.1") == key(None, "k1", "", "")
    assert key(None, "", "Bearer t", "10.0.0.1") == key(None, "", "Bearer t", "10.0.0.2")
    assert key(src="10.0.0.1") != key(src="10.0.0.2")
    assert key("x") != key(iso="x") != key(cred="x") != key(src="x")
    assert key() == key(None, "", "", "")
    assert len(key(iso="k" * 10_000)) == 16  # fixed size, the text is never kept


def test_the_refusal_is_a_429_in_the_contract_shape_with_retry_after() -> None:
    error = share_refusal("concurrency slots", 3, 3)
    assert (error.status, error.code) == (429, errors.TENANT_SHARE_EXCEEDED)
    assert error.body()["error"]["type"] == "rate_limit_error"
    assert int(error.headers["Retry-After"]) >= 1

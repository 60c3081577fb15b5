"""The signed account between the policy step and the cache front: properties and failures.

The step signs, the front verifies (`tenancy.attestation`); these hold the derivation and
the verification to their promises: a signature verifies for the request it was made for
and for no other (another body, another key header, another account, another secret),
once, while fresh; the body digest ignores what the picker's re-encoding changes and
nothing else. (Go's real re-encoding is checked in tests/gateway/test_picker_reads.py.)
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from promptcache.contract import (
    IDENTITY_ATTESTATION_HEADER,
    IDENTITY_ATTESTATION_MAX_AGE_SECONDS,
    IDENTITY_CLOCK_SKEW_SECONDS,
)
from promptcache.tenancy.attestation import (
    Attester,
    Outcome,
    ReplayGuard,
    Verdict,
    attestation_key,
    body_digest,
    sign,
    verify,
)
from promptcache.tenancy.identity import Account, account_digest
from promptcache.tenancy.salt import (
    ACCOUNT_SALT_PREFIX,
    derive_account_salt,
    derive_salt,
    is_valid_vllm_salt,
)

SECRET = b"s" * 32
KEY = attestation_key(SECRET)
ALICE = Account(account_digest(SECRET, "header", "alice"))
BOB = Account(account_digest(SECRET, "header", "bob"))
NOW = 1_800_000_000

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)
bodies = st.dictionaries(st.text(max_size=8), json_values, max_size=6).map(
    lambda d: {**d, "model": "m", "messages": [{"role": "user", "content": "hi"}]}
)


def _go_like(value: Any) -> Any:
    """What a Go round trip through float64 leaves of `value` (numbers only)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, dict):
        return {k: _go_like(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_go_like(v) for v in value]
    number = float(value)
    return int(number) if number.is_integer() and abs(number) < 1e21 else number


def _fresh() -> ReplayGuard:
    return ReplayGuard()


def _verify(value: str, body: dict[str, Any], *, keys: tuple[str, ...] = (), now: int = NOW,
            guard: ReplayGuard | None = None, key: bytes = KEY) -> Outcome:  # fmt: skip
    verdict = verify(
        key, [value], key_values=keys, digest=body_digest(body), now=now,
        guard=guard or _fresh(),
    )  # fmt: skip
    assert (verdict.account is not None) == (verdict.outcome is Outcome.VALID)
    return verdict.outcome


@settings(max_examples=200, deadline=None)
@given(body=bodies, keys=st.lists(st.text(max_size=8), max_size=3))
def test_a_signature_verifies_for_its_own_request_once(
    body: dict[str, Any], keys: list[str]
) -> None:
    value = sign(KEY, ALICE, key_values=keys, digest=body_digest(body), now=NOW)
    guard = _fresh()
    verdict = verify(
        KEY, [value], key_values=list(reversed(keys)), digest=body_digest(body), now=NOW + 1,
        guard=guard,
    )  # fmt: skip
    assert verdict.outcome is Outcome.VALID
    assert verdict.account == ALICE
    assert _verify(value, body, keys=tuple(keys), guard=guard) is Outcome.REPLAYED


@settings(max_examples=200, deadline=None)
@given(body=bodies, other=json_values, name=st.text(max_size=8))
def test_a_signature_binds_the_whole_body_but_model(
    body: dict[str, Any], other: Any, name: str
) -> None:
    value = sign(KEY, ALICE, key_values=[], digest=body_digest(body), now=NOW)
    changed = {**body, name: other}
    same = body_digest(changed) == body_digest(body)
    outcome = _verify(value, changed)
    assert outcome is (Outcome.VALID if same else Outcome.FORGED)
    if name == "model":
        assert outcome is Outcome.VALID  # the picker may rewrite the model
    elif name not in body:
        assert outcome is Outcome.FORGED


@settings(max_examples=300, deadline=None)
@given(body=bodies)
def test_the_digest_survives_a_float64_round_trip_and_key_order(body: dict[str, Any]) -> None:
    reordered = json.loads(json.dumps(_go_like(body), sort_keys=True))
    assert body_digest(reordered) == body_digest(body)


def test_the_digest_tells_numbers_strings_and_nesting_apart() -> None:
    base = {"messages": "x"}
    variants = [{**base, "a": 1}, {**base, "a": "1"}, {**base, "a": [1]}, {**base, "a": True},
                {**base, "a": None}, {**base, "a": 2**80}, {**base, "a": 2**80 + 1}]  # fmt: skip
    digests = [body_digest(v) for v in variants]
    assert body_digest({**base, "a": 1.0}) == digests[0]  # Go reads both as float64 1
    assert body_digest({**base, "a": -0.0}) == body_digest({**base, "a": 0})
    # 2**80 and 2**80+1 are one float64: Go cannot tell them apart either
    assert len(set(digests)) == len(digests) - 1
    assert math.isclose(float(2**80), float(2**80 + 1))


@given(keys=st.lists(st.text(max_size=8), max_size=3), other=st.text(max_size=8))
def test_a_signature_binds_the_isolation_key_header(keys: list[str], other: str) -> None:
    body = {"messages": "x"}
    value = sign(KEY, ALICE, key_values=keys, digest=body_digest(body), now=NOW)
    outcome = _verify(value, body, keys=(*keys, other))
    assert outcome is (Outcome.VALID if other in keys else Outcome.FORGED)


def test_a_signature_binds_the_account_and_the_secret() -> None:
    body = {"messages": "x"}
    value = sign(KEY, ALICE, key_values=[], digest=body_digest(body), now=NOW)
    version, ts, nonce, _account, mac = value.split(".")
    as_bob = ".".join([version, ts, nonce, BOB.text, mac])
    assert _verify(as_bob, body) is Outcome.FORGED
    assert _verify(value, body, key=attestation_key(b"t" * 32)) is Outcome.FORGED
    later = ".".join([version, str(int(ts) + 1), nonce, _account, mac])
    assert _verify(later, body) is Outcome.FORGED


def test_freshness_and_form() -> None:
    body = {"messages": "x"}
    value = sign(KEY, ALICE, key_values=[], digest=body_digest(body), now=NOW)
    max_age, skew = IDENTITY_ATTESTATION_MAX_AGE_SECONDS, IDENTITY_CLOCK_SKEW_SECONDS
    assert _verify(value, body, now=NOW + max_age) is Outcome.VALID
    assert _verify(value, body, now=NOW + max_age + 1) is Outcome.EXPIRED
    assert _verify(value, body, now=NOW - skew) is Outcome.VALID
    assert _verify(value, body, now=NOW - skew - 1) is Outcome.FUTURE
    for bad in ("", "v1", "v2" + value[2:], value + "x", value.replace(".", ":"), "v1....."):
        assert _verify(bad, body) is Outcome.MALFORMED
    two = verify(KEY, [value, value], key_values=[], digest=body_digest(body), now=NOW,
                 guard=_fresh())  # fmt: skip
    assert two.outcome is Outcome.AMBIGUOUS


def test_the_replay_guard_is_bounded_and_forgets_only_the_stale() -> None:
    guard = ReplayGuard(capacity=3)
    assert guard.admit(b"a", expires=10, now=0)
    assert not guard.admit(b"a", expires=10, now=5)
    assert guard.admit(b"b", expires=10, now=5)
    assert guard.admit(b"c", expires=20, now=11)  # a and b are stale: forgotten
    assert len(guard) == 1
    for mac in (b"d", b"e", b"f"):
        assert guard.admit(mac, expires=30, now=12)
    assert len(guard) == 3  # full: the oldest went


def test_the_attester_reads_its_binding_from_the_headers() -> None:
    clock = iter([NOW, NOW + 1, NOW + 2]).__next__
    step = Attester(SECRET, "x-key", clock=clock)
    front = Attester(SECRET, "x-key", clock=clock, guard=ReplayGuard())
    body = {"messages": "x"}
    value = step.sign(ALICE, CIMultiDict({"x-key": "k"}), body)
    headers = CIMultiDict({"x-key": "k", IDENTITY_ATTESTATION_HEADER: value})
    assert front.verify(headers, body).account == ALICE
    assert front.verify(headers, body).outcome is Outcome.REPLAYED
    assert front.verify(CIMultiDict({"x-key": "k"}), body).outcome is Outcome.ABSENT
    with pytest.raises(RuntimeError):
        step.verify(headers, body)  # the step has no replay guard: it only signs


@given(a=st.binary(min_size=32, max_size=32), b=st.binary(min_size=32, max_size=32),
       k1=st.none() | st.text(max_size=16), k2=st.none() | st.text(max_size=16))  # fmt: skip
def test_account_salts_differ_by_account_and_key_and_never_equal_a_key_salt(
    a: bytes, b: bytes, k1: str | None, k2: str | None
) -> None:
    s1, s2 = derive_account_salt(SECRET, a, k1), derive_account_salt(SECRET, b, k2)
    assert (s1 == s2) == (a == b and k1 == k2)
    assert s1.startswith(ACCOUNT_SALT_PREFIX)
    assert is_valid_vllm_salt(s1)
    if k1 is not None:
        assert s1 != derive_salt(SECRET, k1)  # the same key without the account: elsewhere
    assert derive_account_salt(b"t" * 32, a, k1) != s1


def test_a_check_made_elsewhere_is_admitted_once_by_the_guard() -> None:
    """A worker process checks (no guard there); the serving process admits: once."""
    step = Attester(SECRET, "x-key", clock=lambda: NOW)
    worker = Attester(SECRET, "x-key", clock=lambda: NOW + 1)  # no guard: check only
    front = Attester(SECRET, "x-key", clock=lambda: NOW + 2, guard=ReplayGuard())
    body = {"messages": "x"}
    headers = CIMultiDict({"x-key": "k"})
    headers[IDENTITY_ATTESTATION_HEADER] = step.sign(ALICE, CIMultiDict({"x-key": "k"}), body)
    checked = worker.check(headers, body)
    assert (checked.account, checked.outcome) == (ALICE, Outcome.VALID)
    assert checked.ticket is not None
    assert front.admit(checked) == Verdict(ALICE, Outcome.VALID)
    assert front.admit(checked) == Verdict(None, Outcome.REPLAYED)
    assert front.verify(headers, body).outcome is Outcome.REPLAYED  # the same guard
    forged = worker.check(headers, {"messages": "y"})
    assert (forged.outcome, forged.ticket) == (Outcome.FORGED, None)
    assert front.admit(forged) is forged  # nothing to admit
    with pytest.raises(RuntimeError):
        worker.admit(checked)

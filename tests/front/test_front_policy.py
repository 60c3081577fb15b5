"""Invariants of the per-request rules and the SSE relay, as properties."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from promptcache.contract import IsolationMode
from promptcache.front.references import serialize
from promptcache.front.settings import FrontSettings
from promptcache.front.usage import SseRelay
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.policy import Isolation, apply_policy
from promptcache.tenancy.routes import find_route
from promptcache.tenancy.salt import (
    UNCACHEABLE_SALT_PREFIX,
    derive_salt,
    is_valid_vllm_salt,
    random_salt,
)

CHAT_ROUTE = find_route("/v1/chat/completions")
assert CHAT_ROUTE is not None
secrets_ = st.binary(min_size=16, max_size=64)
keys = st.text(min_size=1, max_size=200)


@given(secrets_, keys)
def test_derived_salt_always_fits_vllm_rules(secret: bytes, key: str) -> None:
    salt = derive_salt(secret, key)
    assert is_valid_vllm_salt(salt)
    assert salt == derive_salt(secret, key)


@given(secrets_, keys, keys)
def test_different_keys_never_share_a_salt(secret: bytes, a: str, b: str) -> None:
    if a != b:
        assert derive_salt(secret, a) != derive_salt(secret, b)


@given(secrets_, secrets_, keys)
def test_the_salt_depends_on_the_secret(s1: bytes, s2: bytes, key: str) -> None:
    if s1 != s2:
        assert derive_salt(s1, key) != derive_salt(s2, key)


def test_random_salts_are_valid_and_distinct() -> None:
    salts = {random_salt() for _ in range(100)}
    assert len(salts) == 100
    assert all(is_valid_vllm_salt(s) and s.startswith(UNCACHEABLE_SALT_PREFIX) for s in salts)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)
SECRET = b"s" * 32


@pytest.mark.slow  # 300 examples, ~15 s: scripts/test runs it
@settings(max_examples=300)
@given(
    mode=st.sampled_from(list(IsolationMode)),
    header_key=st.none() | keys,
    forged=json_values,
    extra=st.dictionaries(st.text(max_size=8), json_values, max_size=4),
)
def test_isolation_never_leaks(
    mode: IsolationMode, header_key: str | None, forged: Any, extra: dict[str, Any]
) -> None:
    """Whatever a client sends, vLLM sees no client salt and no isolation field, and the
    salt it sees is exactly the one derived from the key the client carried."""
    cfg = FrontSettings(isolation_mode=mode)
    body = {**extra, "model": "m", "messages": [], "cache_salt": forged}
    headers: CIMultiDict[str] = CIMultiDict()
    if header_key is not None:
        headers[cfg.isolation_header] = header_key
    body.pop(cfg.isolation_field, None)
    body.pop("prompt_cache_max_len", None)
    if mode is IsolationMode.REQUIRED and header_key is None:
        with pytest.raises(FrontError, match="requires an isolation key"):
            apply_policy(CHAT_ROUTE, headers, body, cfg, SECRET)
        return
    plan = apply_policy(CHAT_ROUTE, headers, body, cfg, SECRET)
    assert cfg.isolation_field not in body
    if mode is IsolationMode.SHARED or header_key is None or header_key == "":
        assert "cache_salt" not in body
        assert plan.isolation in (Isolation.SHARED, Isolation.UNKEYED)
    else:
        assert body["cache_salt"] == derive_salt(SECRET, header_key)
        assert plan.isolation is Isolation.KEYED


def _events(n: int, with_usage: bool) -> list[bytes]:
    events = [
        b"data: " + json.dumps({"choices": [{"index": 0, "text": f"t{i}"}]}).encode()
        for i in range(n)
    ]
    if with_usage:
        usage = {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 3}}
        events.append(b"data: " + json.dumps({"choices": [], "usage": usage}).encode())
    events.append(b"data: [DONE]")
    return events


def _pieces(stream: bytes, cuts: list[int]) -> list[bytes]:
    """`stream` cut at `cuts` (taken modulo its length), in order."""
    pieces, last = [], 0
    for cut in sorted(c % (len(stream) + 1) for c in cuts):
        pieces.append(stream[last:cut])
        last = cut
    return [*pieces, stream[last:]]


@given(
    n=st.integers(0, 6),
    strip=st.booleans(),
    cuts=st.lists(st.integers(0, 2000), max_size=12),
)
def test_sse_relay_output_does_not_depend_on_chunking(n: int, strip: bool, cuts: list[int]) -> None:
    stream = b"".join(e + b"\n\n" for e in _events(n, with_usage=True))
    whole = SseRelay(strip_usage_chunk=strip, prompt_header="p", cached_header="c")
    expected = whole.feed(stream) + whole.finish()
    pieces = _pieces(stream, cuts)
    relay = SseRelay(strip_usage_chunk=strip, prompt_header="p", cached_header="c")
    got = b"".join(relay.feed(p) for p in pieces) + relay.finish()
    assert got == expected
    assert got.endswith(b": p: 9\n: c: 3\n\ndata: [DONE]\n\n")
    assert (b'"usage"' in got) is not strip


@given(
    n=st.integers(0, 8),
    terminators=st.lists(st.sampled_from([b"\n\n", b"\r\n\r\n"]), min_size=9, max_size=9),
    cuts=st.lists(st.integers(0, 3000), max_size=12),
)
def test_sse_relay_splits_events_at_either_terminator_however_chunked(
    n: int, terminators: list[bytes], cuts: list[int]
) -> None:
    events = _events(n, with_usage=True)
    stream = b"".join(e + terminators[i % len(terminators)] for i, e in enumerate(events))
    oracle = SseRelay(strip_usage_chunk=False, prompt_header="p", cached_header="c")
    expected = b"".join(oracle._event(e) for e in events)
    pieces = _pieces(stream, cuts)
    relay = SseRelay(strip_usage_chunk=False, prompt_header="p", cached_header="c")
    assert b"".join(relay.feed(p) for p in pieces) == expected


def _seconds_to_relay(events: int) -> float:
    """Best of three, in this thread's CPU time (a busy machine's preemptions do not
    count): one read holding `events` small events, as vLLM streams tokens."""
    chunk = b"".join(e + b"\n\n" for e in _events(events, with_usage=False)[:-1])
    best = float("inf")
    for _ in range(3):
        relay = SseRelay(strip_usage_chunk=True, prompt_header="p", cached_header="c")
        started = time.thread_time()
        assert relay.feed(chunk) == chunk
        best = min(best, time.thread_time() - started)
    return best


def test_sse_relay_work_is_linear_in_the_events_of_one_read() -> None:
    # A client slower than vLLM lets hundreds of KiB of events queue into one upstream
    # read. Splitting them by re-searching the rest of the buffer per event was quadratic
    # (8x the events took ~60x the time: seconds on the event loop per read).
    small, large = _seconds_to_relay(3000), _seconds_to_relay(24_000)
    assert large < 24 * small, (small, large)


base64_text = st.text(
    alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=", max_size=60
)


@given(
    payloads=st.lists(base64_text | st.text(max_size=20), min_size=1, max_size=5),
    extra=st.dictionaries(st.text(max_size=8), json_values, max_size=4),
)
def test_serialize_is_exactly_compact_json_dumps(
    payloads: list[str], extra: dict[str, Any]
) -> None:
    body: dict[str, Any] = {**extra, "prompt_embeds": list(payloads)}
    placed = [(body["prompt_embeds"], i) for i in range(len(payloads))]
    expected = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    assert serialize(body, placed) == expected
    assert body["prompt_embeds"] == payloads  # the body is left as it was

"""The payload cache (spec/000): LRU semantics, scopes, statistics, sizing, threads."""

from __future__ import annotations

import gc
import hmac
import random
import subprocess
import sys
import threading
import tracemalloc
from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from promptcache import contract
from promptcache.embeds import (
    ENTRY_OVERHEAD_BYTES,
    SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR,
    PromptEmbedsCache,
    PromptEmbedsCacheStats,
    build_cache_from_env,
    shared_cache,
)
from promptcache.embeds import cache as cache_module

ENV = SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR


def ident(i: int) -> str:
    return f"blake3:{i:064x}"


def test_env_var_name_is_the_contract_one() -> None:
    assert SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR == "SG_PROMPT_EMBEDS_CACHE_GIB"
    assert SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR is contract.SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR


def test_cache_module_does_not_import_torch() -> None:
    code = (
        "import sys; import promptcache.embeds.cache as c; from promptcache.embeds import "
        "PromptEmbedsCache, is_prompt_embeds_id, PayloadDecodeError; "
        "c.PromptEmbedsCache(1).put('x', 'y'); print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "False"


# --- basic behaviour ---------------------------------------------------------------


def test_hit_miss_and_stats() -> None:
    cache = PromptEmbedsCache(10_000)
    assert cache.enabled
    assert cache.get(ident(1)) is None
    assert cache.put(ident(1), "QUJD")
    assert cache.get(ident(1)) == "QUJD"
    s = cache.stats()
    assert s == PromptEmbedsCacheStats(
        capacity_bytes=10_000,
        entries=1,
        hits=1,
        lookups=2,
        oversize_rejections=0,
        used_bytes=4 + ENTRY_OVERHEAD_BYTES,
        inserts=1,
    )
    assert s.hit_ratio == 0.5
    assert PromptEmbedsCacheStats(0, 0, 0, 0, 0, 0).hit_ratio == 0.0


def test_lru_eviction_and_hit_refreshes_recency() -> None:
    entry = 100
    cache = PromptEmbedsCache(3 * (entry + ENTRY_OVERHEAD_BYTES))
    for i in range(3):
        assert cache.put(ident(i), chr(65 + i) * entry)
    assert cache.get(ident(0)) is not None  # 0 becomes most recent; 1 is now least
    assert cache.put(ident(3), "D" * entry)
    assert cache.get(ident(1)) is None
    assert [cache.get(ident(i)) is not None for i in (0, 2, 3)] == [True, True, True]
    # a payload needing two slots evicts the two least recent (0 then 2)
    assert cache.put(ident(4), "E" * (2 * entry + ENTRY_OVERHEAD_BYTES))
    assert [cache.get(ident(i)) is not None for i in (0, 2, 3, 4)] == [False, False, True, True]


def test_oversize_and_empty_payloads_are_refused() -> None:
    cache = PromptEmbedsCache(1000)
    exact = "A" * (1000 - ENTRY_OVERHEAD_BYTES)
    assert cache.can_hold(exact)
    assert not cache.can_hold(exact + "A")
    assert not cache.can_hold("")
    assert cache.put(ident(0), "small")
    assert not cache.put(ident(1), exact + "A")
    assert not cache.put(ident(2), "")
    assert cache.get(ident(0)) == "small"  # a refusal evicts nothing
    s = cache.stats()
    assert (s.oversize_rejections, s.entries) == (1, 1)
    assert cache.put(ident(3), exact)
    assert cache.stats().entries == 1
    assert cache.stats().used_bytes == 1000


def test_replacing_an_entry_recharges_it() -> None:
    cache = PromptEmbedsCache(10_000)
    cache.put(ident(0), "A" * 10)
    cache.put(ident(0), "B" * 30)
    assert cache.get(ident(0)) == "B" * 30
    assert cache.stats().used_bytes == 30 + ENTRY_OVERHEAD_BYTES
    assert cache.stats().entries == 1


def test_non_ascii_payload_is_charged_the_worst_case() -> None:
    cache = PromptEmbedsCache(10_000)
    cache.put(ident(0), "é" * 10)
    assert cache.stats().used_bytes == 40 + ENTRY_OVERHEAD_BYTES


def test_clear_drops_entries_and_statistics_but_keeps_size() -> None:
    cache = PromptEmbedsCache(1000)
    cache.put(ident(0), "x")
    cache.get(ident(0))
    cache.put(ident(1), "y" * 5000)
    cache.clear()
    assert cache.stats() == PromptEmbedsCacheStats(1000, 0, 0, 0, 0, 0)
    assert cache.get(ident(0)) is None
    assert cache.put(ident(0), "x")


@pytest.mark.parametrize("capacity", [0, -1, -(2**40)])
def test_disabled_cache(capacity: int) -> None:
    cache = PromptEmbedsCache(capacity)
    assert not cache.enabled
    assert not cache.can_hold("x")
    assert not cache.put(ident(0), "x")
    assert not cache.put(ident(0), "")
    assert cache.get(ident(0)) is None
    assert cache.stats() == PromptEmbedsCacheStats(0, 0, 0, 0, 1, 0)


def test_entry_overhead_is_an_upper_bound_of_real_memory() -> None:
    """ENTRY_OVERHEAD_BYTES must cover what an entry really costs beyond its characters."""
    n, length = 5000, 64
    payloads = [f"{i:064d}"[:length] for i in range(n)]
    keys = [ident(i) for i in range(n)]
    cache = PromptEmbedsCache(1 << 40)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for k, p in zip(keys, payloads, strict=True):
            cache.put(k, p)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    str_header = sys.getsizeof(payloads[0]) - length  # the payload's own str object
    per_entry = grown / n + str_header
    assert per_entry <= ENTRY_OVERHEAD_BYTES, per_entry


# --- scopes ---------------------------------------------------------------------


def test_no_salt_and_empty_salt_are_different_scopes() -> None:
    cache = PromptEmbedsCache(10_000)
    cache.put(ident(0), "unsalted")
    assert cache.get(ident(0), "") is None
    cache.put(ident(0), "empty-salt", cache_salt="")
    assert cache.get(ident(0)) == "unsalted"
    assert cache.get(ident(0), None) == "unsalted"
    assert cache.get(ident(0), "") == "empty-salt"


def test_requests_without_salt_share_one_scope() -> None:
    cache = PromptEmbedsCache(10_000)
    cache.put(ident(0), "shared")
    assert cache.get(ident(0)) == "shared"
    assert cache.get(ident(0), cache_salt=None) == "shared"


def test_nul_in_salt_is_refused() -> None:
    cache = PromptEmbedsCache(10_000)
    with pytest.raises(ValueError, match="cache_salt must not contain NUL characters"):
        cache.put(ident(0), "x", cache_salt="a\x00")
    with pytest.raises(ValueError, match="cache_salt must not contain NUL characters"):
        cache.get(ident(0), cache_salt="\x00")


SALTS = st.one_of(
    st.none(), st.just(""), st.text(alphabet=st.characters(exclude_characters="\x00"), max_size=80)
)


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(st.tuples(SALTS, st.integers(0, 5)), min_size=1, max_size=40),
    probes=st.lists(st.tuples(SALTS, st.integers(0, 5)), max_size=40),
)
def test_salt_isolation(
    ops: list[tuple[str | None, int]], probes: list[tuple[str | None, int]]
) -> None:
    """No lookup under one salt ever returns an entry stored under another."""
    cache = PromptEmbedsCache(1 << 30)
    stored: dict[tuple[str | None, int], str] = {}
    for salt, i in ops:
        payload = f"{salt!r}|{i}"
        assert cache.put(ident(i), payload, cache_salt=salt)
        stored[(salt, i)] = payload
    for salt, i in [*probes, *ops]:
        assert cache.get(ident(i), cache_salt=salt) == stored.get((salt, i))


# --- LRU model (hypothesis stateful) ----------------------------------------------------


class LruModel(RuleBasedStateMachine):
    """Drives the cache and a plain-Python model of spec/000 side by side."""

    CAPACITY = 4 * (ENTRY_OVERHEAD_BYTES + 50)

    def __init__(self) -> None:
        super().__init__()
        self.cache = PromptEmbedsCache(self.CAPACITY)
        self.model: OrderedDict[tuple[str | None, int], str] = OrderedDict()
        self.hits = self.lookups = self.oversize = 0

    def _used(self) -> int:
        return sum(len(p) + ENTRY_OVERHEAD_BYTES for p in self.model.values())

    @rule(
        salt=st.sampled_from([None, "", "a"]),
        i=st.integers(0, 4),
        size=st.one_of(st.integers(0, 60), st.integers(0, 1100)),
    )
    def put(self, salt: str | None, i: int, size: int) -> None:
        payload = (f"{salt}:{i}:" * size)[:size]
        stored = self.cache.put(ident(i), payload, cache_salt=salt)
        charge = size + ENTRY_OVERHEAD_BYTES
        if size == 0:
            assert not stored
            return
        if charge > self.CAPACITY:
            assert not stored
            self.oversize += 1
            return
        assert stored
        self.model.pop((salt, i), None)
        while self._used() + charge > self.CAPACITY:
            self.model.popitem(last=False)
        self.model[(salt, i)] = payload

    @rule(salt=st.sampled_from([None, "", "a"]), i=st.integers(0, 4))
    def get(self, salt: str | None, i: int) -> None:
        got = self.cache.get(ident(i), cache_salt=salt)
        self.lookups += 1
        expected = self.model.get((salt, i))
        if expected is not None:
            self.model.move_to_end((salt, i))
            self.hits += 1
        assert got == expected

    @precondition(lambda self: self.lookups > 0)
    @rule()
    def clear(self) -> None:
        self.cache.clear()
        self.model.clear()
        self.hits = self.lookups = self.oversize = 0

    @invariant()
    def stats_agree(self) -> None:
        s = self.cache.stats()
        assert s.used_bytes <= s.capacity_bytes == self.CAPACITY
        assert s.used_bytes == self._used()
        assert s.entries == len(self.model)
        assert (s.hits, s.lookups, s.oversize_rejections) == (
            self.hits,
            self.lookups,
            self.oversize,
        )
        assert 0.0 <= s.hit_ratio <= 1.0
        assert s.hits <= s.lookups


TestLruModel = LruModel.TestCase
TestLruModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


# --- threads ----------------------------------------------------------------------


def test_many_thread_storm_keeps_invariants() -> None:
    capacity = 64 * (ENTRY_OVERHEAD_BYTES + 200)
    cache = PromptEmbedsCache(capacity)
    salts = [None, "", "tenant-a", "tenant-b"]
    threads_n, ops = 16, 4000
    counts: list[tuple[int, int, int]] = [(0, 0, 0)] * threads_n
    failures: list[str] = []
    start = threading.Barrier(threads_n)

    def payload_for(salt: str | None, i: int) -> str:
        return (f"{salt}/{i}/" * 40)[: 50 + (i * 7) % 300]

    def worker(n: int) -> None:
        rng = random.Random(n)
        lookups = hits = oversize = 0
        start.wait(timeout=60)
        for _ in range(ops):
            salt, i = rng.choice(salts), rng.randrange(200)
            roll = rng.random()
            if roll < 0.45:
                got = cache.get(ident(i), salt)
                lookups += 1
                if got is not None:
                    hits += 1
                    if got != payload_for(salt, i):
                        failures.append(f"wrong payload for {(salt, i)}")
            elif roll < 0.9:
                cache.put(ident(i), payload_for(salt, i), salt)
            elif roll < 0.92:
                assert not cache.put(ident(i), "x" * capacity, salt)
                oversize += 1
            else:
                s = cache.stats()
                if not (
                    s.used_bytes <= capacity
                    and s.hits <= s.lookups
                    and s.entries * (ENTRY_OVERHEAD_BYTES + 50) <= s.used_bytes
                ):
                    failures.append(f"inconsistent snapshot {s}")
        counts[n] = (lookups, hits, oversize)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
        assert not t.is_alive()
    assert failures == []
    s = cache.stats()
    assert s.lookups == sum(c[0] for c in counts)
    assert s.hits == sum(c[1] for c in counts)
    assert s.oversize_rejections == sum(c[2] for c in counts)
    assert s.used_bytes <= capacity
    # the books balance against what is really held
    held = list(cache._entries.values())
    assert s.entries == len(held)
    assert s.used_bytes == sum(len(p) + ENTRY_OVERHEAD_BYTES for p in held)


# --- sizing from the environment --------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "capacity"),
    [
        (None, 0),
        ("0", 0),
        ("0.0", 0),
        ("-0", 0),
        ("1", 1 << 30),
        ("0.5", 1 << 29),
        (" 2 ", 2 << 30),
        ("1e-3", int(1e-3 * (1 << 30))),
        ("1024", 1024 << 30),  # the bound itself: accepted (nothing is allocated up front)
    ],
)
def test_env_sizes_the_cache(
    monkeypatch: pytest.MonkeyPatch, value: str | None, capacity: int
) -> None:
    if value is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, value)
    cache = build_cache_from_env()
    assert cache.stats().capacity_bytes == capacity
    assert cache.enabled == (capacity > 0)


@pytest.mark.parametrize(
    "value",
    [
        "-1",
        "-0.5",
        "nan",
        "NaN",
        "inf",
        "-inf",
        "Infinity",
        "1e400",
        "",
        " ",
        "two",
        "1GiB",
        "0x10",
        "1,5",
        "1024.001",
        "1025",
        "1e6",
    ],
)
def test_env_rejects_bad_sizes_naming_variable_and_value(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(ENV, value)
    expected = (
        f"SG_PROMPT_EMBEDS_CACHE_GIB={value!r} is not a valid prompt-embeds cache size: expected "
        "a number of GiB from 0 to 1024 such as 2 or 0.5 (0 disables the cache)"
    )
    with pytest.raises(ValueError, match=r"^SG_PROMPT_EMBEDS_CACHE_GIB=") as info:
        build_cache_from_env()
    assert str(info.value) == expected


def test_shared_cache_is_one_per_process_and_built_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "_shared", None)
    monkeypatch.setenv(ENV, "0.001")
    results: list[PromptEmbedsCache] = []
    threads = [threading.Thread(target=lambda: results.append(shared_cache())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == 8
    assert all(r is results[0] for r in results)
    monkeypatch.setenv(ENV, "5")
    assert shared_cache() is results[0]  # sized on first use only


def test_shared_cache_failure_is_not_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "_shared", None)
    monkeypatch.setenv(ENV, "lots")
    with pytest.raises(ValueError, match="SG_PROMPT_EMBEDS_CACHE_GIB='lots'"):
        shared_cache()
    monkeypatch.setenv(ENV, "0")
    assert not shared_cache().enabled


@settings(max_examples=200, deadline=None)
@given(
    salt=st.one_of(
        st.none(), st.text(alphabet=st.characters(exclude_characters="\x00"), max_size=200)
    ),
    identifier=st.text(max_size=100),
)
def test_keys_are_tagged_hmac_sha256(salt: str | None, identifier: str) -> None:
    """The precomputed-pad HMAC is RFC 2104 HMAC-SHA256, keys longer than a block included."""
    key = b"" if salt is None else salt.encode("utf-8", "surrogatepass")
    expected = hmac.digest(key, identifier.encode("utf-8", "surrogatepass"), "sha256")
    tag = b"\x00" if salt is None else b"\x01"
    assert cache_module._scope_key(identifier, salt) == tag + expected


def test_inserts_and_evictions_are_counted() -> None:
    """Evictions per insert is the thrash signal the alert and dashboard use."""
    one = PromptEmbedsCache.charge("a" * 100)
    cache = PromptEmbedsCache(2 * one)
    for i in range(5):
        assert cache.put(ident(i), chr(ord("a") + i) * 100)
    s = cache.stats()
    assert (s.inserts, s.evictions, s.entries) == (5, 3, 2)
    cache.put(ident(4), "e" * 100)  # replacing an entry is an insert, not an eviction
    assert (cache.stats().inserts, cache.stats().evictions) == (6, 3)
    cache.clear()
    assert (cache.stats().inserts, cache.stats().evictions) == (0, 0)

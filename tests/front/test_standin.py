"""The stand-in vLLM behaves like a prefix KV cache: blocks, salts, LRU, queueing, metrics."""

from __future__ import annotations

import asyncio
import base64
import io
import re
import time
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.standin import (
    EngineConfig,
    FakePod,
    PrefixCache,
    Prompt,
    StandinUpstream,
    block_hashes,
    parse_prompt,
    start_standin,
)
from harness.waiting import eventually

CFG = EngineConfig(block_size=4, bytes_per_token=1)


def prompt(text: str, salt: str | None = None) -> tuple[Prompt, list[bytes]]:
    p = parse_prompt({"prompt": text, **({"cache_salt": salt} if salt else {})}, False, CFG)
    return p, block_hashes(p, CFG.block_size)


def served(cache: PrefixCache, text: str, salt: str | None = None) -> int:
    """Run one request through the cache (allocate, release); its cached tokens."""
    p, hashes = prompt(text, salt)
    alloc = cache.allocate(hashes, len(p), 1)
    assert alloc is not None
    cache.release(alloc)
    return alloc.cached_tokens


# --- blocks and hashes ------------------------------------------------------------------------


def test_only_full_blocks_are_hit_and_the_last_token_is_always_computed() -> None:
    cache = PrefixCache(64, 4)
    assert served(cache, "abcdefghij") == 0  # 10 tokens: 2 full blocks cached
    assert served(cache, "abcdefghij") == 8
    assert served(cache, "abcdefgh") == 4  # 8 tokens: at most 7 from cache -> one block
    assert served(cache, "abcdefghijklmnop") == 8  # extends: the two known blocks
    assert served(cache, "abcdefghijklmnop") == 12  # its 4 blocks are cached now, 15 max
    assert served(cache, "Xbcdefghijklmnop") == 0  # a chain: block 0 differs, nothing matches


def test_salt_scopes_block_zero_and_so_the_whole_chain() -> None:
    cache = PrefixCache(64, 4)
    text = "shared system prompt, then more"
    assert served(cache, text, "tenant-a") == 0
    assert served(cache, text, "tenant-b") == 0
    assert served(cache, text) == 0
    assert served(cache, text, "tenant-a") == 28
    a, _ = prompt(text, "tenant-a")
    b, _ = prompt(text, "tenant-b")
    ha, hb = block_hashes(a, 4), block_hashes(b, 4)
    assert all(x != y for x, y in zip(ha, hb, strict=True))


def test_prompt_embeds_rows_enter_the_hash() -> None:
    torch = pytest.importorskip("torch")

    def payload(seed: int) -> str:
        gen = torch.Generator().manual_seed(seed)
        buf = io.BytesIO()
        torch.save(torch.randn(8, 4, generator=gen), buf)
        return base64.b64encode(buf.getvalue()).decode()

    def hashes(data: str) -> list[bytes]:
        p = parse_prompt({"prompt": "abcd", "prompt_embeds": data}, False, CFG)
        assert len(p) == 4 + 8  # one token per embedded row
        return block_hashes(p, 4)

    first, same, other = hashes(payload(1)), hashes(payload(1)), hashes(payload(2))
    assert first == same
    assert first[0] == other[0]  # the text block
    assert first[1] != other[1]


def test_chat_turns_extend_the_previous_prompt() -> None:
    cfg = EngineConfig(block_size=16)
    history = [{"role": "system", "content": "be brief " * 20}, {"role": "user", "content": "hi"}]
    turn1 = parse_prompt({"messages": history}, True, cfg)
    history2 = [
        *history,
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "more"},
    ]
    turn2 = parse_prompt({"messages": history2}, True, cfg)
    assert turn2.tokens[: len(turn1) - 1] == turn1.tokens[: len(turn1) - 1]
    h1, h2 = block_hashes(turn1, 16), block_hashes(turn2, 16)
    assert h2[: len(h1)] == h1


# --- eviction -------------------------------------------------------------------------------


def test_lru_evicts_the_least_recently_freed_and_a_sequence_tail_first() -> None:
    cache = PrefixCache(6, 4)
    served(cache, "AAAAaaaa!")  # 2 blocks, freed first
    served(cache, "BBBBbbbb!")  # 2 blocks
    assert cache.cached == 4
    served(cache, "CCCC!")  # 1 block + 1 anonymous: room left
    p, hashes = prompt("DDDDdddd!")  # 2 + 1 more: 2 blocks must go, A's tail first
    _, ha = prompt("AAAAaaaa!")
    alloc = cache.allocate(hashes, len(p), 1)
    assert alloc is not None
    assert not cache.contains(ha[1])
    assert not cache.contains(ha[0])
    _, hb = prompt("BBBBbbbb!")
    assert cache.contains(hb[0])
    assert cache.contains(hb[1])
    cache.release(alloc)
    assert cache.evictions == 2


def test_a_hit_protects_blocks_from_eviction_like_a_fresh_use() -> None:
    cache = PrefixCache(5, 4)
    served(cache, "AAAAaaaa!")
    served(cache, "BBBBbbbb!")
    assert served(cache, "AAAAaaaa!") == 8  # A used again: B is now the oldest
    served(cache, "CCCCcccc!")  # needs 3 blocks, 1 is free: B's two go
    assert served(cache, "AAAAaaaa!") == 8
    assert served(cache, "BBBBbbbb!") == 0


def test_held_blocks_are_never_evicted_and_a_full_cache_makes_requests_wait() -> None:
    cache = PrefixCache(4, 4)
    p, hashes = prompt("AAAAaaaa!")
    held = cache.allocate(hashes, len(p), 1)
    assert held is not None
    assert cache.usage() == 3 / 4
    q, qh = prompt("BBBBbbbb!")
    assert cache.allocate(qh, len(q), 1) is None  # 3 held + 3 needed > 4
    cache.release(held)
    assert cache.usage() == 0.0  # cached but free blocks count as free (vLLM)
    assert cache.allocate(qh, len(q), 1) is not None


texts = st.text(alphabet="ab", min_size=0, max_size=24)


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(2, 12),
    ops=st.lists(st.tuples(texts, st.sampled_from([None, "s1", "s2"]), st.booleans()), max_size=40),
)
def test_cache_invariants_hold_under_any_sequence(
    capacity: int, ops: list[tuple[str, str | None, bool]]
) -> None:
    """Capacity is never exceeded; held blocks stay cached; a hit is a block-aligned
    prefix of at most n - 1 tokens made of blocks that were cached before."""
    cache = PrefixCache(capacity, 4)
    running: list[Any] = []
    for text, salt, finish_one in ops:
        p, hashes = prompt(text, salt)
        before = {h for h in hashes if cache.contains(h)}
        alloc = cache.allocate(hashes, len(p), 1)
        cache.check()
        if alloc is not None:
            assert alloc.cached_tokens % 4 == 0
            assert alloc.cached_tokens <= max(0, len(p) - 1)
            assert set(hashes[: alloc.cached_tokens // 4]) <= before
            running.append(alloc)
        for a in running:
            assert all(cache.contains(h) for h in a.hashes)
        if finish_one and running:
            cache.release(running.pop(0))
            cache.check()
    for a in running:
        cache.release(a)
    cache.check()
    assert cache.usage() == 0.0


@settings(max_examples=100, deadline=None)
@given(text=st.text(alphabet="abc", min_size=1, max_size=64), salt=st.sampled_from([None, "x"]))
def test_a_repeated_prompt_hits_every_full_block_when_it_fits(text: str, salt: str | None) -> None:
    cache = PrefixCache(64, 4)
    served(cache, text, salt)
    assert served(cache, text, salt) == (len(text) - 1) // 4 * 4
    other = "x" if salt is None else None
    assert served(cache, text, other) == 0


# --- the engine over HTTP -------------------------------------------------------------------


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^vllm:{name}\{{[^}}]*\}} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


async def test_usage_and_metrics_follow_the_cache() -> None:
    upstream = StandinUpstream(usage_from_engine=True, config=EngineConfig(block_size=16))
    runner, url = await start_standin(upstream)
    messages = [{"role": "system", "content": "x" * 400}, {"role": "user", "content": "q1"}]
    try:
        async with aiohttp.ClientSession() as http:
            usages = []
            for salt in ("t1", "t1", "t2"):
                body = {"model": "m", "messages": messages, "cache_salt": salt}
                async with http.post(url + "/v1/chat/completions", json=body) as resp:
                    assert resp.status == 200
                    usages.append((await resp.json())["usage"])
            async with http.get(url + "/metrics") as resp:
                text = await resp.text()
    finally:
        await runner.cleanup()
    n = usages[0]["prompt_tokens"]
    assert n == -(-len("<|system|>\n" + "x" * 400 + "\n<|user|>\nq1\n") // 4)
    assert [u["prompt_tokens_details"]["cached_tokens"] for u in usages] == [
        0,
        (n - 1) // 16 * 16,
        0,
    ]
    assert _metric(text, "prefix_cache_queries_total") == 3 * n
    assert _metric(text, "prefix_cache_hits_total") == (n - 1) // 16 * 16
    assert _metric(text, "prompt_tokens_cached_total") == (n - 1) // 16 * 16
    assert _metric(text, "num_requests_running") == 0
    assert _metric(text, "kv_cache_usage_perc") == 0
    # Latency histograms as vLLM exports them (the dashboard's latency and TTFT panels).
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds"):
        assert _metric(text, f"{name}_count") == 3
        assert re.search(rf'^vllm:{name}_bucket\{{[^}}]*le="\+Inf"\}} 3\.0$', text, re.M), name
        assert _metric(text, f"{name}_sum") >= 0


async def test_queueing_and_prefill_cost_shape_time_to_first_token() -> None:
    """One sequence at a time: the second request waits (and is reported waiting) while
    the first decodes; a cached prompt's first token comes sooner than an uncached one."""
    cfg = EngineConfig(
        block_size=16, max_num_seqs=1, prefill_s_per_token=0.002, decode_s_per_token=0.05
    )
    upstream = StandinUpstream(usage_from_engine=True, config=cfg)
    runner, url = await start_standin(upstream)
    long_prompt = "y" * 800  # 200 tokens: 0.4 s uncached
    try:
        async with aiohttp.ClientSession() as http:

            async def ttft(body: dict[str, Any]) -> float:
                t0 = time.monotonic()
                async with http.post(url + "/v1/completions", json=body) as resp:
                    assert resp.status == 200
                    await resp.content.readline()
                    first = time.monotonic() - t0
                    await resp.read()
                return first

            body = {"prompt": long_prompt, "max_tokens": 10, "stream": True}
            cold = await ttft(body)
            warm = await ttft(body)
            assert cold >= 0.4
            assert warm < cold - 0.25  # 192 of 200 tokens cached
            slow = asyncio.create_task(ttft({"prompt": "z", "max_tokens": 20, "stream": True}))
            await eventually(
                lambda: upstream.engine.running, "the slow request running", within_s=10,
                until=lambda running: running == 1,
            )  # fmt: skip
            queued = asyncio.create_task(ttft({"prompt": "w", "max_tokens": 1, "stream": True}))

            async def metrics() -> str:
                async with http.get(url + "/metrics") as resp:
                    return await resp.text()

            text = await eventually(
                metrics, "the second request reported waiting", within_s=10,
                until=lambda text: _metric(text, "num_requests_waiting") == 1,
            )  # fmt: skip
            assert _metric(text, "num_requests_running") == 1
            assert _metric(text, "kv_cache_usage_perc") > 0
            await slow
            assert await queued >= 0.6  # waited for the first one's 20 tokens x 50 ms
    finally:
        await runner.cleanup()


async def test_a_request_larger_than_the_cache_is_refused_with_the_fix() -> None:
    upstream = StandinUpstream(
        usage_from_engine=True, config=EngineConfig(block_size=16, num_gpu_blocks=4)
    )
    runner, url = await start_standin(upstream)
    try:
        async with aiohttp.ClientSession() as http:
            body = {"prompt": "x" * 4096, "max_tokens": 8}
            async with http.post(url + "/v1/completions", json=body) as resp:
                assert resp.status == 400
                message = (await resp.json())["error"]["message"]
    finally:
        await runner.cleanup()
    assert "KV-cache blocks" in message
    assert "shorten the prompt or max_tokens" in message


def test_fake_pod_pins_what_a_test_sets_and_reports_live_state_otherwise() -> None:
    pod = FakePod("p", "127.0.0.1", 0).start()
    try:
        assert pod.snapshot().waiting == 0
        pod.set(waiting=50, kv_cache_usage=0.99)
        assert pod.snapshot().waiting == 50
        assert pod.snapshot().kv_cache_usage == 0.99
        pod.set(waiting=None)
        assert pod.snapshot().waiting == 0
        with pytest.raises(AttributeError, match="no field 'queue'"):
            pod.set(queue=1)
    finally:
        pod.stop()

"""Slow clients, body-read cap, many ids: over real sockets, with timings that can fail."""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import urlsplit

import aiohttp
import pytest

from harness.standin import StandinUpstream
from promptcache.contract import IsolationMode

from .conftest import MakeFront

Standin = tuple[StandinUpstream, str]
CHAT = "/v1/chat/completions"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
KEYED = {"x-prompt-cache-isolation-key": "tenant-a"}
MODES = [IsolationMode.SHARED, IsolationMode.PER_KEY, IsolationMode.REQUIRED]
pytestmark = pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])


async def _open(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    parts = urlsplit(url)
    return await asyncio.open_connection(parts.hostname, parts.port)


async def _slow_body(
    url: str, length: int = 1_000_000
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Headers announcing a large body, a few bytes of it, then silence."""
    reader, writer = await _open(url)
    writer.write(
        f"POST {CHAT} HTTP/1.1\r\nHost: f\r\nContent-Type: application/json\r\n"
        "x-prompt-cache-isolation-key: tenant-a\r\n"
        f"Content-Length: {length}\r\n\r\n{{".encode()
    )
    await writer.drain()
    return reader, writer


async def test_slow_bodies_do_not_lock_tenants_out_and_time_out_with_408(
    standin: Standin, make_front: MakeFront, mode: IsolationMode, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front(
        isolation_mode=mode, max_in_flight=2, max_body_reads=64, body_timeout_seconds=1.5
    )
    slow = [await _slow_body(front.url) for _ in range(8)]
    await asyncio.sleep(0.2)
    started = time.monotonic()
    async with http.post(front.url + CHAT, json=BODY, headers=KEYED) as resp:
        assert resp.status == 200
    assert time.monotonic() - started < 1.0  # not behind the idle senders
    for reader, writer in slow:
        answer = await asyncio.wait_for(reader.read(), 10)
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert b'"code": "body_timeout"' in answer
        writer.close()
    assert len(upstream.requests) == 1


async def test_the_body_read_cap_answers_503_with_its_own_code(
    standin: Standin, make_front: MakeFront, mode: IsolationMode, http: aiohttp.ClientSession
) -> None:
    front = await make_front(isolation_mode=mode, max_body_reads=2, body_timeout_seconds=5)
    slow = [await _slow_body(front.url) for _ in range(2)]
    await asyncio.sleep(0.2)
    async with http.post(front.url + CHAT, json=BODY, headers=KEYED) as resp:
        assert resp.status == 503
        assert (await resp.json())["error"]["code"] == "body_reads_saturated"
        assert resp.headers["Retry-After"] == "1"
    for _, writer in slow:
        writer.close()
    await asyncio.sleep(0.2)
    async with http.post(front.url + CHAT, json=BODY, headers=KEYED) as resp:
        assert resp.status == 200


async def test_a_connection_that_never_finishes_its_headers_is_closed(
    standin: Standin, make_front: MakeFront, mode: IsolationMode
) -> None:
    front = await make_front(isolation_mode=mode, header_timeout_seconds=1.0)
    reader, writer = await _open(front.url)
    started = time.monotonic()
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: f\r\n")
    for _ in range(10):  # keep trickling header bytes: the deadline still holds
        await asyncio.sleep(0.2)
        if reader.at_eof():
            break
        writer.write(b"X-A: b\r\n")
    rest = await asyncio.wait_for(reader.read(), 5)
    assert rest == b""  # closed without a request ever being handled
    assert time.monotonic() - started < 3.0
    writer.close()


async def _missing_ids_request(http: aiohttp.ClientSession, url: str, n: int) -> float:
    """Seconds the front takes to answer n unknown ids (plus n/4 duplicates) with its 409."""
    ids = [f"blake3:{i:064x}" for i in range(n)]
    body = json.dumps({"model": "m", "prompt_embeds": ids + ids[: n // 4]}).encode()
    t0 = time.monotonic()
    headers = {"Content-Type": "application/json", **KEYED}
    async with http.post(url + "/v1/completions", data=body, headers=headers) as resp:
        assert resp.status == 409
        error = (await resp.json())["error"]
    elapsed = time.monotonic() - t0
    assert error["missing_prompt_embeds_ids"] == ids  # each once, in order
    return elapsed


async def test_thousands_of_unknown_ids_are_linear_and_healthz_stays_fast(
    standin: Standin, make_front: MakeFront, mode: IsolationMode, http: aiohttp.ClientSession
) -> None:
    front = await make_front(
        isolation_mode=mode, max_prompt_embeds_references=40_000, max_body_bytes=8 << 20
    )
    probes: list[float] = []

    async def probe() -> None:
        while True:
            t0 = time.monotonic()
            async with http.get(front.url + "/healthz") as resp:
                assert resp.status == 200
            probes.append(time.monotonic() - t0)
            await asyncio.sleep(0.01)

    task = asyncio.create_task(probe())
    await asyncio.sleep(0.05)
    small = min([await _missing_ids_request(http, front.url, 4_000) for _ in range(3)])
    large = min([await _missing_ids_request(http, front.url, 16_000) for _ in range(3)])
    task.cancel()
    # 4x the ids: linear work takes ~4x (the old list-membership dedupe took ~16x, seconds)
    assert large / small < 10, (small, large)
    # generous (the machine is shared): the quadratic dedupe stalled it 5-16 s here
    assert max(probes) < 4.0


async def test_more_references_than_allowed_is_400_before_any_lookup(
    standin: Standin, make_front: MakeFront, mode: IsolationMode, http: aiohttp.ClientSession
) -> None:
    front = await make_front(isolation_mode=mode, max_prompt_embeds_references=10)
    body = {"model": "m", "prompt_embeds": [f"blake3:{i:064x}" for i in range(11)]}
    async with http.post(front.url + "/v1/completions", json=body, headers=KEYED) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["code"] == "invalid_prompt_embeds"
    assert "at most 10" in error["message"]
    assert front.cache.stats().lookups == 0
    assert json.dumps(error)  # a JSON error, nothing else

"""Each key's fair share of the work its bodies cost the front, over real sockets.

A tenant sending dense bodies while another tenant is active goes into debt for what their
parse materialises; its next request waits, before its body is read, until the debt is
paid; the other tenant is never held back; past `MAX_WAITERS` waiting requests the key
gets 429 `fair_share_exceeded`. Alone, a tenant is never slowed.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import AbstractAsyncContextManager as AsyncContextManager

import aiohttp
import pytest

from harness.busy import kept_asking
from harness.front_app import MakeFront
from harness.standin import StandinUpstream
from harness.waiting import eventually
from promptcache.contract import IsolationMode
from promptcache.tenancy import errors
from promptcache.tenancy.fair_share import MAX_WAITERS
from promptcache.tenancy.shares import identity_key

RATE = 64 * 1024
KEY = "x-prompt-cache-isolation-key"
SMALL = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
DENSE = json.dumps({"model": "m", "max_tokens": 1, "prompt": [1] * 3000}).encode()
"""About 150 KiB of parse (the front's own count): 1 s of burst and ~1.4 s of debt."""
HEAVY = json.dumps({"model": "m", "max_tokens": 1, "prompt": [1] * 9000}).encode()
"""About 450 KiB of parse: ~6 s of debt, so the waiters still wait however slowly
the machine lets the test line them up."""
MODES = [IsolationMode.SHARED, IsolationMode.PER_KEY, IsolationMode.REQUIRED]


async def post(http: aiohttp.ClientSession, url: str, key: str, body: bytes) -> int:
    headers = {KEY: key, "Content-Type": "application/json"}
    async with http.post(url + "/v1/completions", data=body, headers=headers) as answer:
        await answer.read()
        return answer.status


def tenant_b(http: aiohttp.ClientSession, url: str) -> AsyncContextManager[list[float]]:
    """Tenant B asking small chat requests throughout the block, timed."""

    async def ask() -> None:
        async with http.post(url + "/v1/chat/completions", json=SMALL, headers={KEY: "b"}) as r:
            await r.read()
            assert r.status == 200

    return kept_asking(ask)


@pytest.mark.parametrize("mode", MODES)
async def test_a_key_over_its_share_waits_and_the_others_do_not(
    make_front: MakeFront,
    standin: tuple[StandinUpstream, str],
    http: aiohttp.ClientSession,
    mode: IsolationMode,
) -> None:
    front = await make_front(isolation_mode=mode, fair_share_bytes_per_second=RATE)
    async with tenant_b(http, front.url) as b_latencies:
        assert await post(http, front.url, "a", DENSE) == 200
        owed = front.state.fair_share.owed_seconds(
            identity_key(account=None, isolation_key="a", credential="", source="")
        )
        assert owed > 0.8, owed
        before_wait = len(b_latencies)
        started = time.monotonic()
        assert await post(http, front.url, "a", json.dumps(SMALL).encode()) == 200
        waited = time.monotonic() - started
        assert waited >= owed - 0.2, (waited, owed)
        assert len(b_latencies) - before_wait >= 5  # B kept being served meanwhile
        assert max(b_latencies) < 1.0, max(b_latencies)
        assert front.state.metrics.fair_share_waits._value.get() == 1
        assert front.state.metrics.fair_share_wait_seconds._value.get() >= owed - 0.2


async def test_a_key_alone_is_never_held_back(
    make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    front = await make_front(isolation_mode=IsolationMode.PER_KEY, fair_share_bytes_per_second=RATE)
    started = time.monotonic()
    for _ in range(6):  # ~6 x 150 KiB of parse: 14 s of debt were anyone else active
        assert await post(http, front.url, "a", DENSE) == 200
    assert time.monotonic() - started < 10
    assert front.state.metrics.fair_share_waits._value.get() == 0
    assert (
        front.state.fair_share.owed_seconds(
            identity_key(account=None, isolation_key="a", credential="", source="")
        )
        == 0
    )


async def test_past_the_waiters_cap_a_key_gets_429(
    make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    front = await make_front(isolation_mode=IsolationMode.PER_KEY, fair_share_bytes_per_second=RATE)
    async with tenant_b(http, front.url):
        assert await post(http, front.url, "a", HEAVY) == 200
        a = identity_key(account=None, isolation_key="a", credential="", source="")
        small = json.dumps(SMALL).encode()
        headers = {KEY: "a", "Content-Type": "application/json"}
        waiting = [
            asyncio.create_task(post(http, front.url, "a", small)) for _ in range(MAX_WAITERS)
        ]
        await eventually(
            lambda: front.state.fair_share.waiting(a),
            "front.state.fair_share.waiting(a) == MAX_WAITERS",
            until=lambda got: got == MAX_WAITERS,
            within_s=30,
        )
        async with http.post(front.url + "/v1/completions", data=small, headers=headers) as r:
            refusal = await r.json()
            assert r.status == 429
            assert refusal["error"]["code"] == errors.FAIR_SHARE_EXCEEDED
            assert refusal["error"]["type"] == "rate_limit_error"
            assert int(r.headers["Retry-After"]) >= 1
        assert await asyncio.gather(*waiting) == [200] * MAX_WAITERS


async def test_off_when_the_rate_is_zero(
    make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    front = await make_front(isolation_mode=IsolationMode.PER_KEY, fair_share_bytes_per_second=0)
    async with tenant_b(http, front.url):
        for _ in range(3):
            assert await post(http, front.url, "a", DENSE) == 200
        assert front.state.metrics.fair_share_waits._value.get() == 0


async def _raw_post(url: str, header_lines: list[bytes], body: bytes) -> int:
    """POST with header bytes exactly as given (aiohttp's client would re-encode them)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = [
        b"POST /v1/completions HTTP/1.1",
        b"Host: front",
        b"Content-Type: application/json",
        b"Content-Length: " + str(len(body)).encode(),
        b"Connection: close",
        *header_lines,
    ]
    writer.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    writer.close()
    return status


@pytest.mark.parametrize(
    ("header_lines", "status"),
    [
        ([KEY.encode() + b": \xff\xfe-not-utf-8"], 400),
        ([b"Authorization: Bearer \xc3\x28"], 400),
        ([KEY.encode() + b": " + b"k" * 9000], 431),  # past aiohttp's header line limit
    ],
    ids=["key-not-utf-8", "token-not-utf-8", "huge-key"],
)
async def test_headers_refused_before_the_body_never_reach_the_meter(
    make_front: MakeFront, http: aiohttp.ClientSession, header_lines: list[bytes], status: int
) -> None:
    """A request the front refuses for its headers is answered (400, 431) before its body is
    read: it neither pays nor waits, and leaves no key behind in the meter."""
    front = await make_front(isolation_mode=IsolationMode.PER_KEY, fair_share_bytes_per_second=RATE)
    async with tenant_b(http, front.url) as b_latencies:
        await eventually(
            lambda: len(b_latencies), "len(b_latencies) > 0", until=lambda got: got > 0, within_s=30
        )  # B's key is in the meter
        remembered = front.state.fair_share.remembered()
        for _ in range(3):
            assert await _raw_post(front.url, header_lines, DENSE) == status
        assert front.state.fair_share.remembered() == remembered
        assert front.state.metrics.fair_share_waits._value.get() == 0


async def test_repeated_identical_keys_are_one_key(
    make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    """The same isolation key sent twice is that key, for the meter as for isolation."""
    front = await make_front(isolation_mode=IsolationMode.PER_KEY, fair_share_bytes_per_second=RATE)
    async with tenant_b(http, front.url):
        twice = [KEY.encode() + b": a", KEY.encode() + b": a"]
        assert await _raw_post(front.url, twice, DENSE) == 200
        assert (
            front.state.fair_share.owed_seconds(
                identity_key(account=None, isolation_key="a", credential="", source="")
            )
            > 0.8
        )

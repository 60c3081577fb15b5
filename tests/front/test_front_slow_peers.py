"""Peers that stop reading: write deadlines free the slot, large answers are not held whole.

Over real sockets: a client with a tiny receive buffer asks for a long streamed answer and
stops reading. With one concurrency slot, the front would answer everyone else 503 for as
long as that client liked; with the write deadline it cuts the connection after
`write_timeout_seconds` and serves the next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web

from harness.front_app import MakeFront
from harness.slow_clients import stalled_reader
from harness.standin import StandinUpstream
from harness.waiting import eventually
from promptcache.contract import IsolationMode
from promptcache.front.pool import HIGH_WATER
from promptcache.front.state import FrontState

MODES = [IsolationMode.SHARED, IsolationMode.PER_KEY, IsolationMode.REQUIRED]
KEY = {"x-prompt-cache-isolation-key": "tenant-b"}


@pytest.mark.parametrize("mode", MODES)
async def test_a_client_that_stops_reading_loses_its_slot(
    make_front: MakeFront, standin: tuple[StandinUpstream, str], mode: IsolationMode
) -> None:
    standin[0].chunks = 100_000  # about 10 MB of answer: far more than any buffer
    front = await make_front(
        isolation_mode=mode, max_in_flight=1, write_timeout_seconds=1.0, send_buffer_bytes=4096
    )
    long_answer = json.dumps(
        {
            "model": "m",
            "stream": True,
            "max_tokens": 50_000,
            "messages": [{"role": "user", "content": "hi"}],
        }
    ).encode()
    sock = await stalled_reader(front.url, long_answer)
    try:
        started = time.monotonic()
        small = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
        statuses = []
        async with aiohttp.ClientSession() as session:
            while time.monotonic() - started < 15:
                async with session.post(
                    front.url + "/v1/chat/completions", json=small, headers=KEY
                ) as answer:
                    statuses.append(answer.status)
                    await answer.read()
                if answer.status == 200:
                    break
                await asyncio.sleep(0.1)  # the retry a client does after a 503, not a sync
            async with session.get(front.url + "/metrics") as scraped:
                metrics = await scraped.text()
        assert statuses[-1] == 200, statuses
        assert set(statuses[:-1]) <= {503}
        assert time.monotonic() - started < 10  # about the write timeout, not forever
        assert "promptcache_front_write_timeouts_total 1.0" in metrics
    finally:
        sock.close()


async def test_a_large_answer_is_streamed_not_held(make_front: MakeFront) -> None:
    """A large non-streamed answer of unknown use (here the stand-in's echo) reaches the
    client in pieces: the front holds no more than its send buffer of it."""
    front = await make_front(isolation_mode=IsolationMode.SHARED)
    big = json.dumps({"model": "m", "input": "y" * (3 << 20)}).encode()
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            front.url + "/v1/embeddings", data=big, headers={"Content-Type": "application/json"}
        ) as answer,
    ):
        assert answer.status == 200
        assert answer.headers.get("Transfer-Encoding") == "chunked"  # streamed, not one piece
        body = await answer.read()
    assert len(body) > 3 << 20


RELEASE = web.AppKey("release", asyncio.Event)


async def _answering(body: bytes, *, chunked: bool) -> tuple[web.AppRunner, str]:
    """A model server whose every POST answers `body`: announced with its length and sent
    after a pause (the front holds what it read meanwhile), or chunked in 64 KiB pieces."""
    release = asyncio.Event()

    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        if not chunked:
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            response.content_length = len(body)
            await response.prepare(request)
            await response.write(body[:1])
            await asyncio.wait_for(release.wait(), 10)  # until the test has looked
            await response.write(body[1:])
            return response
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for i in range(0, len(body), 1 << 16):
            await response.write(body[i : i + (1 << 16)])
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/{tail:.*}", answer)
    app[RELEASE] = release
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def _held_while_not_read(front_url: str, state: FrontState, least: int) -> int:
    """Ask for an embedding and never read the answer; what the front's budget counts
    for the request once it holds at least `least` bytes (or after 10 s)."""
    parts = urlsplit(front_url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    body = b'{"model":"m","input":"x"}'
    try:
        await loop.sock_connect(sock, (parts.hostname, parts.port))
        await loop.sock_sendall(
            sock,
            b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body,
        )
        with contextlib.suppress(AssertionError):
            await eventually(
                lambda: state.bytes_in_flight,
                "state.bytes_in_flight >= least",
                until=lambda got: got >= least,
                within_s=10,
            )
        return state.bytes_in_flight
    finally:
        sock.close()


@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "streamed"])
async def test_an_answer_the_front_holds_is_charged_to_its_memory_budget(
    make_front: MakeFront, chunked: bool
) -> None:
    """What the front holds of an answer counts in `max_in_flight_bytes` for as long as it
    is held, so new requests are admitted against what the process really holds: 60 KiB
    read whole (the small-answer path; charged before it is read, here while vLLM is
    still sending it), or, while the client does not read, the pieces of a 2 MiB stream
    and the upstream connection's read-ahead. All of it is given back when the request
    ends."""
    size = 60 * 1024 if not chunked else 2 << 20
    runner, url = await _answering(b'"' + b"a" * (size - 2) + b'"', chunked=chunked)
    try:
        front = await make_front(
            upstream=url, isolation_mode=IsolationMode.SHARED, send_buffer_bytes=4096,
            write_timeout_seconds=30,
        )  # fmt: skip
        least = size if not chunked else HIGH_WATER + (1 << 16)
        held = await _held_while_not_read(front.url, front.state, least)
        runner.app[RELEASE].set()
        assert held >= least, (held, least)
        # the client left: the handler ends, and its charge with it
        await eventually(
            lambda: front.state.bytes_in_flight,
            "front.state.bytes_in_flight == 0",
            until=lambda got: got == 0,
            within_s=10,
        )
    finally:
        await runner.cleanup()

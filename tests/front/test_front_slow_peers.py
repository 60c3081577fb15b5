"""Peers that stop reading: write deadlines free the slot, large answers are not held whole.

Over real sockets: a client with a tiny receive buffer asks for a long streamed answer and
stops reading. With one concurrency slot, the front would answer everyone else 503 for as
long as that client liked; with the write deadline it cuts the connection after
`write_timeout_seconds` and serves the next request.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from urllib.parse import urlsplit

import aiohttp
import pytest

from harness.standin import StandinUpstream
from promptcache.contract import IsolationMode

from .conftest import MakeFront

MODES = [IsolationMode.SHARED, IsolationMode.PER_KEY, IsolationMode.REQUIRED]
KEY = {"x-prompt-cache-isolation-key": "tenant-b"}


async def stalled_reader(url: str, body: bytes) -> socket.socket:
    """A client that sends its request, reads a little, and then never reads again."""
    parts = urlsplit(url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (parts.hostname, parts.port))
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"x-prompt-cache-isolation-key: tenant-a\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    await loop.sock_sendall(sock, head + body)
    first = await asyncio.wait_for(loop.sock_recv(sock, 1024), 10)
    assert first.startswith(b"HTTP/1.1 200"), first[:100]
    return sock


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

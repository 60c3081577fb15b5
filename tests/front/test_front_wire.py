"""What the front puts on the wire to a client, counted by the client's kernel.

Each TCP segment the client receives wakes its kernel and its event loop. Next to a model
server on shared cores that is CPU the server does not get, so a whole answer leaves the
front in one segment, as one write of head and body. Linux counts the data segments a
socket received (`tcpi_data_segs_in` in `TCP_INFO`, since 4.6); on loopback one write of an
answer this small is one segment, two writes are two.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from urllib.parse import urlsplit

import aiohttp
import pytest

from harness.front_app import MakeFront
from harness.slow_clients import stalled_reader
from harness.standin import StandinUpstream
from promptcache.contract import IsolationMode

TCPI_DATA_SEGS_IN = 152
"""Offset of `tcpi_data_segs_in` in Linux's `struct tcp_info`."""


def data_segments_in(sock: socket.socket) -> int:
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    if len(info) < TCPI_DATA_SEGS_IN + 4:
        pytest.skip("this kernel's TCP_INFO does not count data segments (Linux < 4.6)")
    count: int = struct.unpack_from("I", info, TCPI_DATA_SEGS_IN)[0]
    return count


async def _answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head, await reader.readexactly(length)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models"])
async def test_a_whole_answer_reaches_the_client_in_one_segment(
    make_front: MakeFront, path: str
) -> None:
    front = await make_front(isolation_mode=IsolationMode.PER_KEY)
    url = urlsplit(front.url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    sock = writer.get_extra_info("socket")
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    method = "GET" if path == "/v1/models" else "POST"
    request = (
        f"{method} {path} HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Content-Type: application/json\r\nx-prompt-cache-isolation-key: t\r\n"
    ).encode()
    request += b"Content-Length: %d\r\n\r\n%s" % (len(body), body) if method == "POST" else b"\r\n"
    try:
        for answers in (1, 2):  # and again on the kept-alive connection
            writer.write(request)
            head, payload = await _answer(reader)
            assert head.startswith(b"HTTP/1.1 200"), head
            assert payload
            assert data_segments_in(sock) == answers
    finally:
        writer.close()
        await writer.wait_closed()


async def test_a_whole_answer_to_a_client_that_stops_reading_is_cut_at_the_deadline(
    make_front: MakeFront, standin: tuple[StandinUpstream, str]
) -> None:
    """Writes that cannot wait skip the deadline's timer; one that can (a whole answer far
    larger than the send buffer, to a client that reads 1 KiB of it) still gets it."""
    standin[0].chunks = 300_000  # a whole JSON answer of about 900 kB
    front = await make_front(
        isolation_mode=IsolationMode.SHARED,
        max_in_flight=1,
        write_timeout_seconds=1.0,
        send_buffer_bytes=4096,
    )
    ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    sock = await stalled_reader(front.url, json.dumps(ask).encode())
    try:
        started = time.monotonic()
        async with aiohttp.ClientSession() as session:
            while True:  # 503 while the stalled client holds the one slot
                async with session.post(front.url + "/v1/chat/completions", json=ask) as r:
                    await r.read()
                if r.status != 503 or time.monotonic() - started > 15:
                    break
                await asyncio.sleep(0.1)  # a client's retry after a 503, not a sync
            async with session.get(front.url + "/metrics") as scraped:
                metrics = await scraped.text()
        assert r.status == 200
        assert time.monotonic() - started < 10  # about the write timeout, not forever
        assert "promptcache_front_write_timeouts_total 1.0" in metrics
    finally:
        sock.close()

"""A reconnect storm does not drop other clients' connections (issue 43's measure).

Under `bench/hostile_load.py --attacks hold` one client opens hundreds of connections at
once and its refused ones come back together; with aiohttp's default listen backlog (128)
the kernel's queue of completed connections overflowed whenever the front's loop was a
moment late to accept, the next handshakes were dropped, and a well-behaved tenant's new
connection waited for TCP's retransmission (1 s, then 3 s): seconds of tail latency that
no slot or share could explain. Counted, over real sockets: while the front's loop is
busy (it accepts nothing), 600 connections complete their handshakes (each then waits in
the kernel's queue), and the front serves a request on every one afterwards.
"""

from __future__ import annotations

import asyncio
import select
import socket
import time

from harness.standin import StandinUpstream
from promptcache.contract import IsolationMode
from promptcache.embeds.cache import PromptEmbedsCache
from promptcache.front.http_server import LISTEN_BACKLOG, create_runner, listening_site
from promptcache.front.settings import FrontSettings

STORM = 600
"""Connections opened while the loop accepts nothing: well past aiohttp's default 128,
below the front's backlog and the kernel's default `somaxconn` (4096)."""


def _established(port: int, n: int) -> list[socket.socket]:
    """`n` non-blocking connects, and those whose handshake completed: on loopback the
    kernel completes a handshake at once while the queue has room and drops it otherwise
    (retried by TCP after a second), so half a second tells them apart."""
    pending = []
    for _ in range(n):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        pending.append(sock)
    done: list[socket.socket] = []
    end = time.monotonic() + 0.5
    while pending and time.monotonic() < end:
        _, writable, _ = select.select([], pending, [], 0.05)
        for sock in writable:
            pending.remove(sock)
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                done.append(sock)
    for sock in pending:
        sock.close()
    return done


async def test_connections_queued_while_the_loop_is_busy_are_not_dropped(
    standin: tuple[StandinUpstream, str],
) -> None:
    assert LISTEN_BACKLOG >= STORM
    settings = FrontSettings(upstream=standin[1], isolation_mode=IsolationMode.SHARED)
    runner = create_runner(settings, secret=None, cache=PromptEmbedsCache(1 << 20))
    await runner.setup()
    site = listening_site(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    socks: list[socket.socket] = []
    try:
        socks = _established(port, STORM)  # on the loop: it accepts nothing meanwhile
        assert len(socks) == STORM
        loop = asyncio.get_running_loop()
        for sock in socks[:: STORM // 20]:  # each is served once the loop accepts it
            await loop.sock_sendall(sock, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = await asyncio.wait_for(loop.sock_recv(sock, 1024), 30)
            assert answer.startswith(b"HTTP/1.1 200"), answer[:80]
    finally:
        for sock in socks:
            sock.close()
        await runner.cleanup()

"""Clients that stall on purpose, over a raw socket, for the tests of the cache front's
deadlines and memory bounds (an HTTP client library would read or time out for them)."""

from __future__ import annotations

import asyncio
import socket
from urllib.parse import urlsplit


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

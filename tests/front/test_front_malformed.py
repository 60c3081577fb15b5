"""Requests aiohttp's HTTP parser refuses get the front's JSON error too, over a real socket.

They never reach the front's handler (bad request line, invalid header bytes,
oversized heads, broken framing): `FrontRequestHandler.handle_error` answers them.
Each is written byte for byte; the answer must be a JSON error with its stable code,
counted in `promptcache_front_refusals_total`, and nothing reaches the stand-in.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

import aiohttp
import pytest

from harness.front_app import MakeFront
from harness.standin import StandinUpstream

HEAD = b"Host: front\r\n"
CASES = [
    ("garbage request line", b"GARBAGE\r\n\r\n", 400, "invalid_request_line"),
    (
        "method not a token",
        b"G(T /health HTTP/1.1\r\n" + HEAD + b"\r\n",
        400,
        "invalid_request_line",
    ),
    (
        "non-ASCII target",
        "POST /v1/complétions HTTP/1.1\r\nHost: front\r\nContent-Length: 0\r\n\r\n".encode(),
        400,
        "invalid_request_line",
    ),
    (
        "unknown HTTP version",
        b"GET /health HTTP/9.9\r\n" + HEAD + b"\r\n",
        400,
        "invalid_request_line",
    ),
    ("bare LF line ends", b"GET /health HTTP/1.1\nHost: front\n\n", 400, "invalid_request_line"),
    (
        "control byte in a header value",
        b"GET /health HTTP/1.1\r\n" + HEAD + b"X-A: a\x01b\r\n\r\n",
        400,
        "invalid_header",
    ),
    (
        "NUL in a header value",
        b"GET /health HTTP/1.1\r\n" + HEAD + b"X-A: a\x00b\r\n\r\n",
        400,
        "invalid_header",
    ),
    (
        "space in a header name",
        b"GET /health HTTP/1.1\r\n" + HEAD + b"X A: b\r\n\r\n",
        400,
        "invalid_header",
    ),
    (
        "obsolete line folding",
        b"GET /health HTTP/1.1\r\n" + HEAD + b"X-A: a\r\n b\r\n\r\n",
        400,
        "invalid_header",
    ),
    ("no Host", b"GET /health HTTP/1.1\r\n\r\n", 400, "invalid_header"),
    (
        "two Content-Length headers",
        b"POST /v1/completions HTTP/1.1\r\n"
        + HEAD
        + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        400,
        "duplicate_header",
    ),
    (
        "two Content-Type headers",
        b"POST /v1/completions HTTP/1.1\r\n"
        + HEAD
        + b"Content-Type: application/json\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}",
        400,
        "duplicate_header",
    ),
    (
        "Content-Length with Transfer-Encoding",
        b"POST /v1/completions HTTP/1.1\r\n"
        + HEAD
        + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        400,
        "malformed_request",
    ),
    (
        "negative Content-Length",
        b"POST /v1/completions HTTP/1.1\r\n" + HEAD + b"Content-Length: -1\r\n\r\n",
        400,
        "malformed_request",
    ),
    (
        "transfer coding other than chunked",
        b"POST /v1/completions HTTP/1.1\r\n" + HEAD + b"Transfer-Encoding: gzip\r\n\r\n",
        400,
        "malformed_request",
    ),
    (
        "bad chunk size",
        b"POST /v1/completions HTTP/1.1\r\n"
        + HEAD
        + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        400,
        "malformed_request",
    ),
    (
        "header line over 8190 bytes",
        b"GET /health HTTP/1.1\r\n" + HEAD + b"X-A: " + b"a" * 9000 + b"\r\n\r\n",
        431,
        "request_head_too_large",
    ),
    (
        "request line over 8190 bytes",
        b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n" + HEAD + b"\r\n",
        431,
        "request_head_too_large",
    ),
    (
        "more than 128 headers",
        b"GET /health HTTP/1.1\r\n"
        + HEAD
        + b"".join(b"X-%d: a\r\n" % i for i in range(200))
        + b"\r\n",
        431,
        "request_head_too_large",
    ),
]


async def _exchange(
    url: str, *parts: bytes, pause: float = 0.0
) -> tuple[int, dict[str, str], bytes]:
    host = urlsplit(url)
    reader, writer = await asyncio.open_connection(host.hostname, host.port)
    try:
        for part in parts:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(pause)
        raw = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {n.strip().lower(): v.strip() for n, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


async def _refusals(http: aiohttp.ClientSession, url: str, code: str) -> float:
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith(f'promptcache_front_refusals_total{{code="{code}"}}'):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.parametrize(("name", "data", "status", "code"), CASES, ids=[c[0] for c in CASES])
async def test_parser_refusals_are_json_errors(
    name: str,
    data: bytes,
    status: int,
    code: str,
    standin: tuple[StandinUpstream, str],
    make_front: MakeFront,
    http: aiohttp.ClientSession,
) -> None:
    upstream, _ = standin
    front = await make_front()
    got_status, headers, body = await _exchange(front.url, data)
    assert got_status == status, body[:300]
    assert headers["content-type"].startswith("application/json")
    error = json.loads(body)["error"]
    assert error["code"] == code, error
    assert error["message"]
    assert upstream.requests == []
    assert await _refusals(http, front.url, code) == 1


async def test_broken_chunked_body_after_the_head_ends_in_a_json_error(
    standin: tuple[StandinUpstream, str], make_front: MakeFront
) -> None:
    """The framing breaks after the handler started reading the body.

    aiohttp's parser drops the body stream without marking it failed, so the read
    ends at the body deadline: a JSON 408 `body_timeout` (never a 5xx, never
    forwarded); the parser's own 400 for the broken chunk is not sent after it.
    """
    upstream, _ = standin
    front = await make_front(body_timeout_seconds=1)
    head = (
        b"POST /v1/completions HTTP/1.1\r\n" + HEAD + b"Content-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n"
    )
    status, headers, body = await _exchange(front.url, head, b"zz\r\n0\r\n\r\n", pause=0.2)
    assert status in (400, 408), body[:300]
    assert headers["content-type"].startswith("application/json")
    assert json.loads(body)["error"]["code"] in ("malformed_request", "body_timeout")
    assert upstream.requests == []


async def test_expect_100_continue(
    standin: tuple[StandinUpstream, str], make_front: MakeFront
) -> None:
    """The front answers 100 Continue only once it reads the body, and never forwards Expect."""
    upstream, _ = standin
    front = await make_front()
    body = json.dumps({"model": "m", "prompt": "hi"}).encode()
    host = urlsplit(front.url)
    reader, writer = await asyncio.open_connection(host.hostname, host.port)
    try:
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\n" + HEAD + b"Content-Type: application/json\r\n"
            b"Expect: 100-continue\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert interim.startswith(b"HTTP/1.1 100 Continue")
        writer.write(body)
        raw = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
    assert len(upstream.requests) == 1
    assert "expect" not in {k.lower() for k in upstream.requests[0].headers}

"""A lean HTTP/1.1 client for the one upstream the front talks to: vLLM on localhost.

The front forwards every request to the same origin, so it needs none of a
general client's machinery (redirects, cookies, proxies, DNS, per-request
timeout objects, tracing, content decoding). aiohttp's client cost about as
much CPU per request as everything else in the front together (profiled,
`bench/front_overhead.py`); this one writes the checked request in one buffer
on a pooled keep-alive connection and parses the answer with a few `bytes`
operations.

What it guarantees:

* **Exactly what it is given goes out**: the method, the target and the headers
  the front checked, plus `Host` and `Content-Length` (set here, never taken from
  the client). Header names and values were validated by the server's parser
  (no CR, LF or NUL can reach this module).
* **Strict framing of answers**: a status line of HTTP/1.0 or 1.1, headers of
  RFC 9110 tokens with values free of control characters, at most
  `MAX_HEAD_BYTES`; the body delimited by `Content-Length`, `chunked` (strictly
  parsed), or the end of the connection. Anything else (both `Content-Length`
  and `Transfer-Encoding`, two different lengths, another transfer coding, a
  malformed chunk) is an `UpstreamFailedError` and the connection is closed, never
  reused.
* **Bounded memory**: a body is handed on as it arrives; reading from vLLM pauses
  while more than `HIGH_WATER` bytes wait for a slow client.
* **Timeouts**: connecting takes at most `connect_timeout`; vLLM may stay silent
  at most `read_timeout` between two pieces of an answer (aiohttp's `sock_read`).
* **Connection reuse** only after a complete answer on a keep-alive connection;
  an idle connection is dropped after `IDLE_SECONDS`, well before vLLM's own
  keep-alive timeout (uvicorn's 5 s), so the front does not write a request onto
  a connection vLLM is closing. An abandoned answer (the client left, an error)
  closes its connection, which makes vLLM abort the request.

    pool = UpstreamPool("http://127.0.0.1:8001", connect_timeout=10, read_timeout=600)
    headers = [("Content-Type", "application/json")]
    answer = await pool.request("POST", "/v1/completions", headers, body)
    try:
        data = await answer.read(1 << 20)
    finally:
        answer.release()
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections import deque
from collections.abc import AsyncIterator
from typing import Final, cast
from urllib.parse import urlsplit

MAX_HEAD_BYTES: Final = 64 * 1024
"""Status line and headers of one answer; more is a failed upstream."""
MAX_CHUNK_LINE_BYTES: Final = 4096
"""A chunk-size line (with extensions) or a trailer line."""
MAX_TRAILER_BYTES: Final = 64 * 1024
HIGH_WATER: Final = 256 * 1024
"""Body bytes held for a slow client before reading from vLLM pauses."""
IDLE_SECONDS: Final = 2.0
"""An idle pooled connection older than this is closed instead of reused."""
MAX_IDLE: Final = 1024
"""Idle connections kept at most (more are closed when released)."""
SMALL_WRITE: Final = 64 * 1024
"""Bodies up to this size are sent in the same write as the head."""

_TOKEN: Final = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE: Final = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_HEX: Final = re.compile(rb"[0-9A-Fa-f]{1,16}")
_CONTROL: Final = re.compile(r"[\x00\r\n]")
_NO_BODY_STATUS: Final = frozenset({204, 304})


class UpstreamError(Exception):
    """The upstream could not answer; `kind` is the metric label."""

    kind = "failed"


class UpstreamConnectError(UpstreamError):
    """No connection could be made (vLLM down or starting)."""

    kind = "connect"


class UpstreamTimeoutError(UpstreamError):
    """vLLM sent nothing for longer than the read timeout."""

    kind = "timeout"


class UpstreamFailedError(UpstreamError):
    """vLLM broke the connection or sent something that is not a valid HTTP/1.1 answer."""

    kind = "failed"


_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _UNTIL_EOF, _DONE = range(8)


class _Connection(asyncio.Protocol):
    """One keep-alive connection: writes a request, parses one answer at a time."""

    def __init__(self, pool: UpstreamPool) -> None:
        self._pool = pool
        self._loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._phase = _DONE
        self._buffer = b""  # unparsed head or chunk framing
        self._remaining = 0  # body or chunk bytes still to come
        self._trailer_bytes = 0
        self._body: deque[bytes] = deque()
        self._held = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._waiting_since = 0.0
        self._silence_timer: asyncio.TimerHandle | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        self._write_paused = False
        self._error: UpstreamError | None = None
        self.received = False  # any byte of the current answer arrived
        self.status = 0
        self.reason = ""
        self.headers: list[tuple[str, str]] = []
        self.keep_alive = False
        self.head_done = False

    # --- asyncio callbacks ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.received = True
        if self._phase == _DONE:  # bytes nobody asked for: never reuse this connection
            self._fail(UpstreamFailedError("the model server sent bytes outside an answer"))
            return
        try:
            self._feed(data)
        except UpstreamFailedError as exc:
            self._fail(exc)
            return
        if self._held > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        if self._phase == _UNTIL_EOF:
            self._phase = _DONE
            self.keep_alive = False
            self._wake()
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_silence_timer()
        self._pool.forget(self)
        if self._phase == _UNTIL_EOF:
            self._phase = _DONE
        elif self._phase != _DONE and self._error is None:
            self._error = UpstreamFailedError(
                "the model server closed the connection before the answer was complete"
            )
        self._wake()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    # --- parsing ----------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:  # noqa: C901, PLR0915 - one state machine, read whole
        if self._buffer:
            data = self._buffer + data
            self._buffer = b""
        pos = 0
        end = len(data)
        while pos < end or self._phase in (_CHUNK_END, _TRAILER):
            phase = self._phase
            if phase == _HEAD:
                cut = data.find(b"\r\n\r\n", pos)
                if cut < 0:
                    if end - pos > MAX_HEAD_BYTES:
                        raise UpstreamFailedError("the model server's answer head is too large")
                    self._buffer = data[pos:]
                    return
                if cut - pos > MAX_HEAD_BYTES:
                    raise UpstreamFailedError("the model server's answer head is too large")
                self._head(data[pos:cut])
                pos = cut + 4
            elif phase == _LENGTH:
                n = min(self._remaining, end - pos)
                self._push(data[pos : pos + n] if (pos or n != end) else data)
                pos += n
                self._remaining -= n
                if self._remaining == 0:
                    self._phase = _DONE
            elif phase == _UNTIL_EOF:
                self._push(data[pos:] if pos else data)
                return
            elif phase == _CHUNK_SIZE:
                cut = data.find(b"\r\n", pos)
                if cut < 0:
                    if end - pos > MAX_CHUNK_LINE_BYTES:
                        raise UpstreamFailedError("a chunk-size line of the answer is too long")
                    self._buffer = data[pos:]
                    return
                if cut - pos > MAX_CHUNK_LINE_BYTES:
                    raise UpstreamFailedError("a chunk-size line of the answer is too long")
                size = data[pos:cut].split(b";", 1)[0].rstrip(b" \t")
                if not _HEX.fullmatch(size):
                    raise UpstreamFailedError("the answer has a malformed chunk size")
                pos = cut + 2
                self._remaining = int(size, 16)
                self._phase = _CHUNK_DATA if self._remaining else _TRAILER
            elif phase == _CHUNK_DATA:
                n = min(self._remaining, end - pos)
                self._push(data[pos : pos + n] if (pos or n != end) else data)
                pos += n
                self._remaining -= n
                if self._remaining == 0:
                    self._phase = _CHUNK_END
            elif phase == _CHUNK_END:
                if end - pos < 2:
                    self._buffer = data[pos:]
                    return
                if data[pos : pos + 2] != b"\r\n":
                    raise UpstreamFailedError("a chunk of the answer is not followed by CRLF")
                pos += 2
                self._phase = _CHUNK_SIZE
            elif phase == _TRAILER:
                cut = data.find(b"\r\n", pos)
                if cut < 0:
                    if end - pos > MAX_CHUNK_LINE_BYTES:
                        raise UpstreamFailedError("a trailer line of the answer is too long")
                    self._buffer = data[pos:]
                    return
                self._trailer_bytes += cut - pos + 2
                if self._trailer_bytes > MAX_TRAILER_BYTES:
                    raise UpstreamFailedError("the answer's trailers are too large")
                empty = cut == pos
                pos = cut + 2
                if empty:
                    self._phase = _DONE
            else:  # _DONE: more bytes after a complete answer
                raise UpstreamFailedError("the model server sent more than one answer")

    def _head(self, head: bytes) -> None:  # noqa: C901, PLR0915 - one pass over the head
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if (
            len(parts) < 2
            or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0")
            or len(parts[1]) != 3
            or not parts[1].isdigit()
        ):
            raise UpstreamFailedError("the model server's status line is malformed")
        status = int(parts[1])
        if 100 <= status < 200:
            if status == 101:
                raise UpstreamFailedError("the model server switched protocols")
            return  # an interim answer (100, 103): the real one follows
        reason = parts[2] if len(parts) == 3 else b""
        if _BAD_VALUE.search(reason):
            raise UpstreamFailedError("the model server's status line is malformed")
        headers: list[tuple[str, str]] = []
        length: int | None = None
        chunked = False
        close = parts[0] == b"HTTP/1.0"
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not _TOKEN.fullmatch(name):
                raise UpstreamFailedError("the model server sent a malformed header line")
            value = value.strip(b" \t")
            if _BAD_VALUE.search(value):
                raise UpstreamFailedError("the model server sent a header value with control bytes")
            lower = name.lower()
            if lower == b"content-length":
                if not value.isdigit() or len(value) > 18:
                    raise UpstreamFailedError("the model server sent a malformed Content-Length")
                if length is not None and length != int(value):
                    raise UpstreamFailedError("the model server sent two Content-Length headers")
                length = int(value)
            elif lower == b"transfer-encoding":
                if chunked or value.lower() != b"chunked":
                    raise UpstreamFailedError("the model server used a transfer coding but chunked")
                chunked = True
            elif lower == b"connection":
                close = close or b"close" in value.lower()
            try:
                headers.append((name.decode("ascii"), value.decode("utf-8")))
            except UnicodeDecodeError:
                raise UpstreamFailedError(
                    "the model server sent a header that is not UTF-8"
                ) from None
        if chunked and length is not None:
            raise UpstreamFailedError("the answer has Content-Length and Transfer-Encoding")
        self.status = status
        self.reason = reason.decode("latin-1")
        self.headers = headers
        self.head_done = True
        if status in _NO_BODY_STATUS:
            self._phase = _DONE
        elif chunked:
            self._phase = _CHUNK_SIZE
        elif length is not None:
            self._remaining = length
            self._phase = _LENGTH if length else _DONE
        else:
            self._phase = _UNTIL_EOF
            close = True
        self.keep_alive = not close

    def _push(self, chunk: bytes) -> None:
        if chunk:
            self._body.append(chunk)
            self._held += len(chunk)

    def _fail(self, exc: UpstreamError) -> None:
        if self._error is None:
            self._error = exc
        self.close()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # --- used by the pool and the answer ------------------------------------------------

    def send(self, head: bytes, body: bytes) -> None:
        assert self.transport is not None
        self._phase = _HEAD
        self.received = False
        self.head_done = False
        self._trailer_bytes = 0
        if len(body) <= SMALL_WRITE:
            self.transport.write(head + body if body else head)
        else:
            self.transport.write(head)
            self.transport.write(body)

    async def drain(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark."""
        timeout = self._pool.read_timeout
        while self._write_paused and not self.closed:
            waiter = self._drain_waiter = self._loop.create_future()
            timer = self._loop.call_later(timeout, _expire, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._drain_waiter = None

    async def wait(self) -> None:
        """Wait for more of the answer, at most the read timeout of silence.

        The deadline is this wait's start plus the read timeout, kept by one timer per
        connection (`_silence`) rather than one armed and cancelled per wait: a stream
        waits once per event."""
        if self._error is not None:
            raise self._error
        waiter = self._waiter = self._loop.create_future()
        self._waiting_since = self._loop.time()
        if self._silence_timer is None:
            self._silence_timer = self._loop.call_at(
                self._waiting_since + self._pool.read_timeout, self._silence
            )
        try:
            await waiter
        finally:
            self._waiter = None
        if self._error is not None:
            raise self._error

    def _silence(self) -> None:
        """The read timeout's timer: expire a wait that has lasted the timeout; for a later
        wait, fire again at its deadline; with no wait, stop (the next wait arms it)."""
        self._silence_timer = None
        waiter = self._waiter
        if waiter is None or waiter.done() or self.closed:
            return
        deadline = self._waiting_since + self._pool.read_timeout
        if self._loop.time() >= deadline:
            _expire(waiter)
        else:
            self._silence_timer = self._loop.call_at(deadline, self._silence)

    def take(self) -> bytes | None:
        """Every body byte received so far, in one piece (one write to the client), or None."""
        body = self._body
        if not body:
            return None
        chunk = body.popleft() if len(body) == 1 else b"".join(body)
        body.clear()
        self._held = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return chunk

    @property
    def complete(self) -> bool:
        return self._phase == _DONE and not self._body

    @property
    def error(self) -> UpstreamError | None:
        return self._error

    def close(self) -> None:
        self.closed = True
        self._stop_silence_timer()
        if self.transport is not None:
            self.transport.close()

    def _stop_silence_timer(self) -> None:
        if self._silence_timer is not None:
            self._silence_timer.cancel()
            self._silence_timer = None


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(UpstreamTimeoutError("the model server sent nothing in time"))


class UpstreamAnswer:
    """One answer: status, reason and headers now; the body as it arrives."""

    __slots__ = ("_conn", "_pool", "_released", "headers", "reason", "status")

    def __init__(self, pool: UpstreamPool, conn: _Connection) -> None:
        self._pool = pool
        self._conn = conn
        self._released = False
        self.status = conn.status
        self.reason = conn.reason
        self.headers = conn.headers

    def header(self, name: str) -> str | None:
        """The first value of a header (name in lower case), or None."""
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    async def next_chunk(self) -> bytes | None:
        """The next piece of the body, or None at its end."""
        conn = self._conn
        while True:
            chunk = conn.take()
            if chunk is not None:
                return chunk
            if conn.complete:
                return None
            await conn.wait()

    async def read(self, limit: int) -> bytes:
        """The body up to `limit` bytes; more than that returns what was read (> limit)."""
        pieces: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = await self.next_chunk()
            if chunk is None:
                break
            pieces.append(chunk)
            size += len(chunk)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The rest of the body, piece by piece."""
        while (chunk := await self.next_chunk()) is not None:
            yield chunk

    def release(self) -> None:
        """Give the connection back if the answer was read whole, else close it."""
        if self._released:
            return
        self._released = True
        conn = self._conn
        if conn.complete and conn.keep_alive and conn.error is None and not conn.closed:
            self._pool.put(conn)
        else:
            conn.close()


class UpstreamPool:
    """Keep-alive connections to one origin (`http://host:port` or `https://...`)."""

    def __init__(self, base: str, *, connect_timeout: float, read_timeout: float) -> None:
        parts = urlsplit(base)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"upstream {base!r} must be an http(s) URL")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if parts.scheme == "https" else None
        )
        default_port = 443 if parts.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        authority = host if self.port == default_port else f"{host}:{self.port}"
        self._host_line = f"Host: {authority}\r\n".encode("ascii")
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    async def request(
        self,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> UpstreamAnswer:
        """Send one request and wait for the answer's head.

        A GET on a reused connection that vLLM closed before answering is sent
        once more on a new connection (as aiohttp does for idempotent methods);
        a POST never is.
        """
        lines = [f"{method} {target} HTTP/1.1\r\n".encode("ascii"), self._host_line]
        for name, value in headers:
            if _CONTROL.search(name) or _CONTROL.search(value):
                raise ValueError(f"header {name!r} holds CR, LF or NUL")
            lines.append(f"{name}: {value}\r\n".encode())
        if body or method != "GET":
            lines.append(b"Content-Length: %d\r\n" % len(body))
        lines.append(b"\r\n")
        head = b"".join(lines)
        retry = method == "GET"
        while True:
            conn, reused = await self._acquire()
            try:
                conn.send(head, body)
                await conn.drain()
                while not conn.head_done:
                    await conn.wait()
            except UpstreamFailedError:
                conn.close()
                if retry and reused and not conn.received:
                    retry = False
                    continue
                raise
            except BaseException:
                conn.close()
                raise
            return UpstreamAnswer(self, conn)

    async def _acquire(self) -> tuple[_Connection, bool]:
        loop = self.loop
        now = loop.time()
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and now - conn.idle_since < IDLE_SECONDS:
                return conn, True
            conn.close()
        conn = _Connection(self)
        try:
            async with asyncio.timeout(self.connect_timeout):
                await loop.create_connection(lambda: conn, self.host, self.port, ssl=self.ssl)
        except TimeoutError:
            raise UpstreamConnectError(
                f"no connection to {self.host}:{self.port} within {self.connect_timeout:g} s"
            ) from None
        except OSError as exc:
            raise UpstreamConnectError(exc.strerror or str(exc)) from None
        self._all.add(conn)
        return conn, False

    def put(self, conn: _Connection) -> None:
        if len(self._idle) >= MAX_IDLE:
            conn.close()
            return
        conn.idle_since = self.loop.time()
        self._idle.append(conn)

    def forget(self, conn: _Connection) -> None:
        self._all.discard(conn)

    def close(self) -> None:
        """Close every connection (idle or in use)."""
        for conn in list(self._all):
            conn.close()
        self._idle.clear()
        self._all.clear()

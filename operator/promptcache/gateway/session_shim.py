"""The session shim: an ext_proc proxy that lets a body's `user` field name the session.

spec/004 lets clients name their session in the `x-session-affinity` header or in the
body's `user` field. The llm-d Endpoint Picker's session plugins read headers (or
attributes other plugins publish) only; no v0.10.0 plugin reads `user`. The cache front
copies `user` into the header too, but it runs inside the model-server pod, after the EPP
has picked it: too late for routing. A Gateway API RequestHeaderModifier sets fixed values
and cannot read a body.

So the copy happens on the ext_proc path itself, before the EPP decides. The shim runs as
a second container in the EPP pod, on the port the EPP Service targets, and relays every
ext_proc stream to the EPP on localhost. It holds a request's headers until its body has
arrived; when the session header is absent (or empty) and the body carries a usable
`user`, it adds the header to the headers it forwards. Every other message, both ways,
passes through unchanged, and the EPP's status ends the gateway's stream as it is. The
EPP echoes the request headers it saw in its header mutation, so the model-server pod
(and the cache front) get the same header. An explicit header always wins.

Memory is bounded: a request buffers at most `max_body_bytes` of body and all requests
together at most `max_buffered_bytes`; beyond either, the request is passed on unread
(routed as if it had no `user`). See docs/endpoint-picker.md.

    >>> running = await start(ShimSettings(listen="127.0.0.1:0", upstream="127.0.0.1:9012"))
    >>> running.port  # the gateway (or a test) dials 127.0.0.1:<port>
    >>> await running.stop(grace_s=5)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import grpc
import grpc.aio
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from promptcache.gateway.settings import ShimSettings

log = logging.getLogger("promptcache.session_shim")

MAX_SESSION_ID_CHARS: Final[int] = 256
"""Longer `user` values are not used as a session (a header has to carry them)."""
_OFFLOAD_BYTES: Final[int] = 256 * 1024
"""Bodies at least this big are parsed on a worker thread, off the event loop."""
_QUEUE_DEPTH: Final[int] = 16
"""Messages waiting for the EPP per stream: back-pressure instead of an unbounded queue."""
_NOT_FORWARDED_METADATA: Final[frozenset[str]] = frozenset(
    {"content-type", "te", "user-agent", "host", "content-length", "accept-encoding"}
)


def session_from_body(raw: bytes, field: str = "user") -> str | None:
    """The body's `field` as a session id, or None when absent or unusable in a header.

    A client controls `user`, so only a string of 1-256 characters (after trimming
    spaces) without control characters is used; anything else is ignored, never
    forwarded, and the request is routed as if `user` were absent."""
    if raw.lstrip()[:1] != b"{":
        return None  # not a JSON object: not worth parsing (multipart, binary, ...)
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(body, dict):
        return None
    value = body.get(field)
    if not isinstance(value, str):
        return None
    value = value.strip()
    if not value or len(value) > MAX_SESSION_ID_CHARS:
        return None
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return None
    return value


class _Budget:
    """Body bytes held by all streams at once (one event loop: no lock needed)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> bool:
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n


class _Inspector:
    """Per-stream state: hold the request headers until the body says who the session is.

    `feed` returns the messages to forward now; when it returns None the body is complete
    and the caller decides the session (`body()`, then `decide()`)."""

    def __init__(self, header: str, max_body_bytes: int, budget: _Budget) -> None:
        self.header = header
        self.max_body_bytes = max_body_bytes
        self.budget = budget
        self.active = True
        self.held: Any = None
        self.chunks: list[Any] = []
        self.size = 0

    def feed(self, msg: Any) -> list[Any] | None:
        if not self.active:
            return [msg]
        kind = msg.WhichOneof("request")
        if kind == "request_headers" and self.held is None:
            headers = msg.request_headers
            if headers.end_of_stream or self._explicit(headers.headers):
                self.active = False
                return [msg]
            self.held = msg
            return []
        if kind == "request_body" and self.held is not None:
            n = len(msg.request_body.body)
            if self.size + n > self.max_body_bytes or not self.budget.take(n):
                return [*self.release(), msg]  # too big to read: pass on unread
            self.size += n
            self.chunks.append(msg)
            return None if msg.request_body.end_of_stream else []
        return [*self.release(), msg]  # trailers, responses, anything else: stop holding

    def _explicit(self, header_map: Any) -> bool:
        """Whether the client named a session itself (a non-empty header)."""
        return any(
            h.key.lower() == self.header and (h.raw_value or h.value).strip()
            for h in header_map.headers
        )

    def body(self) -> bytes:
        return b"".join(c.request_body.body for c in self.chunks)

    def decide(self, session: str | None) -> list[Any]:
        """Add the header when there is a session, then forward what was held."""
        if session is not None and self.held is not None:
            entries = self.held.request_headers.headers.headers
            for i in reversed(range(len(entries))):
                if entries[i].key.lower() == self.header:
                    del entries[i]  # present but empty: the EPP would ignore it anyway
            entries.append(base_pb2.HeaderValue(key=self.header, raw_value=session.encode()))
        return self.release()

    def release(self) -> list[Any]:
        """Stop inspecting; return what was held, in order, and free its budget."""
        out = ([self.held] if self.held is not None else []) + self.chunks
        self.budget.give(self.size)
        self.held, self.chunks, self.size, self.active = None, [], 0, False
        return out


def _forwarded_metadata(context: grpc.aio.ServicerContext[Any, Any]) -> list[tuple[str, Any]]:
    """The gateway's call metadata minus what gRPC itself sets per hop."""
    out: list[tuple[str, Any]] = []
    for key, value in context.invocation_metadata() or ():
        if key.startswith((":", "grpc-")) or key in _NOT_FORWARDED_METADATA:
            continue
        out.append((key, value))
    return out


class SessionShim(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """Relays ext_proc streams to the EPP, adding the session header from `user`."""

    def __init__(self, settings: ShimSettings, channel: grpc.aio.Channel) -> None:
        self.settings = settings
        self._stub = pb_grpc.ExternalProcessorStub(channel)
        self.budget = _Budget(settings.max_buffered_bytes)

    async def _session(self, raw: bytes) -> str | None:
        field = self.settings.user_field
        if len(raw) >= _OFFLOAD_BYTES:
            return await asyncio.to_thread(session_from_body, raw, field)
        return session_from_body(raw, field)

    async def _pump(self, incoming: AsyncIterator[Any], out: asyncio.Queue[Any]) -> None:
        """Gateway → EPP: forward in order, holding headers while the body is read."""
        inspector = _Inspector(
            self.settings.session_header, self.settings.max_body_bytes, self.budget
        )
        try:
            async for msg in incoming:
                forward = inspector.feed(msg)
                if forward is None:
                    forward = inspector.decide(await self._session(inspector.body()))
                for item in forward:
                    await out.put(item)
            for item in inspector.release():  # the gateway half-closed mid-body
                await out.put(item)
        finally:
            inspector.release()
        await out.put(None)  # half-close toward the EPP

    async def Process(  # noqa: N802 - the gRPC method name
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        out: asyncio.Queue[Any] = asyncio.Queue(maxsize=_QUEUE_DEPTH)
        pump = asyncio.create_task(self._pump(request_iterator, out))

        async def upstream_requests() -> AsyncIterator[Any]:
            while (item := await out.get()) is not None:
                yield item

        call = self._stub.Process(
            upstream_requests(),
            metadata=_forwarded_metadata(context),
            timeout=context.time_remaining(),
        )

        def pump_done(task: asyncio.Task[None]) -> None:
            # Reading from the gateway failed: the EPP's side must not wait for more.
            if not task.cancelled() and task.exception() is not None:
                call.cancel()

        pump.add_done_callback(pump_done)
        failed: grpc.aio.AioRpcError | None = None
        try:
            async for response in call:
                yield response
        except grpc.aio.AioRpcError as error:
            failed = error
        finally:
            call.cancel()
            pump.cancel()
            # Stop reading from the gateway before answering it: a read still pending
            # when the status goes out would turn that status into INTERNAL.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pump
        if failed is not None:
            # The EPP's own verdict (or UNAVAILABLE when it is down) ends the gateway's
            # stream as it is, so the gateway's failure mode applies unchanged.
            await context.abort(failed.code(), failed.details() or "")


@dataclass
class RunningShim:
    """A started shim: where it listens, and how to stop it."""

    server: grpc.aio.Server
    channel: grpc.aio.Channel
    shim: SessionShim
    port: int

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self, grace_s: float | None = None) -> None:
        """Refuse new streams, let open ones finish for `grace_s`, then close."""
        grace = self.shim.settings.drain_seconds if grace_s is None else grace_s
        await self.server.stop(grace)
        await self.channel.close()


async def start(settings: ShimSettings) -> RunningShim:
    """Bind `settings.listen` (port 0 picks a free one) and relay to `settings.upstream`."""
    channel = grpc.aio.insecure_channel(settings.upstream)
    shim = SessionShim(settings, channel)
    # No SO_REUSEPORT: a second shim on the port must fail, not take half the streams.
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    pb_grpc.add_ExternalProcessorServicer_to_server(shim, server)
    try:
        port = server.add_insecure_port(settings.listen)
    except RuntimeError:
        port = 0
    if port == 0:
        await channel.close()
        raise OSError(f"cannot listen on {settings.listen}")
    await server.start()
    return RunningShim(server, channel, shim, port)


async def _serve(settings: ShimSettings, signals: Sequence[signal.Signals]) -> None:
    running = await start(settings)
    log.info(
        "session shim listening on %s (port %d), relaying ext_proc to the Endpoint Picker at "
        "%s; header %r from body field %r when absent; bodies up to %d bytes inspected "
        "(%d bytes for all requests)",
        settings.listen, running.port, settings.upstream, settings.session_header,
        settings.user_field, settings.max_body_bytes, settings.max_buffered_bytes,
    )  # fmt: skip
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in signals:
        loop.add_signal_handler(sig, stopping.set)
    try:
        await stopping.wait()
    finally:
        log.info("session shim stopping: draining open streams for %ss", settings.drain_seconds)
        await running.stop()
        log.info("session shim stopped")


def serve(settings: ShimSettings) -> int:
    """Run until SIGTERM or SIGINT, then drain; the `session-shim` sub-command's body."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        asyncio.run(_serve(settings, (signal.SIGTERM, signal.SIGINT)))
    except OSError as error:
        log.error("session shim cannot start: %s", error)
        return 1
    return 0

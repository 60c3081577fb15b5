"""A loopback relay that lets a plaintext gRPC client talk to an Endpoint Picker serving TLS.

A picker rendered without the policy step in front serves ext_proc over TLS with the
self-signed certificate it makes at start-up (`--secure-serving` defaults to true), and
gateways dial it without verifying that certificate (the GIE and llm-d guides configure
exactly that). grpcio cannot skip verification, and the certificate names no host, so the
harness plays the gateway's TLS side here: it accepts plaintext HTTP/2 on a free loopback
port and relays the bytes over a real TLS connection (ALPN h2, no verification) to the
picker. Tests thereby run the picker with its rendered transport instead of switching
TLS off. One asyncio loop in a daemon thread does the relaying (an SSL connection must not
be read and written from two threads at once).

When the relay cannot reach the picker it can only close the client's connection, which
grpcio reports as `UNAVAILABLE: Socket closed` (and then fails every call of its backoff
window the same way). That is what the benchmark and the demo once hit: GIE v1.5.0 serves
gRPC health before its ext_proc listener, which it opens only after making a 4096-bit RSA
key (0.2-0.5 s later here), so a pick sent when health said ready found nothing to relay
to. `EppProcess.wait_ready` now waits for the ext_proc port too, and the relay keeps the
reason (`last_error`), which the ext_proc client adds to the gRPC error it raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading

from harness.net import free_port


def _client_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the picker's certificate is self-signed, as in a cluster
    ctx.set_alpn_protocols(["h2"])
    return ctx


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError, ssl.SSLError):
            writer.close()


class TlsRelay:
    """Plaintext on 127.0.0.1:<port> in, TLS to `upstream_port` out."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.last_error: str | None = None
        """Why the last connection could not be relayed (None: every one was)."""
        self._ctx = _client_context()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", self.port)

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._handle(reader, writer)
        finally:
            self._tasks.discard(task)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(
                "127.0.0.1", self.upstream_port, ssl=self._ctx, server_hostname=""
            )
        except (OSError, ssl.SSLError) as error:
            self.last_error = (
                f"TLS relay could not reach the picker on 127.0.0.1:{self.upstream_port}: "
                f"{type(error).__name__}: {error}"
            )
            writer.close()
            return
        self._writers |= {writer, up_writer}
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self._writers -= {writer, up_writer}
            for w in (writer, up_writer):
                with contextlib.suppress(OSError, RuntimeError, ssl.SSLError):
                    w.close()

    def close(self) -> None:
        """Stop listening and end every open connection: their transports are aborted, so
        each pipe reads EOF and its handler returns. Cancelling the handlers instead (as
        this once did) made Python 3.11's `start_server` log `Exception in callback ...
        CancelledError` for each one: its done-callback calls `task.exception()`, which
        raises for a cancelled task. The bench closes a relay after every router."""

        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            if self._tasks:  # a handler still dialling the picker: give up on it
                _, stuck = await asyncio.wait(set(self._tasks), timeout=5)
                for task in stuck:
                    task.cancel()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._loop.is_running():
            self._loop.close()

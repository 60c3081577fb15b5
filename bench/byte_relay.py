"""The cheapest proxy a pod could put before vLLM: bytes both ways, no HTTP, no policy.

`bench/front_overhead.py --engine real` runs it beside the cache front, on the front's
cores, as a floor: what any extra process and loopback hop between a client and the
engine costs. What the front costs above it is its own work.

    python -m bench.byte_relay 127.0.0.1:18100 127.0.0.1:8001
"""

from __future__ import annotations

import asyncio
import sys
from typing import cast


class _Upstream(asyncio.Protocol):
    def __init__(self, client: _Client) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.client.transport is not None:
            self.client.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.client.transport is not None:
            self.client.transport.close()


class _Client(asyncio.Protocol):
    """One client connection, and its own connection to the upstream."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.transport: asyncio.Transport | None = None
        self.upstream: _Upstream | None = None
        self.pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, upstream = await loop.create_connection(
                lambda: _Upstream(self), self.host, self.port
            )
        except OSError:
            if self.transport is not None:
                self.transport.close()
            return
        self.upstream = upstream
        for data in self.pending:
            self.data_received(data)
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        if self.upstream is None or self.upstream.transport is None:
            self.pending.append(data)
        else:
            self.upstream.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def serve(listen: str, upstream: str) -> None:
    host, port = _address(upstream)
    listen_host, listen_port = _address(listen)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(host, port), listen_host, listen_port)
    await server.serve_forever()


def main() -> None:
    import uvloop  # noqa: PLC0415 - the front's own event loop, as in a pod

    uvloop.run(serve(sys.argv[1], sys.argv[2]))


if __name__ == "__main__":
    main()

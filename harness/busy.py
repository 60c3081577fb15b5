"""A tenant kept asking in the background of a test, each request timed."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable


@contextlib.asynccontextmanager
async def kept_asking(
    ask: Callable[[], Awaitable[None]], *, pause: float = 0.02, settle: float = 0.2
) -> AsyncIterator[list[float]]:
    """Run `ask` again and again for the whole block, `pause` apart, and yield the list its
    latencies are appended to. The block starts `settle` after the first ask (the tenant is
    active by then); a failed ask fails the block when it ends."""
    latencies: list[float] = []
    stop = asyncio.Event()

    async def keep() -> None:
        while not stop.is_set():
            started = time.monotonic()
            await ask()
            latencies.append(time.monotonic() - started)
            await asyncio.sleep(pause)

    task = asyncio.create_task(keep())
    try:
        await asyncio.sleep(settle)
        yield latencies
    finally:
        stop.set()
        await task

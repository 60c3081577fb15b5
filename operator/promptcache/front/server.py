"""Running the front: one process per vLLM API server, all on one port.

vLLM's `--api-server-count N` runs N processes behind one socket; the front
mirrors that (`workers`, set by the renderer) with N processes bound with
`SO_REUSEPORT`, each with its own prompt-embeds cache, as spec/000 describes
for vLLM itself: the pod's ceiling is N times the configured size, and each
process counts its own metrics (a scrape reaches one of them).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import signal
import sys
from collections.abc import Callable
from typing import Final

from aiohttp import web

from promptcache.embeds.cache import PromptEmbedsCache
from promptcache.front.app import create_runner
from promptcache.front.settings import FrontSettings, SettingsError, parse_listen, read_salt_key

log = logging.getLogger("promptcache.front")
SHUTDOWN_TIMEOUT_SECONDS: Final = 30.0


async def _run(settings: FrontSettings, secret: bytes | None, reuse_port: bool) -> None:
    cache = PromptEmbedsCache(settings.cache_capacity_bytes)
    runner = create_runner(
        settings, secret=secret, cache=cache, shutdown_timeout=SHUTDOWN_TIMEOUT_SECONDS
    )
    await runner.setup()
    host, port = parse_listen(settings.listen)
    site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None)
    await site.start()
    log.info(
        "cache front listening on %s, forwarding to %s (isolation %s, prompt-embeds cache "
        "%s bytes)",
        settings.listen,
        settings.upstream_base,
        settings.isolation_mode.value,
        settings.cache_capacity_bytes,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("cache front stopping")
        await runner.cleanup()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when installed (the `front` extra has it), else asyncio's.

    uvloop runs the front's socket and timer work in C: measured in
    `bench/front_overhead.py`, it is a large share of the front's CPU per request.
    """
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def _serve_loop(settings: FrontSettings, secret: bytes | None, reuse_port: bool) -> None:
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_run(settings, secret, reuse_port=reuse_port))


def _child(settings: FrontSettings, secret: bytes | None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    _serve_loop(settings, secret, reuse_port=True)


def serve(settings: FrontSettings) -> int:
    """Run until SIGTERM/SIGINT; return the process exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        secret = read_salt_key(settings)
    except SettingsError as exc:
        print(f"promptcache front: {exc}", file=sys.stderr)
        return 2
    children: list[multiprocessing.process.BaseProcess] = []
    ctx = multiprocessing.get_context("spawn")
    for _ in range(settings.workers - 1):
        child = ctx.Process(target=_child, args=(settings, secret), daemon=True)
        child.start()
        children.append(child)
    try:
        _serve_loop(settings, secret, reuse_port=settings.workers > 1)
    except OSError as exc:
        print(
            f"promptcache front: cannot listen on {settings.listen}: {exc.strerror}",
            file=sys.stderr,
        )
        return 1
    finally:
        for proc in children:
            proc.terminate()
        for proc in children:
            proc.join(timeout=SHUTDOWN_TIMEOUT_SECONDS)
    return 0

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
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Final

from promptcache.contract import FRONT_DRAIN_SECONDS
from promptcache.embeds.cache import PromptEmbedsCache
from promptcache.front import heap
from promptcache.front.http_server import create_runner, listening_site
from promptcache.front.settings import (
    FrontSettings,
    SettingsError,
    parse_listen,
    read_mounted_salt_key,
)
from promptcache.runtime.supervision import stop_processes, stop_when_orphaned
from promptcache.stopping import stop_event

log = logging.getLogger("promptcache.front")
SHUTDOWN_TIMEOUT_SECONDS: Final = FRONT_DRAIN_SECONDS
"""After it stops listening, how long the front waits for the requests in flight."""


def _lifecycle_socket(listen: str) -> socket.socket:
    """The lifecycle socket, listening: bound by the first process before it starts any
    worker, so that no process of this front answers /readyz while the socket the preStop
    hook polls is not there yet (a hook that found it closed would stop vLLM at once). Not
    inheritable (PEP 446): the workers never hold it, so it closes when this process ends."""
    host, port = parse_listen(listen)
    return socket.create_server((host, port))


async def _hold_lifecycle(sock: socket.socket) -> asyncio.AbstractServer:
    """Accept and close each connection on the lifecycle socket for as long as this process
    lives: the vllm container's preStop hook polls it, so vLLM is stopped only once the
    front has drained (the kernel closes it when the process exits, however it ends)."""

    async def close(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    return await asyncio.start_server(close, sock=sock)


async def _run(
    settings: FrontSettings,
    secret: bytes | None,
    reuse_port: bool,
    children: Sequence[multiprocessing.process.BaseProcess] = (),
    lifecycle_sock: socket.socket | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT, then stop without dropping a request.

    Kubernetes stops a pod by marking it not Ready and sending SIGTERM, and the picker and
    the Gateway learn of it a little later. So the front first goes lame duck: it keeps
    serving for `lame_duck_seconds`, answering every response with `Connection: close` (so
    clients leave its keep-alive connections between requests, not in the middle of one)
    and /readyz with 503; then it stops listening and waits up to
    `SHUTDOWN_TIMEOUT_SECONDS` for every request in flight, streams included. The first
    process (the one that holds the lifecycle socket) tells the others at once and outlives
    them."""
    cache = PromptEmbedsCache(settings.cache_capacity_bytes)
    runner = create_runner(
        settings, secret=secret, cache=cache, shutdown_timeout=SHUTDOWN_TIMEOUT_SECONDS
    )
    await runner.setup()
    host, port = parse_listen(settings.listen)
    site = listening_site(runner, host, port, reuse_port=reuse_port)
    await site.start()
    heap.freeze(collect=True)  # what start-up made, out of the collector's full passes
    lifecycle = None if lifecycle_sock is None else await _hold_lifecycle(lifecycle_sock)
    log.info(
        "cache front listening on %s, forwarding to %s (isolation %s, prompt-embeds cache "
        "%s bytes)",
        settings.listen,
        settings.upstream_base,
        settings.isolation_mode.value,
        settings.cache_capacity_bytes,
    )
    stop = stop_event()
    stop_when_orphaned(stop, "a cache-front worker")
    try:
        await stop.wait()
        for child in children:
            child.terminate()  # each goes lame duck now too, not after this one drained
        runner.front.state.draining = True
        if settings.lame_duck_seconds > 0:
            log.info("cache front stopping: lame duck for %.0f s", settings.lame_duck_seconds)
            await asyncio.sleep(settings.lame_duck_seconds)
    finally:
        log.info("cache front stopping: draining the requests in flight")
        await runner.cleanup()
        for child in children:
            await asyncio.to_thread(child.join, SHUTDOWN_TIMEOUT_SECONDS)
        if lifecycle is not None:
            lifecycle.close()
        log.info("cache front stopped")


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


def _serve_loop(
    settings: FrontSettings,
    secret: bytes | None,
    reuse_port: bool,
    children: Sequence[multiprocessing.process.BaseProcess] = (),
    lifecycle_sock: socket.socket | None = None,
) -> None:
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(
            _run(settings, secret, reuse_port, children=children, lifecycle_sock=lifecycle_sock)
        )


def _child(settings: FrontSettings, secret: bytes | None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    _serve_loop(settings, secret, reuse_port=True)


def serve(settings: FrontSettings) -> int:
    """Run until SIGTERM/SIGINT; return the process exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        secret = read_mounted_salt_key(settings)
    except SettingsError as exc:
        print(f"promptcache front: {exc}", file=sys.stderr)
        return 2
    children: list[multiprocessing.process.BaseProcess] = []
    try:
        lifecycle = (
            _lifecycle_socket(settings.lifecycle_listen) if settings.lifecycle_listen else None
        )
        ctx = multiprocessing.get_context("spawn")
        for _ in range(settings.workers - 1):
            child = ctx.Process(target=_child, args=(settings, secret))  # may start JSON workers
            child.start()
            children.append(child)
        _serve_loop(
            settings, secret, settings.workers > 1, children=children, lifecycle_sock=lifecycle
        )
    except OSError as exc:
        print(
            f"promptcache front: cannot listen on {settings.listen}"
            + (f" or {settings.lifecycle_listen}" if settings.lifecycle_listen else "")
            + f": {exc.strerror}",
            file=sys.stderr,
        )
        return 1
    finally:
        # not daemonic (they start JSON workers): ended here, never waited for forever
        stop_processes(children, SHUTDOWN_TIMEOUT_SECONDS)
    return 0

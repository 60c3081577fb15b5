"""The front's HTTP server: aiohttp's low-level server with the front's handler, its error
answers for what the parser refuses, the runner that closes the front's pools, and the
listening site (`create_runner`, `listening_site`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Final, cast

from aiohttp import web

from promptcache.embeds.cache import PromptEmbedsCache
from promptcache.front.app import handle
from promptcache.front.metrics import FrontMetrics
from promptcache.front.pool import UpstreamPool
from promptcache.front.refusals import json_error, parse_refusal
from promptcache.front.settings import FrontSettings
from promptcache.front.state import FrontState
from promptcache.front.upstream import (
    bound_send_buffer,
)
from promptcache.tenancy.attestation import Attester, ReplayGuard
from promptcache.tenancy.fair_share import FairShare
from promptcache.tenancy.identity import identity_enabled
from promptcache.tenancy.prediction import PredictionReader

log = logging.getLogger("promptcache.front")

CONNECT_TIMEOUT_SECONDS: Final = 10.0
JSON_POOL_STOP_SECONDS: Final = 10.0
"""How long stopping waits for the JSON workers to finish their jobs and exit."""
LINGER_SECONDS: Final = 2.0
"""aiohttp drains an unread request body this long before closing (its default: 10 s)."""


def server_options(settings: FrontSettings) -> dict[str, Any]:
    """How the front's HTTP server is built (aiohttp `RequestHandler` options).

    aiohttp's keep-alive timer runs from the moment a connection opens (or its
    last answer ends) and closes the connection if no complete request head
    arrived by then, whatever bytes trickled in: that is the header timeout.
    `handler_cancellation`: a client that leaves cancels its handler, which
    closes the upstream connection, which makes vLLM abort the request. After
    refusing a body unread, the front drains it for at most `LINGER_SECONDS`
    (so the client can read the error) and then closes. No access log (one log
    line per request costs more CPU than the front's own checks), and request
    bodies are never decompressed (any Content-Encoding is refused anyway).
    """
    return {
        "handler_cancellation": True,
        "access_log": None,
        "keepalive_timeout": settings.header_timeout_seconds,
        "lingering_time": LINGER_SECONDS,
        "auto_decompress": False,
    }


class FrontRequestHandler(web.RequestHandler):
    """aiohttp's connection handler, answering what its HTTP parser refuses as the front does.

    A request line or header block aiohttp's parser cannot accept (bad method or
    version, a non-ASCII target, an invalid header byte, a duplicate
    Content-Length, oversized lines, too many headers) never reaches `handle`:
    aiohttp answers it from `handle_error` with a plain-text 400. This override
    gives it the front's JSON error with a stable code, counted like every other
    refusal; an unexpected failure inside the front becomes a JSON 500
    `internal_error` (logged with its traceback, never sent to the client).
    """

    def __init__(self, manager: web.Server, *, state: FrontState, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._front_state = state

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # uvloop's transports implement the interface without subclassing it
        bound_send_buffer(
            cast(asyncio.Transport, transport), self._front_state.settings.send_buffer_bytes
        )

    def _process_keepalive(self) -> None:
        """aiohttp's header (and idle keep-alive) deadline, counted when it closes one."""
        was_closing = self._force_close
        super()._process_keepalive()
        if self._force_close and not was_closing:
            self._front_state.metrics.deadline_fired("header")

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        error = parse_refusal(status, exc)
        if error.status >= 500:
            log.error("the cache front failed on a request", exc_info=exc)
        else:
            log.debug("refused a malformed request: %s", exc)
        if request.writer.output_size > 0:
            # an answer already started: cut the connection (aiohttp's behaviour)
            raise ConnectionError("the answer was already started; closing the connection")
        metrics = self._front_state.metrics
        if error.status < 500:
            metrics.refuse(error.code)
        metrics.answered("unknown", error.status)
        response = json_error(error)
        response.force_close()
        return response


class FrontServer(web.Server):
    """aiohttp's low-level server with the front's handler and error answers.

    No `web.Application`: the front has one handler for every target (the route
    table in `routes.py` decides, on the raw target), so aiohttp's router,
    middleware chain and app signals would only cost time per request.
    """

    def __init__(self, state: FrontState, **kwargs: Any) -> None:
        self.state = state
        self._handler_kwargs = {
            k: v for k, v in kwargs.items() if k not in ("handler_cancellation",)
        }
        super().__init__(
            partial(handle, state),
            handler_cancellation=kwargs.get("handler_cancellation", False),
            **self._handler_kwargs,
        )

    def __call__(self) -> web.RequestHandler:
        return FrontRequestHandler(
            self, state=self.state, loop=asyncio.get_running_loop(), **self._handler_kwargs
        )


class FrontRunner(web.ServerRunner):
    """Runs a `FrontServer`; cleaning up also closes the upstream pool and decode threads."""

    def __init__(self, server: FrontServer, **kwargs: Any) -> None:
        super().__init__(server, **kwargs)
        self.front = server

    async def cleanup(self) -> None:
        await super().cleanup()
        state = self.front.state
        if state.pool is not None:
            state.pool.close()
        state.executor.shutdown(wait=False, cancel_futures=True)
        # Waited for: a front started as a multiprocessing child (`--workers`) runs its
        # exit finalizers right after this returns, which stop the pool's queue feeder
        # before a shutdown that does not wait has sent its workers their stop sentinels;
        # the workers then never exit and the child hangs joining them (seen).
        stopping = asyncio.get_running_loop().run_in_executor(None, state.drop_json_pool, True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping, JSON_POOL_STOP_SECONDS)


def create_state(
    settings: FrontSettings, *, secret: bytes | None, cache: PromptEmbedsCache
) -> FrontState:
    """Everything the handlers share; `secret` must be set in a salting mode."""
    if settings.needs_salt_key and not secret:
        raise ValueError(f"isolation mode {settings.isolation_mode.value} needs a salt key")
    state = FrontState(
        settings=settings,
        secret=secret,
        cache=cache,
        metrics=FrontMetrics(cache.stats),
        executor=ThreadPoolExecutor(
            max_workers=settings.decode_workers, thread_name_prefix="promptcache-decode"
        ),
        pool=UpstreamPool(
            settings.upstream_base,
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
            read_timeout=settings.upstream_timeout_seconds,
        ),
    )
    state.fair_share = FairShare(
        settings.fair_share_bytes_per_second, on_wait=state.metrics.waited_for_share
    )
    if identity_enabled(settings) and secret:
        state.attester = Attester(secret, settings.isolation_header, guard=ReplayGuard())
    if secret:
        state.predictions = PredictionReader(secret)
    # read at scrape time: no gauge update (and its lock) on every request
    state.metrics.in_flight.set_function(lambda: state.in_flight)
    return state


def create_runner(
    settings: FrontSettings,
    *,
    secret: bytes | None,
    cache: PromptEmbedsCache,
    **runner_kwargs: Any,
) -> FrontRunner:
    """The front, ready for `await runner.setup()` and a site (call in a running loop).

    runner = create_runner(settings, secret=secret, cache=cache)
    await runner.setup()
    await listening_site(runner, "0.0.0.0", 8000).start()
    """
    state = create_state(settings, secret=secret, cache=cache)
    return FrontRunner(FrontServer(state, **server_options(settings)), **runner_kwargs)


LISTEN_BACKLOG: Final = 4096
"""Connections the kernel completes and queues for the front before it accepts them (the
kernel caps it at `net.core.somaxconn`, 4096 by default). aiohttp's default is 128: under
a client's reconnect storm (`bench/hostile_load.py --attacks hold` opens 256 connections at
once, and its refused ones come back together each `Retry-After`) the queue overflowed
whenever the loop was a moment late, the kernel dropped the next handshakes, and another
tenant's new connection waited for TCP's retransmissions (1 s, then 3 s, then 7 s): the
multi-second tails of the well-behaved tenants under that attack (`TcpExtListenOverflows`
counted them). A queued connection costs the kernel a socket, no slot or byte of ours."""


def listening_site(
    runner: web.BaseRunner, host: str | None, port: int, *, reuse_port: bool = False
) -> web.TCPSite:
    """Where the front listens: a TCP site with `LISTEN_BACKLOG` (start it with
    `await site.start()`)."""
    return web.TCPSite(runner, host, port, backlog=LISTEN_BACKLOG, reuse_port=reuse_port or None)

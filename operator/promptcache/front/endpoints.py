"""The front's own paths: `/metrics` (vLLM's exposition merged with the front's), `/healthz`
and `/readyz`, keyed by path in `FRONT_HANDLERS`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web

from promptcache.contract import FRONT_HEALTH_PATH, FRONT_READY_PATH
from promptcache.front.metrics import CONTENT_TYPE, merge_expositions
from promptcache.front.pool import UpstreamError
from promptcache.front.state import Charge, FrontState
from promptcache.tenancy.routes import (
    METRICS_PATH,
)

PROBE_SECONDS: Final = 5.0
"""How long /metrics and /readyz wait for vLLM's own /metrics and /health."""
MAX_UPSTREAM_METRICS_BYTES: Final = 64 * 1024 * 1024


async def _probe(state: FrontState, path: str) -> tuple[int, bytes]:
    """GET one of vLLM's own paths (metrics, health) within `PROBE_SECONDS`."""
    assert state.pool is not None
    async with asyncio.timeout(PROBE_SECONDS):
        answer = await state.pool.request("GET", path, [("Accept-Encoding", "identity")], b"")
        try:
            body = await answer.read(MAX_UPSTREAM_METRICS_BYTES)
        finally:
            answer.release()
    return answer.status, body


async def metrics(request: web.BaseRequest, state: FrontState) -> web.Response:
    """vLLM's metrics followed by the front's, for the Endpoint Picker's scrape (vLLM's
    exposition is held whole to merge it: counted in the memory budget meanwhile)."""
    upstream: bytes | None = None
    charge = Charge(state)
    try:
        try:
            status, body = await _probe(state, METRICS_PATH)
            charge.hold(len(body))
            if status == 200 and len(body) <= MAX_UPSTREAM_METRICS_BYTES:
                upstream = body
        except (UpstreamError, TimeoutError):
            upstream = None
        state.metrics.upstream_metrics_up.set(1 if upstream is not None else 0)
        merged = merge_expositions(upstream, state.metrics.render())
    finally:
        charge.release()
    return web.Response(body=merged, headers={"Content-Type": CONTENT_TYPE})


async def healthz(request: web.BaseRequest, state: FrontState) -> web.Response:
    """Liveness: the front's event loop answers, and its workers make progress.

    Answering at all proves the loop is not wedged (the kubelet's timeout catches that).
    A loop that answers while a decode thread or JSON worker never finishes (a hung
    decoder, a deadlock) serves nothing that needs one and would never be restarted: an
    unfinished job older than `stuck_after` (far beyond any admitted job, queue
    included, so load alone never fails it) fails the probe. Nothing here waits on
    vLLM or on a worker: the answer itself takes microseconds, under attack too.
    """
    oldest = state.oldest_job_seconds()
    if oldest > state.stuck_after:
        return web.json_response(
            {
                "status": "stuck",
                "reason": f"a decode or JSON job has not finished for {oldest:.0f} s "
                f"(limit {state.stuck_after:g} s)",
            },
            status=503,
        )
    return web.json_response({"status": "ok"})


async def readyz(request: web.BaseRequest, state: FrontState) -> web.Response:
    """Readiness: vLLM behind the front answers its /health with 200, and the front is not
    stopping."""
    if state.draining:
        return web.json_response({"status": "not ready", "reason": "stopping"}, status=503)
    try:
        status, _ = await _probe(state, "/health")
    except (UpstreamError, TimeoutError) as exc:
        return web.json_response(
            {"status": "not ready", "reason": f"model server unreachable: {type(exc).__name__}"},
            status=503,
        )
    if status != 200:
        return web.json_response(
            {"status": "not ready", "reason": f"model server /health answered {status}"},
            status=503,
        )
    return web.json_response({"status": "ready"})


FRONT_HANDLERS: Final[
    dict[str, Callable[[web.BaseRequest, FrontState], Awaitable[web.StreamResponse]]]
] = {
    METRICS_PATH: metrics,
    FRONT_HEALTH_PATH: healthz,
    FRONT_READY_PATH: readyz,
}

"""Forwarding a checked request to vLLM under the front's concurrency cap, and counting the
vLLM controls a client sent that the front did not forward.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from promptcache.contract.front import VLLM_PRIORITY_HEADER, VLLM_REQUEST_ID_HEADER
from promptcache.front.hits import Tally
from promptcache.front.state import Charge, FrontState
from promptcache.front.upstream import (
    forward,
)
from promptcache.tenancy import errors
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.routes import (
    Route,
    Target,
)
from promptcache.tenancy.shares import Verdict, share_refusal


def count_controls(state: FrontState, headers: CIMultiDictProxy[str]) -> None:
    """Count the vLLM controls the client sent that the front did not forward."""
    if VLLM_REQUEST_ID_HEADER in headers:
        state.metrics.control_removed(VLLM_REQUEST_ID_HEADER)
    if not state.settings.allow_client_priority and VLLM_PRIORITY_HEADER in headers:
        state.metrics.control_removed(VLLM_PRIORITY_HEADER)


async def admitted(
    request: web.BaseRequest,
    state: FrontState,
    route: Route,
    target: Target,
    *,
    data: bytes,
    headers: CIMultiDict[str],
    strip_usage: bool,
    charge: Charge,
    tally: Tally | None = None,
) -> web.StreamResponse:
    """Forward under the concurrency cap (bodies are read before a slot is taken); the
    answer is sent inside the slot, under the write deadline."""
    slots, key = state.slots, charge.key
    verdict = slots.take(key, 1)
    if verdict is Verdict.OVER_SHARE:
        state.metrics.share_refused("slots")
        raise share_refusal("concurrency slots", slots.held(key), slots.share)
    if verdict is not Verdict.TAKE:
        cap = state.settings.max_in_flight
        raise FrontError(
            503,
            errors.FRONT_OVERLOADED,
            f"the cache front is already working on {cap} requests; retry shortly",
        )
    try:
        return await forward(
            request, state, route, target, data=data, headers=headers, strip_usage=strip_usage,
            charge=charge, tally=tally,
        )  # fmt: skip
    except asyncio.CancelledError:
        state.metrics.client_disconnects.inc()
        raise
    finally:
        slots.give(key, 1)

"""Forwarding one rewritten request to vLLM and passing its answer back.

Status and body of vLLM's answer pass through unchanged; streamed answers are
copied as they arrive (SSE through the usage relay), never held whole.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator
from typing import Final

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from promptcache.contract.front import VLLM_PRIORITY_HEADER, VLLM_REQUEST_ID_HEADER
from promptcache.front import errors
from promptcache.front.errors import FrontError
from promptcache.front.pool import (
    UpstreamAnswer,
    UpstreamConnectError,
    UpstreamError,
    UpstreamTimeoutError,
)
from promptcache.front.routes import Route, Target
from promptcache.front.settings import FrontSettings
from promptcache.front.state import FrontState
from promptcache.front.usage import SseRelay, relay, usage_from, usage_headers

log = logging.getLogger("promptcache.front")

MAX_BUFFERED_RESPONSE_BYTES: Final = 16 * 1024 * 1024
"""Non-streamed JSON answers up to this size are read whole to find their usage;
larger ones stream through without usage headers."""
_HOP_BY_HOP: Final[frozenset[str]] = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "content-encoding",
        "accept-encoding",
        "expect",  # the front has read the body already
    }
)


_HOP_BY_HOP_ANSWER: Final[frozenset[str]] = _HOP_BY_HOP | {"date", "server"}
"""aiohttp writes its own Date and Server; Content-Encoding is put back when vLLM used one."""


def new_request_id() -> str:
    """A fresh id for vLLM's `X-Request-Id` (vLLM's own format: 32 hex digits)."""
    return os.urandom(16).hex()


def forward_headers(
    headers: CIMultiDictProxy[str], settings: FrontSettings, json_body: bool, request_id: str
) -> CIMultiDict[str]:
    """The client's headers for vLLM, minus hop-by-hop ones, the isolation key and the
    controls vLLM reads that a tenant must not set.

    `X-Request-Id` becomes vLLM's request id (its engine id, logs, the answer's `id`; ids
    are also what vLLM aborts by), so the client's is replaced by `request_id`, fresh per
    request. `X-Vllm-Priority` overrides the body's priority in vLLM's queue: removed
    unless the deployment allows client priorities.
    """
    out: CIMultiDict[str] = CIMultiDict()
    drop = _HOP_BY_HOP | {settings.isolation_header.lower(), VLLM_REQUEST_ID_HEADER}
    if not settings.allow_client_priority:
        drop = drop | {VLLM_PRIORITY_HEADER}
    for name, value in headers.items():
        if name.lower() not in drop:
            out.add(name, value)
    if json_body:
        out["Content-Type"] = "application/json"
    out["Accept-Encoding"] = "identity"
    out["X-Request-Id"] = request_id
    return out


def _response_headers(answer: UpstreamAnswer) -> CIMultiDict[str]:
    """vLLM's headers for the client, minus hop-by-hop ones (aiohttp sets its own)."""
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in answer.headers:
        lower = name.lower()
        if lower not in _HOP_BY_HOP_ANSWER:
            out.add(name, value)
    return out


async def forward(
    request: web.BaseRequest,
    state: FrontState,
    route: Route,
    target: Target,
    *,
    data: bytes,
    headers: CIMultiDict[str],
    strip_usage: bool,
) -> web.StreamResponse:
    assert state.pool is not None
    # exactly the target that was checked, byte for byte
    try:
        answer = await state.pool.request(request.method, target.raw, list(headers.items()), data)
    except UpstreamError as exc:
        raise _upstream_refusal(state, route, exc) from None
    try:
        request_id = headers.get("X-Request-Id", "")
        return await _relay(
            request, state, route, answer, strip_usage=strip_usage, request_id=request_id
        )
    except UpstreamError as exc:
        raise _upstream_refusal(state, route, exc) from None
    finally:
        answer.release()


def _upstream_refusal(state: FrontState, route: Route, exc: UpstreamError) -> FrontError:
    """What the client is told when vLLM fails, before or while answering (counted by kind;
    a connection refused is a restart to retry, silence a timeout, anything else a 502)."""
    settings = state.settings
    if isinstance(exc, UpstreamConnectError):
        state.metrics.upstream_errors.labels(kind="connect").inc()
        log.warning("model server unreachable at %s: %s", settings.upstream_base, exc)
        return FrontError(
            503,
            errors.UPSTREAM_UNAVAILABLE,
            f"the model server is not accepting connections ({exc}); "
            "it may be starting or restarting, retry shortly",
        )
    if isinstance(exc, UpstreamTimeoutError):
        state.metrics.upstream_errors.labels(kind="timeout").inc()
        return FrontError(
            504,
            errors.UPSTREAM_TIMEOUT,
            f"the model server sent nothing for {settings.upstream_timeout_seconds:g} seconds",
        )
    state.metrics.upstream_errors.labels(kind="failed").inc()
    log.warning("model server failed on %s: %s", route.path, exc)
    return FrontError(
        502, errors.UPSTREAM_FAILED, f"the model server failed while answering: {exc}"
    )


async def _relay(
    request: web.BaseRequest,
    state: FrontState,
    route: Route,
    answer: UpstreamAnswer,
    *,
    strip_usage: bool,
    request_id: str,
) -> web.StreamResponse:
    settings = state.settings
    headers = _response_headers(answer)
    headers["X-Request-Id"] = request_id  # the id vLLM knows this request by
    content_type = answer.header("content-type") or ""
    encoding = answer.header("content-encoding")
    encoded = encoding is not None and encoding.lower() != "identity"
    if encoding is not None and encoded:
        headers["Content-Encoding"] = encoding  # relayed as vLLM sent it, never inspected
    usage_path = route.usage_stream and not encoded
    if content_type.startswith("text/event-stream"):
        response = web.StreamResponse(status=answer.status, reason=answer.reason, headers=headers)
        await response.prepare(request)
        chunks: AsyncIterator[bytes] = answer.chunks()
        sse: SseRelay | None = None
        if usage_path:
            sse = SseRelay(
                strip_usage_chunk=strip_usage,
                prompt_header=settings.prompt_tokens_header,
                cached_header=settings.cached_prompt_tokens_header,
            )
            chunks = relay(chunks, sse)
        await _pump(request, state, response, chunks, sse=True)
        if sse is not None and sse.usage is not None:
            state.metrics.observe_usage(sse.usage.prompt_tokens, sse.usage.cached_tokens)
        return response
    length_text = answer.header("content-length")
    length = int(length_text) if length_text is not None else None
    if (
        usage_path
        and content_type.startswith("application/json")
        and (length is None or length <= MAX_BUFFERED_RESPONSE_BYTES)
    ):
        body = await answer.read(MAX_BUFFERED_RESPONSE_BYTES)
        if len(body) <= MAX_BUFFERED_RESPONSE_BYTES:
            if 200 <= answer.status < 300:
                try:
                    usage = usage_from(json.loads(body))
                except ValueError:
                    usage = None
                if usage is not None:
                    state.metrics.observe_usage(usage.prompt_tokens, usage.cached_tokens)
                    headers.update(
                        usage_headers(
                            usage,
                            settings.prompt_tokens_header,
                            settings.cached_prompt_tokens_header,
                        )
                    )
            return web.Response(
                status=answer.status, reason=answer.reason, body=body, headers=headers
            )
        prefix = body
    elif length is not None and length <= MAX_BUFFERED_RESPONSE_BYTES:
        # a small answer (an error, a model list): one piece, no stream
        body = await answer.read(length)
        return web.Response(status=answer.status, reason=answer.reason, body=body, headers=headers)
    else:
        prefix = b""
    response = web.StreamResponse(status=answer.status, reason=answer.reason, headers=headers)
    await response.prepare(request)
    if prefix:
        await response.write(prefix)
    await _pump(request, state, response, answer.chunks(), sse=False)
    return response


def stream_error_event(error: FrontError) -> bytes:
    """An SSE event carrying the front's JSON error: how a stream says it failed."""
    return b"\n\ndata: " + error.body_bytes() + b"\n\n"


async def _pump(
    request: web.BaseRequest,
    state: FrontState,
    response: web.StreamResponse,
    chunks: AsyncIterator[bytes],
    *,
    sse: bool,
) -> None:
    """Copy an upstream body to the client as it arrives, never holding it whole.

    Headers are already sent, so a failure here cannot become an error response. A
    stream (SSE) that vLLM breaks off ends with an error event in the front's JSON error
    shape and no `[DONE]`, so a client knows it failed rather than reading a silent
    truncation (the real engine showed this on `kill -9`); any other body is cut (a
    truncated body, not a complete-looking one). A client that left ends the upstream
    request.
    """
    try:
        async for chunk in chunks:
            await response.write(chunk)
    except UpstreamError as exc:
        state.metrics.upstream_errors.labels(kind="interrupted").inc()
        if sse:
            error = FrontError(
                502, errors.UPSTREAM_FAILED, f"the model server failed while streaming: {exc}"
            )
            try:
                await response.write(stream_error_event(error))
                await response.write_eof()
            except ConnectionResetError:
                state.metrics.client_disconnects.inc()
            return
        if request.transport is not None:
            request.transport.close()
        return
    except ConnectionResetError:
        state.metrics.client_disconnects.inc()
        return
    await response.write_eof()

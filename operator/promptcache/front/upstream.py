"""Forwarding one rewritten request to vLLM and passing its answer back.

Status and body of vLLM's answer pass through unchanged; streamed answers are
copied as they arrive (SSE through the usage relay), never held whole. Every answer
is charged to the request's memory budget for what the front holds of it: whole, before
it is read; streamed, piece by piece (`MemoryScope.hold`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import Final

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from promptcache.contract import IDENTITY_ATTESTATION_HEADER, PREDICTED_MATCH_HEADER
from promptcache.contract.front import VLLM_PRIORITY_HEADER, VLLM_REQUEST_ID_HEADER
from promptcache.front.hits import Tally
from promptcache.front.pool import (
    HIGH_WATER,
    UpstreamAnswer,
    UpstreamConnectError,
    UpstreamError,
    UpstreamTimeoutError,
)
from promptcache.front.settings import FrontSettings
from promptcache.front.state import FrontState, MemoryScope
from promptcache.front.usage import SseRelay, Usage, relay, usage_headers, usage_of_json
from promptcache.tenancy import errors
from promptcache.tenancy.canonical import json_charge
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.routes import Route, Target

log = logging.getLogger("promptcache.front")

MAX_BUFFERED_RESPONSE_BYTES: Final = 16 * 1024 * 1024
"""Non-streamed JSON answers up to this size are read whole (charged to the memory
budget) to find their usage; larger ones stream through without usage headers."""
SMALL_ANSWER_BYTES: Final = 64 * 1024
"""Other answers up to this size are read in one piece; larger ones (pooling,
embeddings) are streamed to the client as they arrive, never held whole."""
OFFLOAD_ANSWER_BYTES: Final = 256 * 1024
"""Buffered answers this large have their usage parsed off the event loop."""
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
    """The client's headers for vLLM, minus hop-by-hop ones, the isolation key, the
    identity header and the step's attestation, the picker's prediction, and the controls
    vLLM reads that a tenant must not set.

    `X-Request-Id` becomes vLLM's request id (its engine id, logs, the answer's `id`; ids
    are also what vLLM aborts by), so the client's is replaced by `request_id`, fresh per
    request. `X-Vllm-Priority` overrides the body's priority in vLLM's queue: removed
    unless the deployment allows client priorities.
    """
    out: CIMultiDict[str] = CIMultiDict()
    drop = _HOP_BY_HOP | {
        settings.isolation_header.lower(),
        VLLM_REQUEST_ID_HEADER,
        IDENTITY_ATTESTATION_HEADER,  # the account is the salt's business, not vLLM's
        PREDICTED_MATCH_HEADER,  # the picker's prediction is counted here, never forwarded
        settings.identity_header.lower(),
    }
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


def _answer(
    state: FrontState, answer: UpstreamAnswer, headers: CIMultiDict[str]
) -> web.StreamResponse:
    """The response relaying vLLM's answer; while the front is stopping it says
    `Connection: close` (set before the head is sent), so the client leaves this pod."""
    response = web.StreamResponse(status=answer.status, reason=answer.reason, headers=headers)
    if state.draining:
        response.force_close()
    return response


async def forward(
    request: web.BaseRequest,
    state: FrontState,
    route: Route,
    target: Target,
    *,
    data: bytes,
    headers: CIMultiDict[str],
    strip_usage: bool,
    charge: MemoryScope,
    tally: Tally | None = None,
) -> web.StreamResponse:
    """Send the request to vLLM and relay its answer; `tally` is what the request's usage
    is counted with (`front.hits`)."""
    assert state.pool is not None
    # exactly the target that was checked, byte for byte
    try:
        answer = await state.pool.request(request.method, target.raw, list(headers.items()), data)
    except UpstreamError as exc:
        raise _upstream_refusal(state, route, exc) from None
    try:
        request_id = headers.get("X-Request-Id", "")
        return await _relay(
            request, state, route, answer, strip_usage=strip_usage, request_id=request_id,
            charge=charge, tally=tally,
        )  # fmt: skip
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
    charge: MemoryScope,
    tally: Tally | None,
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
        response = _answer(state, answer, headers)
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
        await _pump(request, state, response, chunks, charge=charge, sse=sse, events=True)
        if sse is not None and sse.usage is not None:
            state.metrics.observe_usage(sse.usage.prompt_tokens, sse.usage.cached_tokens, tally)
        return response
    length_text = answer.header("content-length")
    length = int(length_text) if length_text is not None else None
    if (
        usage_path
        and content_type.startswith("application/json")
        and (length is None or length <= MAX_BUFFERED_RESPONSE_BYTES)
    ):
        held = length if length is not None else MAX_BUFFERED_RESPONSE_BYTES
        charge.take(held)  # the answer, held to read its usage (until the request ends)
        body = await answer.read(MAX_BUFFERED_RESPONSE_BYTES)
        if len(body) <= MAX_BUFFERED_RESPONSE_BYTES:
            if 200 <= answer.status < 300:
                usage = await _usage_of(state, charge, body)
                if usage is not None:
                    state.metrics.observe_usage(usage.prompt_tokens, usage.cached_tokens, tally)
                    headers.update(
                        usage_headers(
                            usage,
                            settings.prompt_tokens_header,
                            settings.cached_prompt_tokens_header,
                        )
                    )
            return await _send_whole(request, state, answer, headers, body)
        prefix = body  # longer than announced: the rest is streamed after it
    elif length is not None and length <= SMALL_ANSWER_BYTES:
        # a small answer (an error, a model list): one piece, charged while it is held
        charge.take(length)
        body = await answer.read(length)
        return await _send_whole(request, state, answer, headers, body)
    else:
        held, prefix = 0, b""  # large (pooling, embeddings) or of unknown length: streamed
    response = _answer(state, answer, headers)
    await response.prepare(request)
    if prefix and not await _write(request, state, response, prefix):
        return response
    charge.give_back(held)
    await _pump(request, state, response, answer.chunks(), charge=charge, sse=None)
    return response


async def _usage_of(state: FrontState, charge: MemoryScope, body: bytes) -> Usage | None:
    """The usage of a buffered JSON answer; a large one is parsed in a JSON worker process
    (in a thread, the C parser held the GIL the loop needs for the whole answer: up to
    16 MiB, a tenant can ask for one with logprobs or echo)."""
    if len(body) < OFFLOAD_ANSWER_BYTES:
        return usage_of_json(body)
    cost = json_charge(body) + len(body)  # the worker's copy and its parse
    charge.take(cost)
    try:
        return await state.submit(state.json_pool(), partial(usage_of_json, body))
    except BrokenProcessPool:
        state.drop_json_pool()
        return None  # the usage headers are missing; the answer itself is intact
    finally:
        charge.give_back(cost)


def bound_send_buffer(transport: asyncio.Transport, limit: int) -> None:
    """At most `limit` answer bytes queued for this client (in the transport and in the
    kernel's socket buffer each) before writes wait for it to read: set once per client
    connection, when it opens (a setsockopt per answer would cost two syscalls each)."""
    transport.set_write_buffer_limits(high=limit)
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, limit)


_LAST_CHUNK_BYTES: Final = 5
"""What ending a chunked answer writes (`0\\r\\n\\r\\n`)."""


def _cannot_wait(request: web.BaseRequest, size: int) -> bool:
    """Whether writing `size` bytes now cannot wait for the client, so needs no deadline.

    A write waits only when the transport's buffer ends above its high-water mark (the
    send-buffer limit, `bound_send_buffer`): aiohttp's drain returns at once unless the
    transport paused writing. With nothing queued and `size` under that mark it cannot get
    there. That is nearly every write to a client that keeps up, and it spares a timer per
    SSE event."""
    transport = request.transport
    return (
        transport is not None
        and transport.get_write_buffer_size() == 0
        and size <= transport.get_write_buffer_limits()[1]
    )


async def _write(
    request: web.BaseRequest, state: FrontState, response: web.StreamResponse, data: bytes
) -> bool:
    """Write under the write deadline; a client that does not read in time is cut off
    (False), which ends the handler and frees its concurrency slot."""
    if _cannot_wait(request, len(data)):
        await response.write(data)
        return True
    try:
        async with asyncio.timeout(state.settings.write_timeout_seconds):
            await response.write(data)
    except TimeoutError:
        state.metrics.write_timeouts.inc()
        state.metrics.deadline_fired("write")
        if request.transport is not None:
            request.transport.abort()
        return False
    return True


async def _send_whole(
    request: web.BaseRequest,
    state: FrontState,
    answer: UpstreamAnswer,
    headers: CIMultiDict[str],
    body: bytes,
) -> web.StreamResponse:
    """A body read whole, sent inside the handler (under the write deadline and the
    concurrency slot) rather than by aiohttp after it returns.

    Head and body leave in one write (`web.Response` holds its head until the body is
    written), so the client's kernel and event loop wake once per answer, not twice; on
    shared cores each wake-up is CPU a model server does not get."""
    response = web.Response(body=body, status=answer.status, reason=answer.reason, headers=headers)
    if state.draining:
        response.force_close()  # as `_answer` does: the client leaves a stopping pod
    await response.prepare(request)
    await _finish(request, state, response, len(body))
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
    charge: MemoryScope,
    sse: SseRelay | None,
    events: bool = False,
) -> None:
    """Copy an upstream body to the client as it arrives, never holding it whole.

    What is held at a time is counted in the request's charge (`MemoryScope.hold`: headers
    are sent, so never refused here): the upstream connection's read-ahead (up to
    `pool.HIGH_WATER`), the piece being written, and `sse`'s incomplete event.

    Headers are already sent, so a failure here cannot become an error response. A
    stream (`events`: SSE) that vLLM breaks off ends with an error event in the front's
    JSON error shape and no `[DONE]`, so a client knows it failed rather than reading a
    silent truncation (the real engine showed this on `kill -9`); any other body is cut
    (a truncated body, not a complete-looking one). A client that left ends the upstream
    request.
    """
    read_ahead = HIGH_WATER
    charge.hold(read_ahead)
    pending = 0
    try:
        async for chunk in chunks:
            if sse is not None:
                charge.hold(sse.pending_bytes - pending)
                pending = sse.pending_bytes
            charge.hold(len(chunk))
            try:
                if not await _write(request, state, response, chunk):
                    return
            finally:
                charge.give_back(len(chunk))
    except UpstreamError as exc:
        state.metrics.upstream_errors.labels(kind="interrupted").inc()
        if events:
            error = FrontError(
                502, errors.UPSTREAM_FAILED, f"the model server failed while streaming: {exc}"
            )
            try:
                if await _write(request, state, response, stream_error_event(error)):
                    await _finish(request, state, response)
            except ConnectionResetError:
                state.metrics.client_disconnects.inc()
            return
        if request.transport is not None:
            request.transport.close()
        return
    except ConnectionResetError:
        state.metrics.client_disconnects.inc()
        return
    finally:
        charge.give_back(read_ahead + pending)
    await _finish(request, state, response)


async def _finish(
    request: web.BaseRequest, state: FrontState, response: web.StreamResponse, pending: int = 0
) -> None:
    """End the answer, under the write deadline too (ending flushes what is queued, and
    the `pending` body bytes a `web.Response` writes now)."""
    if _cannot_wait(request, pending + _LAST_CHUNK_BYTES):
        await response.write_eof()
        return
    try:
        async with asyncio.timeout(state.settings.write_timeout_seconds):
            await response.write_eof()
    except TimeoutError:
        state.metrics.write_timeouts.inc()
        state.metrics.deadline_fired("write")
        if request.transport is not None:
            request.transport.abort()

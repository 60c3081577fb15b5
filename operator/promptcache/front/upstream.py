"""Forwarding one rewritten request to vLLM and passing its answer back.

Status and body of vLLM's answer pass through unchanged; streamed answers are
copied as they arrive (SSE through the usage relay), never held whole.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Final

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from promptcache.front import errors
from promptcache.front.errors import FrontError
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
    }
)


def forward_headers(
    headers: CIMultiDictProxy[str], settings: FrontSettings, json_body: bool
) -> CIMultiDict[str]:
    """The client's headers for vLLM, minus hop-by-hop ones and the isolation key."""
    out: CIMultiDict[str] = CIMultiDict()
    drop = _HOP_BY_HOP | {settings.isolation_header.lower()}
    for name, value in headers.items():
        if name.lower() not in drop:
            out.add(name, value)
    if json_body:
        out["Content-Type"] = "application/json"
    out["Accept-Encoding"] = "identity"
    return out


def _response_headers(upstream: aiohttp.ClientResponse) -> CIMultiDict[str]:
    """vLLM's headers for the client, minus hop-by-hop ones (aiohttp sets its own)."""
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in upstream.headers.items():
        if name.lower() not in _HOP_BY_HOP and name.lower() not in ("date", "server"):
            out.add(name, value)
    return out


async def forward(
    request: web.Request,
    state: FrontState,
    route: Route,
    target: Target,
    *,
    data: bytes,
    headers: CIMultiDict[str],
    strip_usage: bool,
) -> web.StreamResponse:
    settings = state.settings
    assert state.session is not None
    # exactly the target that was checked: encoded=True keeps yarl from re-quoting it
    url = URL(settings.upstream_base + target.raw, encoded=True)
    try:
        async with state.session.request(
            request.method,
            url,
            data=data or None,
            headers=headers,
            allow_redirects=False,
        ) as upstream:
            return await _relay(request, state, route, upstream, strip_usage)
    except aiohttp.ClientConnectorError as exc:
        state.metrics.upstream_errors.labels(kind="connect").inc()
        log.warning("model server unreachable at %s: %s", settings.upstream_base, exc)
        raise FrontError(
            503,
            errors.UPSTREAM_UNAVAILABLE,
            f"the model server is not accepting connections ({exc.os_error.strerror or exc}); "
            "it may be starting or restarting, retry shortly",
        ) from None
    except TimeoutError:
        state.metrics.upstream_errors.labels(kind="timeout").inc()
        raise FrontError(
            504,
            errors.UPSTREAM_TIMEOUT,
            f"the model server sent nothing for {settings.upstream_timeout_seconds:g} seconds",
        ) from None
    except aiohttp.ClientError as exc:
        state.metrics.upstream_errors.labels(kind="failed").inc()
        log.warning("model server failed on %s: %r", route.path, exc)
        raise FrontError(
            502,
            errors.UPSTREAM_FAILED,
            f"the model server failed while answering: {type(exc).__name__}",
        ) from None


async def _relay(
    request: web.Request,
    state: FrontState,
    route: Route,
    upstream: aiohttp.ClientResponse,
    strip_usage: bool,
) -> web.StreamResponse:
    settings = state.settings
    headers = _response_headers(upstream)
    content_type = upstream.headers.get("Content-Type", "")
    usage_path = route.usage_stream
    if content_type.startswith("text/event-stream"):
        response = web.StreamResponse(
            status=upstream.status, reason=upstream.reason, headers=headers
        )
        await response.prepare(request)
        chunks: AsyncIterator[bytes] = upstream.content.iter_any()
        sse: SseRelay | None = None
        if usage_path:
            sse = SseRelay(
                strip_usage_chunk=strip_usage,
                prompt_header=settings.prompt_tokens_header,
                cached_header=settings.cached_prompt_tokens_header,
            )
            chunks = relay(chunks, sse)
        await _pump(request, state, response, chunks)
        if sse is not None and sse.usage is not None:
            state.metrics.observe_usage(sse.usage.prompt_tokens, sse.usage.cached_tokens)
        return response
    length = upstream.content_length
    if (
        usage_path
        and content_type.startswith("application/json")
        and (length is None or length <= MAX_BUFFERED_RESPONSE_BYTES)
    ):
        body = await upstream.content.read(MAX_BUFFERED_RESPONSE_BYTES + 1)
        if len(body) <= MAX_BUFFERED_RESPONSE_BYTES:
            if 200 <= upstream.status < 300:
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
                status=upstream.status, reason=upstream.reason, body=body, headers=headers
            )
        prefix = body
    else:
        prefix = b""
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
    await response.prepare(request)
    if prefix:
        await response.write(prefix)
    await _pump(request, state, response, upstream.content.iter_any())
    return response


async def _pump(
    request: web.Request,
    state: FrontState,
    response: web.StreamResponse,
    chunks: AsyncIterator[bytes],
) -> None:
    """Copy an upstream body to the client as it arrives, never holding it whole.

    Headers are already sent, so a failure here cannot become an error response:
    a vLLM failure cuts the client's connection (a truncated body, not a
    complete-looking one), and a client that left ends the upstream request.
    """
    try:
        async for chunk in chunks:
            await response.write(chunk)
    except aiohttp.ClientError:
        state.metrics.upstream_errors.labels(kind="interrupted").inc()
        if request.transport is not None:
            request.transport.close()
        return
    except ConnectionResetError:
        state.metrics.client_disconnects.inc()
        return
    await response.write_eof()

"""Reading a request body: under the size limit, the body-read cap, the timeout and the
memory budget, counted into the JSON scan as it arrives (`read_body`).
"""

from __future__ import annotations

import asyncio
from typing import Final

from aiohttp import web
from aiohttp.http_exceptions import (
    HttpProcessingError,
)
from aiohttp.web_protocol import RequestPayloadError

from promptcache.front.refusals import parse_refusal
from promptcache.front.state import Charge, FrontState
from promptcache.runtime.refusals import body_timeout, too_large
from promptcache.tenancy import errors
from promptcache.tenancy.canonical import (
    JsonScan,
)
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.shares import Verdict, share_refusal

SMALL_BODY_BYTES: Final = 1 << 20
"""Bodies up to this size with a Content-Length are read in one call."""


def has_body(request: web.BaseRequest) -> bool:
    return bool(request.content_length) or request.headers.get("Transfer-Encoding") is not None


async def read_body(
    request: web.BaseRequest, state: FrontState, charge: Charge, scan: JsonScan
) -> bytearray:
    """The whole body, under the size limit, the body-read cap, the timeout and the budget,
    counted into `scan` piece by piece as it arrives.

    Returned as the buffer it was read into (no second copy of a large body).
    """
    settings = state.settings
    limit = settings.max_body_bytes
    declared = request.content_length
    if declared is not None and declared > limit:
        raise too_large(declared, limit)
    _take_read(state, charge.key)
    try:
        return await _receive(request, state, charge, scan, declared)
    except asyncio.IncompleteReadError:
        raise FrontError(
            400, errors.INVALID_JSON, "the request body ended before its Content-Length"
        ) from None
    except (HttpProcessingError, RequestPayloadError) as exc:
        raise _framing_refusal(exc) from None
    except TimeoutError:
        state.metrics.deadline_fired("body")
        raise body_timeout(settings.body_timeout_seconds) from None
    finally:
        state.reads.give(charge.key, 1)


def _take_read(state: FrontState, key: bytes) -> None:
    """One of the body reads the front runs at once, for `key`; refused (429 over its share,
    503 when every read is taken) before a byte of the body is read."""
    reads = state.reads
    verdict = reads.take(key, 1)
    if verdict is Verdict.OVER_SHARE:
        state.metrics.share_refused("body_reads")
        raise share_refusal("request bodies being received", reads.held(key), reads.share)
    if verdict is not Verdict.TAKE:
        raise FrontError(
            503,
            errors.BODY_READS_SATURATED,
            f"the cache front is already receiving {state.settings.max_body_reads} request "
            "bodies; retry shortly",
        )


async def _receive(
    request: web.BaseRequest,
    state: FrontState,
    charge: Charge,
    scan: JsonScan,
    declared: int | None,
) -> bytearray:
    """Read the body once its read is taken: a declared small body in one call (the common
    case: it came with the head, no timer needed), anything else in pieces, charged and
    size-checked as they come, all under the body timeout."""
    settings = state.settings
    limit = settings.max_body_bytes
    if declared is not None:
        charge.take(declared)
    buffer = bytearray()
    await _continue(request)
    if declared is not None and declared <= SMALL_BODY_BYTES:
        buffer += request.content.read_nowait(declared)
        if len(buffer) < declared:
            async with asyncio.timeout(settings.body_timeout_seconds):
                buffer += await request.content.readexactly(declared - len(buffer))
        scan.add(buffer)  # at most SMALL_BODY_BYTES: a few milliseconds
        return buffer
    async with asyncio.timeout(settings.body_timeout_seconds):
        async for chunk in request.content.iter_chunked(1 << 16):
            if declared is None:
                charge.take(len(chunk))
            buffer += chunk
            scan.add(chunk)
            if len(buffer) > limit:
                raise too_large(len(buffer), limit)
    return buffer


def _framing_refusal(exc: HttpProcessingError | RequestPayloadError) -> FrontError:
    """The parser found the body's framing broken after the handler started reading: the
    front's 400 for it (never a 500: the client sent it)."""
    cause = exc.__cause__ if isinstance(exc, RequestPayloadError) else exc
    refusal = parse_refusal(400, cause if isinstance(cause, HttpProcessingError) else exc)
    if refusal.status >= 500:
        refusal = FrontError(
            400, errors.MALFORMED_REQUEST, "the request body's framing is not valid HTTP/1.1"
        )
    return refusal


async def _continue(request: web.BaseRequest) -> None:
    """Answer `Expect: 100-continue` once the front has decided to read the body.

    (aiohttp's router does this for applications; the front's low-level server
    does it here, after every check that can refuse the request unread.)
    """
    expect = request.headers.get("Expect")
    if expect is None or request.version < (1, 1):
        return
    if expect.lower() != "100-continue":
        raise FrontError(
            417,
            errors.EXPECTATION_FAILED,
            f"Expect: {expect[:40]!r} is not supported; only 100-continue is",
            param="Expect",
        )
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")

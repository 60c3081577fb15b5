"""How the cache front answers what it refuses: its JSON error response, and the refusals
it builds for an oversized body and for what aiohttp's HTTP parser cannot accept.
"""

from __future__ import annotations

import re
from typing import Final

from aiohttp import web
from aiohttp.http_exceptions import (
    BadStatusLine,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
)

from promptcache.tenancy import errors
from promptcache.tenancy.errors import FrontError


def json_error(exc: FrontError) -> web.Response:
    headers = dict(exc.headers)
    if exc.status == 503:
        headers.setdefault("Retry-After", "1")
    return web.Response(
        status=exc.status,
        body=exc.body_bytes(),
        content_type="application/json",
        headers=headers or None,
    )


_DUPLICATE: Final = re.compile(r"Duplicate '?([A-Za-z0-9!#$%&*+.^_`|~-]{1,64})'?")
_DETAIL_CHARS: Final = 100


def _detail(exc: HttpProcessingError) -> str:
    """The first line of aiohttp's message (llhttp's reason), short; never the raw bytes."""
    first = exc.message.split("\n", 1)[0].rstrip(":").strip()
    return first if len(first) <= _DETAIL_CHARS else first[: _DETAIL_CHARS - 3] + "..."


def parse_refusal(status: int, exc: BaseException | None) -> FrontError:
    """The front's error for what aiohttp's `handle_error` is asked to answer.

    aiohttp's parser raises `HttpProcessingError`s (llhttp's reasons); everything
    else reaching `handle_error` is a failure inside the front, a 500 with no
    detail (the traceback goes to the log).
    """
    if status >= 500 or not isinstance(exc, HttpProcessingError):
        return errors.internal_error()
    if isinstance(exc, LineTooLong) or "Too many headers" in exc.message:
        return FrontError(
            431,
            errors.REQUEST_HEAD_TOO_LARGE,
            "the request line or a header is longer than 8190 bytes, or there are more than "
            "128 headers",
        )
    detail = _detail(exc)
    if isinstance(exc, (BadStatusLine, InvalidURLError)):
        return FrontError(
            400,
            errors.INVALID_REQUEST_LINE,
            f"the request line is not 'METHOD /path HTTP/1.1' with a token method and an "
            f"ASCII target ({detail})",
        )
    duplicate = _DUPLICATE.match(detail)
    if duplicate:
        name = duplicate.group(1)
        return FrontError(
            400, errors.DUPLICATE_HEADER, f"send one {name} header, not several", param=name
        )
    if isinstance(exc, InvalidHeader) or "header" in detail.lower():
        return FrontError(
            400,
            errors.INVALID_HEADER,
            f"a header is malformed: names are tokens, values hold no control characters, no "
            f"line folding, and Host is required ({detail})",
        )
    return FrontError(
        400,
        errors.MALFORMED_REQUEST,
        f"the request's framing is not valid HTTP/1.1 ({detail}): one Content-Length of "
        "digits, or Transfer-Encoding: chunked alone",
    )

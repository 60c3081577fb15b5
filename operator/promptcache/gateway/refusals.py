"""The step's refusals, as the front words them, and the ext_proc answer that sends one to
the client without asking the picker (`immediate`).
"""

from __future__ import annotations

import logging
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2

from promptcache.runtime.refusals import internal_error
from promptcache.tenancy import errors as front_errors
from promptcache.tenancy.errors import FrontError

log = logging.getLogger("promptcache.gateway_policy")


def busy() -> FrontError:
    return FrontError(
        503,
        front_errors.FRONT_OVERLOADED,
        "the gateway is holding as many request bytes as it may; retry shortly",
    )


def parse_too_large(need: int, limit: int) -> FrontError:
    return FrontError(
        413,
        front_errors.REQUEST_TOO_LARGE,
        f"the request needs about {need} bytes of working memory to be checked at the "
        f"gateway (its body, parsed and re-encoded); the gateway gives one client at most "
        f"{limit}",
    )


def ended_early() -> FrontError:
    return FrontError(
        400,
        front_errors.INVALID_JSON,
        "the request ended before its body did (the stream closed mid-body)",
    )


def protocol_error(kind: str | None) -> FrontError:
    log.error("refused a request: the gateway sent %s while its body was incomplete", kind)
    return internal_error()


def immediate(error: FrontError) -> Any:
    """The ext_proc answer that sends the front's error to the client directly."""
    headers = [("content-type", b"application/json")]
    if error.status == 503:
        headers.append(("retry-after", b"1"))
    headers.extend((k.lower(), v.encode()) for k, v in error.headers.items())
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=error.status),
            headers=pb.HeaderMutation(
                set_headers=[
                    base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=k, raw_value=v))
                    for k, v in headers
                ]
            ),
            body=error.body_bytes(),
            details=error.code,
        )
    )

"""The refusals the cache front and the gateway's policy step word the same way.

A client sees the same status, code and message whichever of the two refuses it (the
step answers what the front would, before routing): so the words are written once.
"""

from __future__ import annotations

from promptcache.tenancy import errors
from promptcache.tenancy.errors import FrontError


def too_large(size: int, limit: int) -> FrontError:
    """413: a body past the per-request limit (`max_body_bytes`)."""
    return FrontError(
        413,
        errors.REQUEST_TOO_LARGE,
        f"the request body has at least {size} bytes; this server accepts at most {limit}. "
        "Send prompt embeddings the server has seen by identifier instead of inline",
    )


def body_timeout(seconds: float) -> FrontError:
    """408: a body that did not arrive within the body timeout."""
    return FrontError(
        408,
        errors.BODY_TIMEOUT,
        f"the request body did not arrive within {seconds:g} seconds",
    )


def internal_error() -> FrontError:
    """500: the process failed on the request, so it refuses it (fails closed)."""
    return errors.internal_error()

"""The API server's refusals as types, decided in one place from the HTTP status.

Callers catch the case they handle instead of comparing status codes::

    ApiError                  any error status (code, reason, message; `transient`)
    ├── ForbiddenError        403: RBAC does not allow it
    ├── NotFoundError         404: no such object (or the kind is not served)
    ├── ConflictError         409: already exists, or a stale resourceVersion
    ├── GoneError             410: the watch or list continuation expired
    └── TooManyRequestsError  429: throttled; `retry_after_s` from Retry-After, if given

`transient` (worth retrying unchanged) is true for 408, 429 and every 5xx.

No answer at all (a timeout, a refused or reset connection) is `ApiUnreachableError`, an
`OSError`, so every path that handles an unreachable API server handles it alike.

    >>> isinstance(api_error(404, "NotFound", "x"), NotFoundError)
    True
    >>> api_error(429, "TooManyRequests", "slow down", retry_after="3").retry_after_s
    3.0
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "ApiError",
    "ApiUnreachableError",
    "ConflictError",
    "ForbiddenError",
    "GoneError",
    "NotFoundError",
    "TooManyRequestsError",
    "api_error",
]


class ApiError(Exception):
    """The API server answered with an error status; `code` and `reason` say which."""

    status: ClassVar[int | None] = None
    """The HTTP status a subclass stands for (None: any other)."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        self.code = code
        self.reason = reason
        self.message = message
        super().__init__(f"{code} {reason}: {message}")

    @property
    def transient(self) -> bool:
        """Worth retrying unchanged: throttling, timeouts and server-side failures."""
        return self.code in (408, 429) or self.code >= 500


class ForbiddenError(ApiError):
    """403: the operator's RBAC does not allow the request."""

    status = 403


class NotFoundError(ApiError):
    """404: the object does not exist, or its kind is not served."""

    status = 404


class ConflictError(ApiError):
    """409: the object already exists (create), or changed since it was read (replace)."""

    status = 409


class GoneError(ApiError):
    """410: a resourceVersion or continue token has expired."""

    status = 410


class TooManyRequestsError(ApiError):
    """429: the API server (or its priority and fairness) throttles the operator."""

    status = 429

    def __init__(
        self, code: int, reason: str, message: str, *, retry_after_s: float | None = None
    ) -> None:
        super().__init__(code, reason, message)
        self.retry_after_s = retry_after_s


class ApiUnreachableError(OSError):
    """No answer from the API server: a timeout, a refused or reset connection."""


_BY_STATUS: dict[int, type[ApiError]] = {
    c.status: c
    for c in (ForbiddenError, NotFoundError, ConflictError, GoneError)
    if c.status is not None
}


def _seconds(value: str | None) -> float | None:
    """Retry-After in seconds (the API server sends delta-seconds, never a date)."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds <= 3600 else None


def api_error(code: int, reason: str, message: str, *, retry_after: str | None = None) -> ApiError:
    """The typed error for an error status (`retry_after`: the Retry-After header)."""
    if code == TooManyRequestsError.status:
        return TooManyRequestsError(code, reason, message, retry_after_s=_seconds(retry_after))
    return _BY_STATUS.get(code, ApiError)(code, reason, message)

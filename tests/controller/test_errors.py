"""The API server's error statuses become one typed error each, decided in one place."""

from __future__ import annotations

import pytest

from promptcache.controller.errors import (
    ApiError,
    ConflictError,
    ForbiddenError,
    GoneError,
    NotFoundError,
    TooManyRequestsError,
    api_error,
)


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (403, ForbiddenError),
        (404, NotFoundError),
        (409, ConflictError),
        (410, GoneError),
        (429, TooManyRequestsError),
        (422, ApiError),
        (500, ApiError),
    ],
)
def test_each_status_has_its_type(code: int, kind: type[ApiError]) -> None:
    error = api_error(code, "Reason", "said")
    assert type(error) is kind
    assert (error.code, error.reason, error.message) == (code, "Reason", "said")
    assert str(error) == f"{code} Reason: said"


@pytest.mark.parametrize(
    ("code", "transient"), [(404, False), (408, True), (429, True), (503, True)]
)
def test_transient_is_what_a_retry_can_fix(code: int, transient: bool) -> None:
    assert api_error(code, "", "").transient is transient


@pytest.mark.parametrize(
    ("header", "seconds"), [("3", 3.0), ("0.5", 0.5), (None, None), ("soon", None), ("-1", None)]
)
def test_too_many_requests_keeps_retry_after(header: str | None, seconds: float | None) -> None:
    error = api_error(429, "TooManyRequests", "slow down", retry_after=header)
    assert isinstance(error, TooManyRequestsError)
    assert error.retry_after_s == seconds

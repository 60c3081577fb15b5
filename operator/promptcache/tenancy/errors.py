"""Every error the front itself answers with, as one exception carrying its HTTP form.

Hierarchy: `FrontError` is the only type; its `code` is stable and
machine-readable (clients branch on it), its `message` is for people and names
the field and the fix. The body follows OpenAI's error shape so existing
clients surface the message::

    {"error": {"message": "...", "type": "invalid_request_error",
               "code": "prompt_embeds_not_cached", "param": "prompt_embeds",
               "missing_prompt_embeds_ids": ["blake3:..."]}}

Upstream (vLLM) errors are never wrapped: their status and body pass through.
"""

from __future__ import annotations

import json
from typing import Any, Final

from promptcache.contract import (
    MISSING_PROMPT_EMBEDS_IDS_FIELD,
    PROMPT_EMBEDS_NOT_CACHED_ERROR_CODE,
)

INVALID_JSON: Final = "invalid_json"
BODY_NOT_OBJECT: Final = "body_not_object"
REQUEST_TOO_LARGE: Final = "request_too_large"
ISOLATION_KEY_REQUIRED: Final = "isolation_key_required"
INVALID_ISOLATION_KEY: Final = "invalid_isolation_key"
INVALID_PROMPT_CACHE_MAX_LEN: Final = "invalid_prompt_cache_max_len"
INVALID_PROMPT_EMBEDS: Final = "invalid_prompt_embeds"
INVALID_PROMPT_EMBEDS_ID: Final = "invalid_prompt_embeds_id"
PROMPT_EMBEDS_ID_MISMATCH: Final = "prompt_embeds_id_mismatch"
PROMPT_EMBEDS_NOT_CACHED: Final = PROMPT_EMBEDS_NOT_CACHED_ERROR_CODE
PATH_FORBIDDEN: Final = "path_forbidden"
FRONT_OVERLOADED: Final = "front_overloaded"
FAIR_SHARE_EXCEEDED: Final = "fair_share_exceeded"
TENANT_SHARE_EXCEEDED: Final = "tenant_share_exceeded"
UPSTREAM_UNAVAILABLE: Final = "upstream_unavailable"
UPSTREAM_TIMEOUT: Final = "upstream_timeout"
UPSTREAM_FAILED: Final = "upstream_failed"
INVALID_REQUEST_TARGET: Final = "invalid_request_target"
ROUTE_NOT_FOUND: Final = "route_not_found"
ROUTE_NOT_ISOLATED: Final = "route_not_isolated"
METHOD_NOT_ALLOWED: Final = "method_not_allowed"
UNSUPPORTED_MEDIA_TYPE: Final = "unsupported_media_type"
UNSUPPORTED_CONTENT_ENCODING: Final = "unsupported_content_encoding"
INVALID_HEADER: Final = "invalid_header"
DUPLICATE_HEADER: Final = "duplicate_header"
JSON_TOO_DEEP: Final = "json_too_deep"
INVALID_UNICODE: Final = "invalid_unicode"
INVALID_FIELD: Final = "invalid_field"
BODY_TIMEOUT: Final = "body_timeout"
BODY_READS_SATURATED: Final = "body_reads_saturated"
MEMORY_BUDGET_EXHAUSTED: Final = "memory_budget_exhausted"
BODY_NOT_ALLOWED: Final = "body_not_allowed"
INVALID_REQUEST_LINE: Final = "invalid_request_line"
REQUEST_HEAD_TOO_LARGE: Final = "request_head_too_large"
MALFORMED_REQUEST: Final = "malformed_request"
INTERNAL_ERROR: Final = "internal_error"
EXPECTATION_FAILED: Final = "expectation_failed"
PRIORITY_NOT_ALLOWED: Final = "priority_not_allowed"
DUPLICATE_FIELD: Final = "duplicate_field"
AMBIGUOUS_FIELD: Final = "ambiguous_field"
FIELD_NOT_ALLOWED: Final = "field_not_allowed"
IDENTITY_REQUIRED: Final = "identity_required"
INVALID_IDENTITY: Final = "invalid_identity"
PROMPT_CACHE_MAX_LEN_NOT_SUPPORTED: Final = "prompt_cache_max_len_not_supported"

_TYPES: Final[dict[int, str]] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    415: "invalid_request_error",
    417: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "internal_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    502: "upstream_error",
    503: "overloaded_error",
    504: "upstream_error",
}


class FrontError(Exception):
    """A request the front answers itself, with a stable code and a clear message."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        param: str | None = None,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.extra = dict(extra or {})
        self.headers = dict(headers or {})

    def __reduce__(self) -> tuple[Any, ...]:
        # picklable with its fields (the policy step decides large bodies in a worker process)
        options = {"param": self.param, "extra": self.extra, "headers": self.headers}
        return (_rebuild, (self.status, self.code, self.message, options))

    def body(self) -> dict[str, Any]:
        """The JSON object the client receives."""
        error: dict[str, Any] = {
            "message": self.message,
            "type": _TYPES.get(self.status, "invalid_request_error"),
            "code": self.code,
            "param": self.param,
        }
        error.update(self.extra)
        return {"error": error}

    def body_bytes(self) -> bytes:
        """The response body, encoded."""
        return json.dumps(self.body()).encode("utf-8")


def _rebuild(status: int, code: str, message: str, options: dict[str, Any]) -> FrontError:
    return FrontError(status, code, message, **options)


def internal_error() -> FrontError:
    """A failure inside the front (or the gateway's policy step): the request is refused,
    never forwarded; the traceback goes to the log, not to the client."""
    return FrontError(
        500,
        INTERNAL_ERROR,
        "the cache front failed on this request; it was not forwarded. Retry, and report "
        "it if it persists",
    )


def not_cached(missing: list[str], param: str) -> FrontError:
    """The 409 that tells a client exactly which payloads to upload again."""
    n = len(missing)
    noun = "identifier is" if n == 1 else "identifiers are"
    return FrontError(
        409,
        PROMPT_EMBEDS_NOT_CACHED,
        f"{n} prompt-embeds {noun} not cached on this server; send the payloads for "
        f"the identifiers in {MISSING_PROMPT_EMBEDS_IDS_FIELD} again",
        param=param,
        extra={MISSING_PROMPT_EMBEDS_IDS_FIELD: missing},
    )

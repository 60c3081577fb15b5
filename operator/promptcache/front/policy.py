"""The per-request rules of spec/004, as one pure function over headers and body.

Pure (no I/O, no clock; the only randomness is the one-off salt of an
uncacheable request) so every rule is testable without a server, and so the
HTTP layer stays a thin shell around it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from promptcache.contract import (
    CACHE_SALT_FIELD,
    PROMPT_CACHE_MAX_LEN_FIELD,
    SESSION_USER_FIELD,
    IsolationMode,
)
from promptcache.front.errors import (
    INVALID_ISOLATION_KEY,
    INVALID_PROMPT_CACHE_MAX_LEN,
    ISOLATION_KEY_REQUIRED,
    FrontError,
)
from promptcache.front.salt import derive_salt, random_salt
from promptcache.front.settings import FrontSettings

SALTED_PATHS: Final[frozenset[str]] = frozenset(
    {"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages", "/pooling"}
)
"""Endpoints where vLLM accepts `cache_salt`, so the isolation policy applies in full."""

STREAMING_USAGE_PATHS: Final[frozenset[str]] = frozenset(
    {"/v1/completions", "/v1/chat/completions"}
)
"""Endpoints whose streams end with a usage chunk when `stream_options.include_usage`."""

MAX_ISOLATION_KEY_CHARS: Final[int] = 4096


class Isolation(StrEnum):
    """What the policy decided for one request (a metric label)."""

    SHARED = "shared"
    """Mode Shared: no salt at all."""
    KEYED = "keyed"
    """A key was sent and became an HMAC salt."""
    UNKEYED = "unkeyed"
    """Mode PerKey without a key: the unsalted shared scope."""
    UNCACHEABLE = "uncacheable"
    """prompt_cache_max_len 0: a one-off salt."""
    REJECTED = "rejected"
    """Mode Required without a key, or a malformed key."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What the proxy must do besides forwarding the rewritten body."""

    isolation: Isolation
    salt: str | None
    """The `cache_salt` vLLM receives, or None when the field is absent."""
    use_embeds_cache: bool
    """False for uncacheable requests: neither look up nor store prompt embeds."""
    client_salt_removed: bool
    stream: bool
    strip_usage_chunk: bool
    """The front asked vLLM for a usage chunk the client did not ask for."""
    session_header_value: str | None
    """Value for the session header when the front copies `user` into it."""
    max_len_not_enforced: bool
    """A positive prompt_cache_max_len was accepted but vLLM cannot enforce it."""


def _isolation_key(
    headers: Mapping[str, str], body: dict[str, Any], settings: FrontSettings
) -> str | None:
    """The key the client sent, from header or body, or None; malformed keys raise."""
    header_key = headers.get(settings.isolation_header)
    field_present = settings.isolation_field in body
    field_key = body.pop(settings.isolation_field, None)
    if field_present and field_key is not None and not isinstance(field_key, str):
        raise FrontError(
            400,
            INVALID_ISOLATION_KEY,
            f"{settings.isolation_field} must be a string, got {type(field_key).__name__}",
            param=settings.isolation_field,
        )
    keys = {k for k in (header_key, field_key) if k}
    if len(keys) > 1:
        raise FrontError(
            400,
            INVALID_ISOLATION_KEY,
            f"the {settings.isolation_header} header and the {settings.isolation_field} "
            "field carry different isolation keys; send one, or the same value in both",
            param=settings.isolation_field,
        )
    key = keys.pop() if keys else None
    if key is not None and len(key) > MAX_ISOLATION_KEY_CHARS:
        raise FrontError(
            400,
            INVALID_ISOLATION_KEY,
            f"the isolation key has {len(key)} characters; at most "
            f"{MAX_ISOLATION_KEY_CHARS} are allowed",
            param=settings.isolation_field,
        )
    return key


def _max_len(body: dict[str, Any], settings: FrontSettings) -> int | None:
    """The client's prompt_cache_max_len, validated and removed from the body."""
    if PROMPT_CACHE_MAX_LEN_FIELD not in body:
        return None
    value = body.pop(PROMPT_CACHE_MAX_LEN_FIELD)
    if not settings.honor_prompt_cache_max_len or value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FrontError(
            400,
            INVALID_PROMPT_CACHE_MAX_LEN,
            f"{PROMPT_CACHE_MAX_LEN_FIELD} must be a non-negative integer (0 disables "
            f"caching for this request), got {value!r}",
            param=PROMPT_CACHE_MAX_LEN_FIELD,
        )
    return value


def apply_policy(
    path: str,
    headers: Mapping[str, str],
    body: dict[str, Any],
    settings: FrontSettings,
    secret: bytes | None,
) -> Plan:
    """Rewrite `body` in place for vLLM and say what else the proxy must do.

    `headers` must be case-insensitive (aiohttp's `CIMultiDict` is). Raises
    `FrontError` for requests the policy refuses.
    """
    client_salt_removed = body.pop(CACHE_SALT_FIELD, None) is not None
    key = _isolation_key(headers, body, settings)
    max_len = _max_len(body, settings)
    mode = settings.isolation_mode
    salted_path = path in SALTED_PATHS

    if key is None and mode is IsolationMode.REQUIRED and salted_path:
        raise FrontError(
            400,
            ISOLATION_KEY_REQUIRED,
            "this deployment requires an isolation key: send the "
            f"{settings.isolation_header} header or the {settings.isolation_field} "
            "field with a string that names who may share cached prompts",
            param=settings.isolation_field,
        )
    salt: str | None = None
    use_cache = True
    if salted_path and max_len == 0:
        isolation, salt, use_cache = Isolation.UNCACHEABLE, random_salt(), False
    elif mode is IsolationMode.SHARED:
        isolation = Isolation.SHARED
    elif key is None:
        isolation = Isolation.UNKEYED
    else:
        if secret is None:  # settings guarantee a secret in salting modes
            raise RuntimeError("a salting isolation mode is running without its secret")
        isolation, salt = Isolation.KEYED, derive_salt(secret, key)
    if salt is not None and salted_path:
        body[CACHE_SALT_FIELD] = salt

    stream = body.get("stream") is True
    strip_usage = False
    if stream and path in STREAMING_USAGE_PATHS and settings.usage_headers_enabled:
        options = body.get("stream_options")
        if options is None:
            body["stream_options"] = {"include_usage": True}
            strip_usage = True
        elif isinstance(options, dict) and not options.get("include_usage"):
            options["include_usage"] = True
            strip_usage = True

    session_value: str | None = None
    if (
        settings.session_from_user
        and settings.session_header
        and settings.session_header not in headers
    ):
        user = body.get(SESSION_USER_FIELD)
        if isinstance(user, str) and user:
            session_value = user

    return Plan(
        isolation=isolation,
        salt=salt if salted_path else None,
        use_embeds_cache=use_cache,
        client_salt_removed=client_salt_removed,
        stream=stream,
        strip_usage_chunk=strip_usage,
        session_header_value=session_value,
        max_len_not_enforced=max_len is not None and max_len > 0,
    )

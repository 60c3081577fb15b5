"""Sessions: what names a request's session, and the `promptcache` picker's session plugin.

A session names routing only, never isolation (spec/004). Two processes read it: the
gateway's policy step (`gateway.policy_step`, in front of llm-d-router, which copies a
body's session into the header that picker reads) and the `promptcache` picker's session
plugin (`picker/sessions`, Go), which reads the header and the body itself. Both follow
`request_session`; the picker is held to it by the vectors `tools/picker_vectors.py`
computes from it, and to the plugin's type and parameter names below the same way.

    >>> request_session(None, {"prompt_cache_key": " chat-7 "}, session_sources(True))
    'chat-7'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, Final

from promptcache.contract.names import PROMPT_CACHE_KEY_FIELD, SESSION_USER_FIELD

MAX_SESSION_ID_CHARS: Final[int] = 256
"""A body field longer than this (in code points, after trimming) names no session; a
header has to carry such a session."""


class SessionSource(StrEnum):
    """Where a request may name its session, in the order `spec.sessionAffinity` reads them."""

    HEADER = "header"
    """The session header (`sessionAffinity.header`), as sent, when it is not blank."""
    PROMPT_CACHE_KEY = PROMPT_CACHE_KEY_FIELD
    """OpenAI's cache-routing hint in the body."""
    USER = SESSION_USER_FIELD
    """The body's `user` (only with `sessionAffinity.useUserField`)."""


def session_sources(use_user_field: bool) -> tuple[SessionSource, ...]:
    """The sources a resource reads, first match wins: the header, then the body."""
    body = (
        (SessionSource.PROMPT_CACHE_KEY, SessionSource.USER)
        if use_user_field
        else (SessionSource.PROMPT_CACHE_KEY,)
    )
    return (SessionSource.HEADER, *body)


def usable_session(value: Any) -> str | None:
    """A body field's session, if it can name one; else None (ignored, never forwarded).

    A client controls it, so only a string of 1-256 characters after trimming whitespace
    (Python's `str.strip`) and without control characters (below U+0020, or U+007F)."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    if not text or len(text) > MAX_SESSION_ID_CHARS:
        return None
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        return None
    return text


def session_of(body: Mapping[str, Any], user_field: str) -> str | None:
    """The session a body names: `prompt_cache_key`, else `user_field` (when set)."""
    for field in (PROMPT_CACHE_KEY_FIELD, user_field):
        if field and (value := usable_session(body.get(field))) is not None:
            return value
    return None


def request_session(
    header_value: str | None, body: Mapping[str, Any], sources: Sequence[SessionSource]
) -> str | None:
    """The session a request names: the first source in `sources` that names one.

    The header counts when it is present and not blank (Python's `str.isspace`), and is
    taken as sent; a body field counts when `usable_session` accepts it."""
    for source in sources:
        if source is SessionSource.HEADER:
            if header_value is not None and header_value.strip():
                return header_value
        elif (value := usable_session(body.get(source.value))) is not None:
            return value
    return None


SESSION_AFFINITY_PLUGIN: Final[str] = "promptcache-session-affinity"
"""The `promptcache` picker's session plugin type (`picker/plugins/sessionaffinity`): a
filter that keeps only a session's pinned pod, and a PreRequest hook that pins the pick."""

DEFAULT_MAX_SESSIONS: Final[int] = 65536
"""Sessions the plugin tracks at most; beyond it the least recently used is forgotten
(its next request is placed afresh). picker/README.md gives the memory this bounds."""


class SessionParam(StrEnum):
    """The session plugin's `parameters` (decoded strictly by the picker)."""

    HEADER = "header"
    """The session header's name (lower case: GIE's header map is keyed as Envoy sends)."""
    SOURCES = "sources"
    """`SessionSource` values, in order; first match wins."""
    TTL_SECONDS = "ttlSeconds"
    """How long a pin survives unused; every request of the session renews it."""
    MAX_SESSIONS = "maxSessions"
    """The bound on tracked sessions (least recently used forgotten first)."""

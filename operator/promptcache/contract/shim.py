"""The session shim's settings: each variable, flag, parser and default, declared once.

The renderer writes these variables into the Endpoint Picker pod's `session-shim`
container; `promptcache session-shim` reads them (flags winning) into `ShimSettings`.
"""

from __future__ import annotations

from typing import Any, Final

from promptcache.contract.front import FrontEnv
from promptcache.contract.names import (
    DEFAULT_SESSION_HEADER,
    EPP_EXT_PROC_PORT,
    EPP_LOCAL_GRPC_PORT,
    SESSION_USER_FIELD,
)
from promptcache.contract.settings import (
    Setting,
    as_float,
    as_int,
    parse_body_field,
    parse_header_name,
    parse_host_port,
)


class SessionShimEnv:
    """Environment variables the renderer sets on the `session-shim` container.

    Each has a matching `promptcache session-shim` flag; the flag wins when both are given.
    """

    LISTEN: Final[str] = "PROMPTCACHE_SESSION_SHIM_LISTEN"
    """HOST:PORT the shim serves ext_proc on (what the gateway dials)."""
    UPSTREAM: Final[str] = "PROMPTCACHE_SESSION_SHIM_UPSTREAM"
    """HOST:PORT of the Endpoint Picker's own ext_proc port."""
    SESSION_HEADER: Final[str] = FrontEnv.SESSION_HEADER
    """The session-affinity header the EPP's session filter reads (the front's name too)."""
    USER_FIELD: Final[str] = "PROMPTCACHE_SESSION_SHIM_USER_FIELD"
    """The body field copied into the header when the header is absent."""
    MAX_BODY_BYTES: Final[str] = "PROMPTCACHE_SESSION_SHIM_MAX_BODY_BYTES"
    """Largest body one request may buffer for inspection; larger ones pass through as is."""
    MAX_BUFFERED_BYTES: Final[str] = "PROMPTCACHE_SESSION_SHIM_MAX_BUFFERED_BYTES"
    """Body bytes all streams together may hold; beyond it requests pass through unread."""
    DRAIN_SECONDS: Final[str] = "PROMPTCACHE_SESSION_SHIM_DRAIN_SECONDS"
    """How long in-flight streams may finish after SIGTERM."""


DEFAULT_SHIM_LISTEN: Final[str] = f"0.0.0.0:{EPP_EXT_PROC_PORT}"
"""Where the gateway dials: the port the EPP Service targets."""
DEFAULT_SHIM_UPSTREAM: Final[str] = f"127.0.0.1:{EPP_LOCAL_GRPC_PORT}"
"""The EPP's own ext_proc port, inside the pod."""
DEFAULT_SHIM_MAX_BODY_BYTES: Final[int] = 4 * 1024**2
"""A 128k-token chat is about 0.5 MiB of JSON; bigger bodies (prompt-embeds payloads) pass
through unread: such clients can send the header."""
DEFAULT_SHIM_MAX_BUFFERED_BYTES: Final[int] = 64 * 1024**2
"""All streams together; with the per-request cap it bounds what the shim holds."""
DEFAULT_SHIM_DRAIN_SECONDS: Final[float] = 30.0
"""In-flight streams may finish this long after SIGTERM (the EPP pod allows 130 s)."""
MAX_SHIM_DRAIN_SECONDS: Final[float] = 3600.0

SHIM_SETTINGS: Final[tuple[Setting[Any], ...]] = (
    Setting("listen", "--listen", SessionShimEnv.LISTEN, parse_host_port, DEFAULT_SHIM_LISTEN,
            "HOST:PORT to serve ext_proc on (what the gateway dials)"),
    Setting("upstream", "--upstream", SessionShimEnv.UPSTREAM, parse_host_port,
            DEFAULT_SHIM_UPSTREAM, "HOST:PORT of the Endpoint Picker's own ext_proc port"),
    Setting("session_header", "--session-header", SessionShimEnv.SESSION_HEADER,
            parse_header_name, DEFAULT_SESSION_HEADER,
            "header the EPP's session filter reads; added from the body when absent",
            empty_is_unset=False),
    Setting("user_field", "--user-field", SessionShimEnv.USER_FIELD, parse_body_field,
            SESSION_USER_FIELD, "body field naming the session", empty_is_unset=False),
    Setting("max_body_bytes", "--max-body-bytes", SessionShimEnv.MAX_BODY_BYTES, as_int,
            DEFAULT_SHIM_MAX_BODY_BYTES,
            "largest body read per request; larger ones pass through unread"),
    Setting("max_buffered_bytes", "--max-buffered-bytes", SessionShimEnv.MAX_BUFFERED_BYTES,
            as_int, DEFAULT_SHIM_MAX_BUFFERED_BYTES,
            "body bytes all requests together may hold; beyond, pass through unread"),
    Setting("drain_seconds", "--drain-seconds", SessionShimEnv.DRAIN_SECONDS, as_float,
            DEFAULT_SHIM_DRAIN_SECONDS, "how long open streams may finish after SIGTERM"),
)  # fmt: skip

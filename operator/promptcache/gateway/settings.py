"""What the session shim needs to run, validated once, free of gRPC imports.

Kept apart from the proxy so `promptcache session-shim --help` and settings errors work
without the `gateway` extra, and so the renderer's defaults and the shim's agree by
importing the same constants from `promptcache.contract`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from promptcache.contract import (
    DEFAULT_SESSION_HEADER,
    EPP_EXT_PROC_PORT,
    EPP_LOCAL_GRPC_PORT,
    SESSION_USER_FIELD,
)

DEFAULT_MAX_BODY_BYTES: Final[int] = 4 * 1024**2
"""A 128k-token chat is about 0.5 MiB of JSON; bigger bodies (prompt-embeds payloads) pass
through unread: such clients can send the header."""
DEFAULT_MAX_BUFFERED_BYTES: Final[int] = 64 * 1024**2
"""All streams together; with the per-request cap it bounds what the shim holds."""
DEFAULT_DRAIN_SECONDS: Final[float] = 30.0
"""In-flight streams may finish this long after SIGTERM (the EPP pod allows 130 s)."""

_TOKEN: Final = re.compile(r"^[!#$%&'*+.^_`|~0-9a-z-]+$")
"""An HTTP header name (RFC 9110 token), lower case as HTTP/2 carries it."""
_HOST_PORT: Final = re.compile(r"^(?:\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})$")


class ShimSettingsError(ValueError):
    """A setting the shim cannot run with; the message names it and the fix."""


@dataclass(frozen=True, slots=True)
class ShimSettings:
    """The shim's whole configuration (flags over environment over these defaults)."""

    listen: str = f"0.0.0.0:{EPP_EXT_PROC_PORT}"
    """Where the gateway dials: the port the EPP Service targets."""
    upstream: str = f"127.0.0.1:{EPP_LOCAL_GRPC_PORT}"
    """The EPP's own ext_proc port, inside the pod."""
    session_header: str = DEFAULT_SESSION_HEADER
    user_field: str = SESSION_USER_FIELD
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES
    drain_seconds: float = DEFAULT_DRAIN_SECONDS

    def __post_init__(self) -> None:
        for name, value in (("--listen", self.listen), ("--upstream", self.upstream)):
            match = _HOST_PORT.match(value)
            if match is None or not 0 <= int(match.group(1)) <= 65535:
                raise ShimSettingsError(f"{name}={value!r} is not HOST:PORT (e.g. 0.0.0.0:9002)")
        if not _TOKEN.match(self.session_header):
            raise ShimSettingsError(
                f"--session-header={self.session_header!r} is not a lower-case HTTP header name"
            )
        if not self.user_field:
            raise ShimSettingsError("--user-field must not be empty")
        if self.max_body_bytes < 1:
            raise ShimSettingsError(f"--max-body-bytes={self.max_body_bytes} must be at least 1")
        if self.max_buffered_bytes < self.max_body_bytes:
            raise ShimSettingsError(
                f"--max-buffered-bytes={self.max_buffered_bytes} must be at least "
                f"--max-body-bytes={self.max_body_bytes}"
            )
        if not 0 <= self.drain_seconds <= 3600:
            raise ShimSettingsError(f"--drain-seconds={self.drain_seconds} must be in [0, 3600]")

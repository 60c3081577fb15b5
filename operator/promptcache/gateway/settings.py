"""What the session shim needs to run, validated once, free of gRPC imports.

Kept apart from the proxy so `promptcache session-shim --help` and settings errors work
without the `gateway` extra, and so the renderer's defaults and the shim's agree by
importing the same definitions from `promptcache.contract.shim`.
"""

from __future__ import annotations

from dataclasses import dataclass

from promptcache.contract import (
    DEFAULT_SESSION_HEADER,
    SESSION_USER_FIELD,
    GrammarError,
    SettingInputError,
    check_body_field,
    check_header_name,
)
from promptcache.contract.settings import split_host_port
from promptcache.contract.shim import (
    DEFAULT_SHIM_DRAIN_SECONDS,
    DEFAULT_SHIM_LISTEN,
    DEFAULT_SHIM_MAX_BODY_BYTES,
    DEFAULT_SHIM_MAX_BUFFERED_BYTES,
    DEFAULT_SHIM_UPSTREAM,
    MAX_SHIM_DRAIN_SECONDS,
)


class ShimSettingsError(ValueError):
    """A setting the shim cannot run with; the message names it and the fix."""


@dataclass(frozen=True, slots=True)
class ShimSettings:
    """The shim's whole configuration (flags over environment over these defaults)."""

    listen: str = DEFAULT_SHIM_LISTEN
    upstream: str = DEFAULT_SHIM_UPSTREAM
    session_header: str = DEFAULT_SESSION_HEADER
    user_field: str = SESSION_USER_FIELD
    max_body_bytes: int = DEFAULT_SHIM_MAX_BODY_BYTES
    max_buffered_bytes: int = DEFAULT_SHIM_MAX_BUFFERED_BYTES
    drain_seconds: float = DEFAULT_SHIM_DRAIN_SECONDS

    def __post_init__(self) -> None:
        try:
            split_host_port("--listen", self.listen)
            split_host_port("--upstream", self.upstream)
            check_header_name("--session-header", self.session_header, optional=False)
            check_body_field("--user-field", self.user_field, optional=False)
        except (SettingInputError, GrammarError) as exc:
            raise ShimSettingsError(str(exc)) from None
        if self.max_body_bytes < 1:
            raise ShimSettingsError(f"--max-body-bytes={self.max_body_bytes} must be at least 1")
        if self.max_buffered_bytes < self.max_body_bytes:
            raise ShimSettingsError(
                f"--max-buffered-bytes={self.max_buffered_bytes} must be at least "
                f"--max-body-bytes={self.max_body_bytes}"
            )
        if not 0 <= self.drain_seconds <= MAX_SHIM_DRAIN_SECONDS:
            raise ShimSettingsError(
                f"--drain-seconds={self.drain_seconds} must be in [0, {MAX_SHIM_DRAIN_SECONDS:g}]"
            )

"""The cache front's configuration: one frozen value built from env and flags.

The renderer sets environment variables (`contract.FrontEnv`); a person at a
shell passes flags. Both routes end in `FrontSettings`, validated once at start
so a mistyped value stops the front with a message instead of quietly serving
every request with a feature switched off.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from promptcache.contract import (
    DEFAULT_CACHED_PROMPT_TOKENS_HEADER,
    DEFAULT_ISOLATION_FIELD,
    DEFAULT_ISOLATION_HEADER,
    DEFAULT_PROMPT_TOKENS_HEADER,
    DEFAULT_SESSION_HEADER,
    SALT_KEY_MOUNT_DIR,
    SALT_KEY_SECRET_KEY,
    SERVING_PORT,
    SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR,
    VLLM_LOCAL_PORT,
    IsolationMode,
)

DEFAULT_UPSTREAM = f"http://127.0.0.1:{VLLM_LOCAL_PORT}"
DEFAULT_LISTEN = f"0.0.0.0:{SERVING_PORT}"
DEFAULT_SALT_KEY_FILE = f"{SALT_KEY_MOUNT_DIR}/{SALT_KEY_SECRET_KEY}"
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
"""vLLM's Rust frontend enforces 32 MiB; its Python server enforces nothing."""
DEFAULT_MAX_IN_FLIGHT = 256
"""vLLM's default `--max-num-seqs`: the front must not refuse what vLLM would run or queue."""
DEFAULT_MAX_BODY_READS = 128
"""Request bodies being received at once; slow senders wait here, not in the in-flight cap."""
DEFAULT_HEADER_TIMEOUT_SECONDS = 30.0
"""A connection must deliver a request's headers within this (also the idle keep-alive)."""
DEFAULT_BODY_TIMEOUT_SECONDS = 60.0
"""A request's body must arrive whole within this (a 256 MiB body at 5 MB/s takes ~50 s)."""
DEFAULT_MAX_PROMPT_EMBEDS_REFERENCES = 1024
"""Prompt-embeds payloads and references one request may carry."""
DEFAULT_MAX_IN_FLIGHT_BYTES = 1 << 30
"""Matches the headroom the renderer gives the container above the cache ceiling."""
DEFAULT_DECODE_WORKERS = 2
DEFAULT_TURBOQUANT_DTYPE = "auto"
"""auto: decode to the dtype the client compressed from (vLLM casts to the model dtype)."""
DEFAULT_UPSTREAM_TIMEOUT_SECONDS = 600.0
TURBOQUANT_DTYPES = ("auto", "float32", "float16", "bfloat16")
MIN_SALT_KEY_BYTES = 16
"""A shorter HMAC key would make per-tenant salts guessable."""

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class SettingsError(ValueError):
    """A setting that can never work; the message names the setting and the fix."""


def parse_bool(name: str, raw: str) -> bool:
    """Read a boolean the way people write them in YAML and shells."""
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SettingsError(f"{name}={raw!r} is not a boolean; use true or false")


def parse_listen(raw: str) -> tuple[str, int]:
    """Split `host:port` (IPv6 hosts in brackets) into its parts."""
    host, sep, port_text = raw.rpartition(":")
    if not sep or not port_text.isdigit() or not host:
        raise SettingsError(f"listen address {raw!r} must look like HOST:PORT, e.g. 0.0.0.0:8000")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise SettingsError(f"listen port {port} is outside 0..65535")
    return host.strip("[]"), port


@dataclass(frozen=True, slots=True)
class FrontSettings:
    """Everything the front needs to know; defaults fit the rendered pod."""

    upstream: str = DEFAULT_UPSTREAM
    listen: str = DEFAULT_LISTEN
    isolation_mode: IsolationMode = IsolationMode.SHARED
    isolation_header: str = DEFAULT_ISOLATION_HEADER
    isolation_field: str = DEFAULT_ISOLATION_FIELD
    salt_key_file: str = DEFAULT_SALT_KEY_FILE
    honor_prompt_cache_max_len: bool = True
    session_header: str = DEFAULT_SESSION_HEADER
    session_from_user: bool = True
    prompt_tokens_header: str = DEFAULT_PROMPT_TOKENS_HEADER
    cached_prompt_tokens_header: str = DEFAULT_CACHED_PROMPT_TOKENS_HEADER
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    prompt_embeds_cache_gib: float = 0.0
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    max_in_flight_bytes: int = DEFAULT_MAX_IN_FLIGHT_BYTES
    decode_workers: int = DEFAULT_DECODE_WORKERS
    turboquant_dtype: str = DEFAULT_TURBOQUANT_DTYPE
    upstream_timeout_seconds: float = DEFAULT_UPSTREAM_TIMEOUT_SECONDS
    workers: int = 1
    max_body_reads: int = DEFAULT_MAX_BODY_READS
    header_timeout_seconds: float = DEFAULT_HEADER_TIMEOUT_SECONDS
    body_timeout_seconds: float = DEFAULT_BODY_TIMEOUT_SECONDS
    max_prompt_embeds_references: int = DEFAULT_MAX_PROMPT_EMBEDS_REFERENCES

    def __post_init__(self) -> None:
        parts = urlsplit(self.upstream)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SettingsError(
                f"upstream {self.upstream!r} must be an http URL, e.g. {DEFAULT_UPSTREAM}"
            )
        parse_listen(self.listen)
        for label, header, optional in (
            ("isolation header", self.isolation_header, False),
            ("session header", self.session_header, True),
            ("prompt-tokens header", self.prompt_tokens_header, True),
            ("cached-prompt-tokens header", self.cached_prompt_tokens_header, True),
        ):
            if not header and optional:
                continue  # empty switches the feature off (how the renderer says "disabled")
            if not header or not all(c.isalnum() or c in "-_" for c in header):
                raise SettingsError(f"{label} {header!r} is not a valid HTTP header name")
        if not self.isolation_field:
            raise SettingsError("isolation field must not be empty")
        if self.max_body_bytes < 1024:
            raise SettingsError(f"max body bytes {self.max_body_bytes} is below 1024")
        if not self.prompt_embeds_cache_gib >= 0:
            raise SettingsError(
                f"{SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR}={self.prompt_embeds_cache_gib} "
                "must be a non-negative number of GiB (0 disables the cache)"
            )
        if self.max_in_flight < 1:
            raise SettingsError(f"max in-flight {self.max_in_flight} must be at least 1")
        if self.max_in_flight_bytes < self.max_body_bytes:
            raise SettingsError(
                f"max in-flight bytes {self.max_in_flight_bytes} is below the max body bytes "
                f"{self.max_body_bytes}: not even one full-size request could be served"
            )
        if self.decode_workers < 1:
            raise SettingsError(f"decode workers {self.decode_workers} must be at least 1")
        if self.turboquant_dtype not in TURBOQUANT_DTYPES:
            raise SettingsError(
                f"TurboQuant dtype {self.turboquant_dtype!r} is not one of "
                f"{', '.join(TURBOQUANT_DTYPES)}"
            )
        if self.workers < 1:
            raise SettingsError(f"workers {self.workers} must be at least 1")
        if not self.upstream_timeout_seconds > 0:
            raise SettingsError("upstream timeout must be a positive number of seconds")
        if self.max_body_reads < 1:
            raise SettingsError(f"max body reads {self.max_body_reads} must be at least 1")
        if not self.header_timeout_seconds > 0 or not self.body_timeout_seconds > 0:
            raise SettingsError("header and body timeouts must be positive numbers of seconds")
        if self.max_prompt_embeds_references < 1:
            raise SettingsError(
                f"max prompt-embeds references {self.max_prompt_embeds_references} must be "
                "at least 1"
            )

    @property
    def usage_headers_enabled(self) -> bool:
        """Whether any usage header is wanted (else streams are left untouched)."""
        return bool(self.prompt_tokens_header or self.cached_prompt_tokens_header)

    @property
    def upstream_base(self) -> str:
        """The upstream URL without a trailing slash, ready for path joins."""
        return self.upstream.rstrip("/")

    @property
    def cache_capacity_bytes(self) -> int:
        """The prompt-embeds cache size in bytes (0 = disabled)."""
        return int(self.prompt_embeds_cache_gib * (1 << 30))

    @property
    def needs_salt_key(self) -> bool:
        """Only salting modes read the secret; Shared never derives a salt."""
        return self.isolation_mode is not IsolationMode.SHARED


def read_salt_key(settings: FrontSettings) -> bytes | None:
    """Load the HMAC secret, refusing to start a salting mode without a usable one.

    Without the secret, PerKey would have to either share every tenant's cache
    (a silent privacy failure) or use the raw key as the salt (guessable), so
    the front stops instead.
    """
    if not settings.needs_salt_key:
        return None
    path = Path(settings.salt_key_file)
    mode = settings.isolation_mode.value
    try:
        secret = path.read_bytes().strip()
    except FileNotFoundError:
        raise SettingsError(
            f"isolation mode {mode} needs the salt key, but {path} does not exist; "
            "mount the salt Secret there or point --salt-key-file at it"
        ) from None
    except OSError as exc:
        raise SettingsError(
            f"isolation mode {mode} needs the salt key, but {path} cannot be read: {exc.strerror}"
        ) from None
    if len(secret) < MIN_SALT_KEY_BYTES:
        raise SettingsError(
            f"the salt key in {path} has {len(secret)} bytes; isolation mode {mode} needs "
            f"at least {MIN_SALT_KEY_BYTES} random bytes"
        )
    return secret


def env_value(environ: Mapping[str, str], name: str) -> str | None:
    """An env var's value, treating empty as unset (how Kubernetes renders `value: ""`)."""
    raw = environ.get(name)
    return raw if raw else None


def default_cache_gib(environ: Mapping[str, str] = os.environ) -> float:
    """The cache size the spec's variable asks for (0 when unset)."""
    raw = env_value(environ, SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR)
    if raw is None:
        return 0.0
    try:
        return float(raw)
    except ValueError:
        raise SettingsError(
            f"{SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR}={raw!r} is not a number of GiB"
        ) from None

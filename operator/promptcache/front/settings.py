"""The cache front's configuration: one frozen value built from env and flags.

The renderer sets environment variables (`contract.FrontEnv`); a person at a
shell passes flags. Both routes end in `FrontSettings`, validated once at start
so a mistyped value stops the front with a message instead of quietly serving
every request with a feature switched off. Every name, grammar, parser and
default comes from `promptcache.contract.front`: the renderer writes with the
same definitions.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from promptcache.contract import (
    DEFAULT_CACHED_PROMPT_TOKENS_HEADER,
    DEFAULT_ISOLATION_FIELD,
    DEFAULT_ISOLATION_HEADER,
    DEFAULT_PROMPT_TOKENS_HEADER,
    DEFAULT_SESSION_HEADER,
    SALT_KEY_FILE,
    SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR,
    GrammarError,
    IsolationMode,
    SettingInputError,
    cache_gib_to_bytes,
    check_header_name,
    needs_salt_key,
)
from promptcache.contract.cache_size import check_cache_gib
from promptcache.contract.front import (
    DEFAULT_ALLOW_CLIENT_PRIORITY,
    DEFAULT_ALLOW_ENGINE_STATE,
    DEFAULT_BODY_TIMEOUT_SECONDS,
    DEFAULT_CACHE_GIB,
    DEFAULT_DECODE_WORKERS,
    DEFAULT_FAIR_SHARE_BYTES_PER_SECOND,
    DEFAULT_HEADER_TIMEOUT_SECONDS,
    DEFAULT_HONOR_MAX_LEN,
    DEFAULT_IDENTITY_BEARER,
    DEFAULT_IDENTITY_HEADER,
    DEFAULT_IDENTITY_REQUIRED,
    DEFAULT_ISOLATION_MODE,
    DEFAULT_LAME_DUCK_SECONDS,
    DEFAULT_LIFECYCLE_LISTEN,
    DEFAULT_LISTEN,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_BODY_READS,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_IN_FLIGHT_BYTES,
    DEFAULT_MAX_PROMPT_EMBEDS_REFERENCES,
    DEFAULT_SEND_BUFFER_BYTES,
    DEFAULT_SESSION_FROM_USER,
    DEFAULT_TENANT_SHARE_PERCENT,
    DEFAULT_TURBOQUANT_DTYPE,
    DEFAULT_UPSTREAM,
    DEFAULT_UPSTREAM_TIMEOUT_SECONDS,
    DEFAULT_WORKERS,
    DEFAULT_WRITE_TIMEOUT_SECONDS,
    TURBOQUANT_DTYPES,
)
from promptcache.contract.settings import split_host_port
from promptcache.tenancy.settings import (
    MIN_SALT_KEY_BYTES,
    SettingsError,
    check_policy_settings,
    read_mounted_salt_key,
    read_salt_key,
)

__all__ = [
    "MIN_SALT_KEY_BYTES",
    "FrontSettings",
    "SettingsError",
    "parse_listen",
    "read_mounted_salt_key",
    "read_salt_key",
]


def parse_listen(raw: str) -> tuple[str, int]:
    """Split `host:port` (IPv6 hosts in brackets) into its parts."""
    try:
        return split_host_port("listen address", raw)
    except SettingInputError as exc:
        raise SettingsError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class FrontSettings:
    """Everything the front needs to know; defaults fit the rendered pod."""

    upstream: str = DEFAULT_UPSTREAM
    listen: str = DEFAULT_LISTEN
    isolation_mode: IsolationMode = DEFAULT_ISOLATION_MODE
    isolation_header: str = DEFAULT_ISOLATION_HEADER
    """Empty: the key is not read from any header."""
    isolation_field: str = DEFAULT_ISOLATION_FIELD
    """Empty: the key is not read from the body."""
    salt_key_file: str = SALT_KEY_FILE
    honor_prompt_cache_max_len: bool = DEFAULT_HONOR_MAX_LEN
    session_header: str = DEFAULT_SESSION_HEADER
    session_from_user: bool = DEFAULT_SESSION_FROM_USER
    prompt_tokens_header: str = DEFAULT_PROMPT_TOKENS_HEADER
    cached_prompt_tokens_header: str = DEFAULT_CACHED_PROMPT_TOKENS_HEADER
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    prompt_embeds_cache_gib: float = DEFAULT_CACHE_GIB
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    max_in_flight_bytes: int = DEFAULT_MAX_IN_FLIGHT_BYTES
    decode_workers: int = DEFAULT_DECODE_WORKERS
    fair_share_bytes_per_second: int = DEFAULT_FAIR_SHARE_BYTES_PER_SECOND
    """0: large bodies are not metered per key."""
    tenant_share_percent: int = DEFAULT_TENANT_SHARE_PERCENT
    """The most of `max_in_flight`, `max_body_reads` and `max_in_flight_bytes` one client
    identity may hold (`tenancy.shares`); 100: no share."""
    turboquant_dtype: str = DEFAULT_TURBOQUANT_DTYPE
    upstream_timeout_seconds: float = DEFAULT_UPSTREAM_TIMEOUT_SECONDS
    workers: int = DEFAULT_WORKERS
    max_body_reads: int = DEFAULT_MAX_BODY_READS
    header_timeout_seconds: float = DEFAULT_HEADER_TIMEOUT_SECONDS
    body_timeout_seconds: float = DEFAULT_BODY_TIMEOUT_SECONDS
    max_prompt_embeds_references: int = DEFAULT_MAX_PROMPT_EMBEDS_REFERENCES
    write_timeout_seconds: float = DEFAULT_WRITE_TIMEOUT_SECONDS
    """A write to a client waiting longer than this cuts the connection."""
    send_buffer_bytes: int = DEFAULT_SEND_BUFFER_BYTES
    allow_client_priority: bool = DEFAULT_ALLOW_CLIENT_PRIORITY
    """False: `X-Vllm-Priority` is removed and a non-zero body `priority` refused."""
    allow_engine_state: bool = DEFAULT_ALLOW_ENGINE_STATE
    """False: a non-null `VLLM_ENGINE_STATE_FIELDS` field is refused (null ones removed)."""
    lifecycle_listen: str = DEFAULT_LIFECYCLE_LISTEN
    """Empty: no lifecycle socket."""
    lame_duck_seconds: float = DEFAULT_LAME_DUCK_SECONDS
    identity_header: str = DEFAULT_IDENTITY_HEADER
    """The header the gateway's authentication sets; the front never reads it (a pod can be
    reached directly), only removes it: the account comes from the step's attestation."""
    identity_bearer: bool = DEFAULT_IDENTITY_BEARER
    identity_required: bool = DEFAULT_IDENTITY_REQUIRED

    def __post_init__(self) -> None:
        """Every value checked once, in this order: addresses, names, the policy, the
        capacities, then the deadlines and the remaining bounds (the first wrong one is
        the one named)."""
        self._check_addresses()
        self._check_names()
        check_policy_settings(self)
        self._check_capacities()
        self._check_deadlines_and_bounds()

    def _check_addresses(self) -> None:
        parts = urlsplit(self.upstream)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SettingsError(
                f"upstream {self.upstream!r} must be an http URL, e.g. {DEFAULT_UPSTREAM}"
            )
        parse_listen(self.listen)
        if self.lifecycle_listen:
            parse_listen(self.lifecycle_listen)
        if not 0 <= self.lame_duck_seconds <= 600:
            raise SettingsError(
                f"lame duck seconds {self.lame_duck_seconds} must be between 0 and 600"
            )

    def _check_names(self) -> None:
        try:
            # the grammar the API checks; empty switches the feature off
            for label, header in (
                ("session header", self.session_header),
                ("prompt-tokens header", self.prompt_tokens_header),
                ("cached-prompt-tokens header", self.cached_prompt_tokens_header),
            ):
                check_header_name(label, header, optional=True)
            check_cache_gib(SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR, self.prompt_embeds_cache_gib)
        except (GrammarError, SettingInputError) as exc:
            raise SettingsError(str(exc)) from None

    def _check_capacities(self) -> None:
        if self.max_body_bytes < 1024:
            raise SettingsError(f"max body bytes {self.max_body_bytes} is below 1024")
        if self.fair_share_bytes_per_second < 0:
            raise SettingsError(
                f"fair share {self.fair_share_bytes_per_second} bytes/s must be 0 (off) or more"
            )
        if not 1 <= self.tenant_share_percent <= 100:
            raise SettingsError(
                f"tenant share {self.tenant_share_percent} % must be between 1 and 100"
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

    def _check_deadlines_and_bounds(self) -> None:
        if not self.upstream_timeout_seconds > 0:
            raise SettingsError("upstream timeout must be a positive number of seconds")
        if self.max_body_reads < 1:
            raise SettingsError(f"max body reads {self.max_body_reads} must be at least 1")
        if not self.header_timeout_seconds > 0 or not self.body_timeout_seconds > 0:
            raise SettingsError("header and body timeouts must be positive numbers of seconds")
        if not self.write_timeout_seconds > 0:
            raise SettingsError("write timeout must be a positive number of seconds")
        if self.send_buffer_bytes < 4096:
            raise SettingsError(f"send buffer bytes {self.send_buffer_bytes} is below 4096")
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
        return cache_gib_to_bytes(self.prompt_embeds_cache_gib)

    @property
    def needs_salt_key(self) -> bool:
        """Only salting modes read the secret; Shared never derives a salt."""
        return needs_salt_key(self.isolation_mode)

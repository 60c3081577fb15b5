"""What the gateway's policy step needs to run, validated once, free of gRPC imports.

Kept apart from the proxy so `promptcache gateway-policy --help` and settings errors work
without the `gateway` extra, and so the renderer's defaults and the step's agree by
importing the same definitions from `promptcache.contract.gateway_policy`, whose rows also
carry each value's bounds (`check_rows`); the fields are typed here by hand for mypy, and a
test holds them to the rows. The isolation settings
are the policy's own (`tenancy.settings.PolicySettings`), checked by the same rules as the
cache front's: both processes run `tenancy.policy`.
"""

from __future__ import annotations

from dataclasses import dataclass

from promptcache.contract import (
    DEFAULT_ISOLATION_FIELD,
    DEFAULT_ISOLATION_HEADER,
    DEFAULT_SESSION_HEADER,
    SALT_KEY_FILE,
    SESSION_USER_FIELD,
    IsolationMode,
)
from promptcache.contract.front import (
    DEFAULT_ALLOW_CLIENT_PRIORITY,
    DEFAULT_ALLOW_ENGINE_STATE,
    DEFAULT_FAIR_SHARE_BYTES_PER_SECOND,
    DEFAULT_HONOR_MAX_LEN,
    DEFAULT_IDENTITY_BEARER,
    DEFAULT_IDENTITY_HEADER,
    DEFAULT_IDENTITY_REQUIRED,
    DEFAULT_ISOLATION_MODE,
    DEFAULT_TENANT_SHARE_PERCENT,
)
from promptcache.contract.gateway_policy import (
    DEFAULT_GATEWAY_POLICY_BODY_TIMEOUT_SECONDS,
    DEFAULT_GATEWAY_POLICY_DRAIN_SECONDS,
    DEFAULT_GATEWAY_POLICY_LISTEN,
    DEFAULT_GATEWAY_POLICY_MAX_BODY_BYTES,
    DEFAULT_GATEWAY_POLICY_MAX_BUFFERED_BYTES,
    DEFAULT_GATEWAY_POLICY_METRICS_LISTEN,
    DEFAULT_GATEWAY_POLICY_UPSTREAM,
    DEFAULT_GATEWAY_POLICY_WORKERS,
    GATEWAY_POLICY_SETTINGS,
)
from promptcache.contract.settings import SettingsError, check_rows, split_host_port
from promptcache.tenancy.settings import PolicySettings

__all__ = ["GatewayPolicySettings", "SettingsError"]


@dataclass(frozen=True, slots=True)
class GatewayPolicySettings:
    """The policy step's whole configuration (flags over environment over these defaults)."""

    listen: str = DEFAULT_GATEWAY_POLICY_LISTEN
    upstream: str = DEFAULT_GATEWAY_POLICY_UPSTREAM
    session_header: str = DEFAULT_SESSION_HEADER
    """Empty: the step names no sessions (the picker has no session plugin, or sessions
    are off)."""
    user_field: str = SESSION_USER_FIELD
    """Empty: the body's `user` does not name sessions (`prompt_cache_key` still does)."""
    max_body_bytes: int = DEFAULT_GATEWAY_POLICY_MAX_BODY_BYTES
    max_buffered_bytes: int = DEFAULT_GATEWAY_POLICY_MAX_BUFFERED_BYTES
    drain_seconds: float = DEFAULT_GATEWAY_POLICY_DRAIN_SECONDS
    body_timeout_seconds: float = DEFAULT_GATEWAY_POLICY_BODY_TIMEOUT_SECONDS
    """A body still arriving this long after its headers is refused with HTTP 408."""
    metrics_listen: str = DEFAULT_GATEWAY_POLICY_METRICS_LISTEN
    """Empty: serve no metrics."""
    isolation_mode: IsolationMode = DEFAULT_ISOLATION_MODE
    isolation_header: str = DEFAULT_ISOLATION_HEADER
    isolation_field: str = DEFAULT_ISOLATION_FIELD
    salt_key_file: str = SALT_KEY_FILE
    honor_prompt_cache_max_len: bool = DEFAULT_HONOR_MAX_LEN
    allow_client_priority: bool = DEFAULT_ALLOW_CLIENT_PRIORITY
    allow_engine_state: bool = DEFAULT_ALLOW_ENGINE_STATE
    fair_share_bytes_per_second: int = DEFAULT_FAIR_SHARE_BYTES_PER_SECOND
    """The front's meter (`tenancy.fair_share`), one per step process: 0 turns it off."""
    tenant_share_percent: int = DEFAULT_TENANT_SHARE_PERCENT
    """The front's: the most of a worker's byte budget one client identity may hold
    (`tenancy.shares`); 100: no share."""
    """The front's: a state field the front refuses is refused here, before routing."""
    workers: int = DEFAULT_GATEWAY_POLICY_WORKERS
    """Processes serving `listen` together (SO_REUSEPORT). Each relays about one core's worth
    of streams and holds an equal share of `max_buffered_bytes`."""
    identity_header: str = DEFAULT_IDENTITY_HEADER
    """The header the gateway's authentication sets to the caller's account; read here
    only (the step runs behind that authentication) and vouched for to the front."""
    identity_bearer: bool = DEFAULT_IDENTITY_BEARER
    identity_required: bool = DEFAULT_IDENTITY_REQUIRED

    def __post_init__(self) -> None:
        """Every value checked against its row (`GATEWAY_POLICY_SETTINGS`, in row order),
        then the rules between settings, then the isolation settings by the policy's own
        rules."""
        check_rows(GATEWAY_POLICY_SETTINGS, self)
        if self.max_buffered_bytes < self.max_body_bytes:
            raise SettingsError(
                f"--max-buffered-bytes={self.max_buffered_bytes} must be at least "
                f"--max-body-bytes={self.max_body_bytes}"
            )
        if self.workers > 1 and split_host_port("--listen", self.listen)[1] == 0:
            raise SettingsError(
                f"--workers={self.workers} needs a fixed --listen port (port 0 would give "
                "each worker a port of its own)"
            )
        if self.max_buffered_bytes // self.workers < self.max_body_bytes:
            raise SettingsError(
                f"--max-buffered-bytes={self.max_buffered_bytes} is shared by "
                f"--workers={self.workers}: each share must be at least "
                f"--max-body-bytes={self.max_body_bytes}; raise it to "
                f"{self.workers * self.max_body_bytes} or more"
            )
        self.policy()  # the isolation settings, checked by the policy's own rules

    @property
    def worker_budget(self) -> int:
        """Body bytes one worker's streams may hold together: an equal share."""
        return self.max_buffered_bytes // self.workers

    def policy(self) -> PolicySettings:
        """The request policy's settings: the same isolation as the front's, no session
        header and no usage (the front's business, after the pick)."""
        return PolicySettings(
            isolation_mode=self.isolation_mode,
            isolation_header=self.isolation_header,
            isolation_field=self.isolation_field,
            salt_key_file=self.salt_key_file,
            honor_prompt_cache_max_len=self.honor_prompt_cache_max_len,
            allow_client_priority=self.allow_client_priority,
            allow_engine_state=self.allow_engine_state,
            identity_header=self.identity_header,
            identity_bearer=self.identity_bearer,
            identity_required=self.identity_required,
        )

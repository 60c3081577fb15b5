"""What the request policy reads, and the isolation settings' own checks: defined once.

Both data-plane processes run the same policy (`tenancy.policy`): the cache front in the
model-server pod, and the gateway's policy step beside the picker. Each has a
configuration of its own (`FrontSettings`, `GatewayPolicySettings`), so the policy names only what
it reads (`PolicyReader`), both check the isolation settings with `check_isolation`, and
the step builds a `PolicySettings` instead of borrowing the front's whole configuration.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from promptcache.contract import (
    DEFAULT_ISOLATION_FIELD,
    DEFAULT_ISOLATION_HEADER,
    SALT_KEY_FILE,
    GrammarError,
    IsolationMode,
    SettingsError,
    check_body_field,
    check_header_name,
    needs_salt_key,
)
from promptcache.contract.front import (
    DEFAULT_ALLOW_CLIENT_PRIORITY,
    DEFAULT_ALLOW_ENGINE_STATE,
    DEFAULT_HONOR_MAX_LEN,
    DEFAULT_IDENTITY_BEARER,
    DEFAULT_IDENTITY_HEADER,
    DEFAULT_IDENTITY_REQUIRED,
    DEFAULT_ISOLATION_MODE,
)
from promptcache.tenancy.identity import IdentityReader

__all__ = [
    "MIN_SALT_KEY_BYTES",
    "PolicyReader",
    "PolicySettings",
    "SaltKeySource",
    "SettingsError",
    "check_isolation",
    "check_policy_settings",
    "read_mounted_salt_key",
    "read_salt_key",
]

MIN_SALT_KEY_BYTES: Final[int] = 16
"""A shorter HMAC key would make per-tenant salts guessable."""


class PolicyReader(IdentityReader, Protocol):
    """The settings `tenancy.policy.apply_policy` reads (`FrontSettings` has them all)."""

    @property
    def isolation_mode(self) -> IsolationMode: ...
    @property
    def isolation_header(self) -> str: ...
    @property
    def isolation_field(self) -> str: ...
    @property
    def honor_prompt_cache_max_len(self) -> bool: ...
    @property
    def allow_client_priority(self) -> bool: ...
    @property
    def allow_engine_state(self) -> bool: ...
    @property
    def session_header(self) -> str: ...
    @property
    def session_from_user(self) -> bool: ...
    @property
    def usage_headers_enabled(self) -> bool: ...


class SaltKeySource(Protocol):
    """Where a process finds its salt key, and whether its mode needs one."""

    @property
    def isolation_mode(self) -> IsolationMode: ...
    @property
    def salt_key_file(self) -> str: ...


def check_isolation(
    mode: IsolationMode,
    header: str,
    field: str,
    *,
    identity_header: str = "",
    identity_bearer: bool = False,
    identity_required: bool = False,
) -> None:
    """The isolation settings either process refuses to start with."""
    try:
        check_header_name("isolation header", header, optional=True)
        check_body_field("isolation field", field, optional=True)
        check_header_name("identity header", identity_header, optional=True)
    except GrammarError as exc:
        raise SettingsError(str(exc)) from None
    if mode is IsolationMode.REQUIRED and not (header or field):
        raise SettingsError(
            "isolation mode Required needs an isolation header or an isolation field "
            "to carry the key; both are empty"
        )
    by_account = bool(identity_header) or identity_bearer
    if by_account and mode is IsolationMode.SHARED:
        raise SettingsError(
            "isolation by account derives salts, which isolation mode Shared never does; "
            "set the isolation mode to PerKey or Required, or name no identity source"
        )
    if identity_required and not by_account:
        raise SettingsError(
            "identity required names no source for the account: set an identity header "
            "or turn on the bearer-token identity"
        )
    if identity_header and identity_header.lower() in (header.lower(), "authorization"):
        raise SettingsError(
            f"the identity header {identity_header!r} cannot also be the isolation-key header "
            "or Authorization: name the header the gateway's authentication sets"
        )


def check_policy_settings(settings: PolicyReader) -> None:
    """`check_isolation` over one process' settings (both processes call it at start)."""
    check_isolation(
        settings.isolation_mode,
        settings.isolation_header,
        settings.isolation_field,
        identity_header=settings.identity_header,
        identity_bearer=settings.identity_bearer,
        identity_required=settings.identity_required,
    )


@dataclass(frozen=True, slots=True)
class PolicySettings:
    """The policy's settings on their own: what the gateway's policy step runs with.

    The step names no session header and asks for no usage (those are the front's
    business after the pick), so those default off."""

    isolation_mode: IsolationMode = DEFAULT_ISOLATION_MODE
    isolation_header: str = DEFAULT_ISOLATION_HEADER
    isolation_field: str = DEFAULT_ISOLATION_FIELD
    salt_key_file: str = SALT_KEY_FILE
    honor_prompt_cache_max_len: bool = DEFAULT_HONOR_MAX_LEN
    allow_client_priority: bool = DEFAULT_ALLOW_CLIENT_PRIORITY
    allow_engine_state: bool = DEFAULT_ALLOW_ENGINE_STATE
    session_header: str = ""
    session_from_user: bool = False
    usage_headers_enabled: bool = False
    identity_header: str = DEFAULT_IDENTITY_HEADER
    identity_bearer: bool = DEFAULT_IDENTITY_BEARER
    identity_required: bool = DEFAULT_IDENTITY_REQUIRED

    def __post_init__(self) -> None:
        check_policy_settings(self)


def read_salt_key(settings: SaltKeySource) -> bytes | None:
    """Load the HMAC secret, refusing to start a salting mode without a usable one.

    Without the secret, PerKey would have to either share every tenant's cache
    (a silent privacy failure) or use the raw key as the salt (guessable), so
    the process stops instead.
    """
    if not needs_salt_key(settings.isolation_mode):
        return None
    return _read_key(settings)


def read_mounted_salt_key(settings: SaltKeySource) -> bytes | None:
    """The salt key in any mode: a salting mode's, or, in mode Shared, the one the renderer
    mounts only so that the front can check promptcache's picker's signed predictions
    (`tenancy.prediction`); None in Shared when nothing is mounted (no prediction is then
    believed). A key that is mounted but unusable stops the process, in every mode."""
    if needs_salt_key(settings.isolation_mode) or Path(settings.salt_key_file).is_file():
        return _read_key(settings)
    return None


def _read_key(settings: SaltKeySource) -> bytes:
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

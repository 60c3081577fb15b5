"""The per-request rules of spec/004: named steps over headers and body, one composition.

Pure (no I/O, no clock; the only randomness is the one-off salt of an
uncacheable request) so every rule is testable without a server, and so the
HTTP layer stays a thin shell around it. Both data-plane processes run it: the
cache front before vLLM, the gateway's policy step before the picker hashes the
prompt, so a tenant's salt, and every refusal, is the same in both.

The steps, in the order `apply_policy` runs them (each a function of its own):
`strip_client_fields` (the client's own salt and request id never pass), the
field checks (`check_priority`, `check_engine_state`), `isolation_key` (the key),
`max_len` (the uncacheable request), `check_route_isolated`, `check_uncacheable`,
`check_identity` (a malformed account source), `require_identity` and `require_key`
(refusals), `salt` (the salt decision), `usage`
(asking vLLM for the usage chunk) and `session` (the session header from `user`).

The caller's account (`tenancy.identity.Account`) is an input, not read here: the gateway's
policy step reads it behind the gateway's authentication, the cache front takes it only
from the step's signed attestation (`tenancy.attestation`). Given one, the salt is the
account's (and its key's); both processes pass the same account, so they derive the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from multidict import MultiMapping
from pydantic import TypeAdapter, ValidationError

from promptcache.contract import (
    CACHE_SALT_FIELD,
    PROMPT_CACHE_MAX_LEN_FIELD,
    SESSION_USER_FIELD,
    IsolationMode,
)
from promptcache.contract.front import (
    VLLM_ENGINE_STATE_FIELDS,
    VLLM_PRIORITY_FIELD,
    VLLM_REQUEST_ID_FIELD,
)
from promptcache.tenancy.errors import (
    FIELD_NOT_ALLOWED,
    IDENTITY_REQUIRED,
    INVALID_FIELD,
    INVALID_ISOLATION_KEY,
    INVALID_PROMPT_CACHE_MAX_LEN,
    ISOLATION_KEY_REQUIRED,
    PRIORITY_NOT_ALLOWED,
    PROMPT_CACHE_MAX_LEN_NOT_SUPPORTED,
    ROUTE_NOT_ISOLATED,
    FrontError,
)
from promptcache.tenancy.identity import Account, check_identity_sources, identity_carriers
from promptcache.tenancy.routes import Route, RouteClass
from promptcache.tenancy.salt import (
    UNCACHEABLE_SALT_PREFIX,
    derive_account_salt,
    derive_salt,
    random_salt,
)
from promptcache.tenancy.settings import PolicyReader

MAX_ISOLATION_KEY_CHARS: Final[int] = 4096
_OPTIONAL_INT: Final = TypeAdapter(int | None)
"""vLLM's request models type `priority` as `int` (lax: "3", 3.0 and true count)."""
_OPTIONAL_BOOL: Final = TypeAdapter(bool | None)
"""vLLM's request models type `stream`, `stream_options.include_usage` and
`continuous_usage_stats` as `bool | None` and validate them in pydantic's lax
mode ("true", "on", 1 and 1.0 are True): the front coerces with the same
adapter, so it reads these fields exactly as vLLM will, and forwards the
coerced value."""


def has_lone_surrogate(text: str) -> bool:
    """Whether `text` holds a UTF-16 surrogate (no valid UTF-8 encodes one)."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _has_control(text: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)


def coerce_bool(container: dict[str, Any], name: str, param: str) -> bool | None:
    """Read one optional boolean field as vLLM does, write the coerced value back."""
    if name not in container:
        return None
    raw = container[name]
    try:
        value = _OPTIONAL_BOOL.validate_python(raw)
    except ValidationError:
        raise FrontError(
            400,
            INVALID_FIELD,
            f"{param} must be a boolean (true or false), got {str(raw)[:40]!r}",
            param=param,
        ) from None
    container[name] = value
    return value


class Isolation(StrEnum):
    """What the policy decided for one request (a metric label)."""

    SHARED = "shared"
    """Mode Shared: no salt at all."""
    KEYED = "keyed"
    """A key was sent and became an HMAC salt."""
    ACCOUNT = "account"
    """An authenticated account (and its key, when sent) became an HMAC salt."""
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
    """The request carried a `cache_salt` other than the policy's own (`foreign_salt`)."""
    stream: bool
    strip_usage_chunk: bool
    """The front asked vLLM for a usage chunk the client did not ask for."""
    session_header_value: str | None
    """Value for the session header when the front copies `user` into it."""
    max_len_not_enforced: bool
    """A positive prompt_cache_max_len was accepted but vLLM cannot enforce it."""
    client_request_id_removed: bool = False
    """The body named its own `request_id` (vLLM's id for it); removed."""


def isolation_key(
    headers: MultiMapping[str], body: dict[str, Any], settings: PolicyReader
) -> str | None:
    """The key the client sent, from header or body, or None; malformed keys raise.

    An empty header or field name means "do not read one" (the resource says so).
    """
    header_values = (
        set(headers.getall(settings.isolation_header, ())) if settings.isolation_header else set()
    )
    if len(header_values) > 1:
        raise FrontError(
            400,
            INVALID_ISOLATION_KEY,
            f"the request carries {len(header_values)} different {settings.isolation_header} "
            "headers; send exactly one isolation key",
            param=settings.isolation_header,
        )
    header_key = header_values.pop() if header_values else None
    field_present = bool(settings.isolation_field) and settings.isolation_field in body
    field_key = body.pop(settings.isolation_field, None) if field_present else None
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
            param=settings.isolation_field or settings.isolation_header,
        )
    key = keys.pop() if keys else None
    if key is not None and has_lone_surrogate(key):
        raise FrontError(
            400,
            INVALID_ISOLATION_KEY,
            "the isolation key is not valid Unicode (it holds a lone surrogate or bytes that "
            "are not UTF-8)",
            param=settings.isolation_field,
        )
    if key is not None and len(key) > MAX_ISOLATION_KEY_CHARS:
        raise FrontError(
            400,
            INVALID_ISOLATION_KEY,
            f"the isolation key has {len(key)} characters; at most "
            f"{MAX_ISOLATION_KEY_CHARS} are allowed",
            param=settings.isolation_field or settings.isolation_header,
        )
    return key


def _key_carriers(settings: PolicyReader) -> str:
    """Where a client may put the key, as a phrase ("the x header or the y field")."""
    carriers = []
    if settings.isolation_header:
        carriers.append(f"the {settings.isolation_header} header")
    if settings.isolation_field:
        carriers.append(f"the {settings.isolation_field} field")
    return " or ".join(carriers)


def check_priority(body: dict[str, Any], settings: PolicyReader) -> None:
    """Refuse a scheduling priority unless the deployment lets clients set one.

    vLLM's `priority` (lower runs first under `--scheduling-policy priority`) would let
    one tenant's requests overtake everyone else's in the queue. A value vLLM reads as
    0 (its default) changes nothing and is removed; anything else is a 400.
    """
    if settings.allow_client_priority or VLLM_PRIORITY_FIELD not in body:
        return
    raw = body.pop(VLLM_PRIORITY_FIELD)
    try:
        value = _OPTIONAL_INT.validate_python(raw)
    except ValidationError:
        value = None if raw is None else -1
    if value:
        raise FrontError(
            400,
            PRIORITY_NOT_ALLOWED,
            f"this deployment does not let clients set a scheduling priority; remove "
            f"{VLLM_PRIORITY_FIELD} (or set spec.front.allowClientPriority)",
            param=VLLM_PRIORITY_FIELD,
        )


def check_engine_state(body: dict[str, Any], settings: PolicyReader) -> None:
    """Refuse the fields through which a tenant reaches engine state beyond its request
    (another stored response, remote KV blocks, plugin arguments) unless the deployment
    allows them; a null one is removed."""
    if settings.allow_engine_state:
        return
    for name in VLLM_ENGINE_STATE_FIELDS:
        if name in body and body.pop(name) is not None:
            raise FrontError(
                400,
                FIELD_NOT_ALLOWED,
                f"this deployment does not let clients set {name} (it reaches the model "
                "server's state beyond this request); remove it",
                param=name,
            )


def max_len(body: dict[str, Any], settings: PolicyReader) -> int | None:
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


def strip_client_fields(body: dict[str, Any]) -> tuple[Any, bool]:
    """Remove the client's own `cache_salt` (a forged salt must neither read another
    tenant's cache nor steer routing) and `request_id` (vLLM's id for the request: vLLM
    makes one; the front sends its own in X-Request-Id, which wins where vLLM reads both).
    The salt that was there (None: none), and whether a request id was."""
    salt_sent = body.pop(CACHE_SALT_FIELD, None)
    request_id_removed = body.pop(VLLM_REQUEST_ID_FIELD, None) is not None
    return salt_sent, request_id_removed


def foreign_salt(sent: Any, isolation: Isolation, derived: str | None) -> bool:
    """Whether the `cache_salt` a request arrived with was not the policy's own: behind the
    gateway every keyed request arrives with the salt the policy step derived (the same the
    front derives), which is not a client's doing; anything else is (a forged or stale salt,
    or one where the policy sets none). A one-off salt is the step's when the request is
    uncacheable here too."""
    if sent is None or sent == derived:
        return False
    return not (
        isolation is Isolation.UNCACHEABLE
        and isinstance(sent, str)
        and sent.startswith(UNCACHEABLE_SALT_PREFIX)
    )


def check_route_isolated(route: Route, mode: IsolationMode) -> None:
    """Refuse a salted route that fills the shared cache but has no `cache_salt` to carry
    the tenant's salt, unless nothing is isolated anyway."""
    if (
        route.kind is RouteClass.SALTED
        and mode is not IsolationMode.SHARED
        and route.reaches_kv_cache
        and not route.salt_field
    ):
        raise FrontError(
            403,
            ROUTE_NOT_ISOLATED,
            f"{route.path} fills the shared prefix cache but vLLM's request model for it has "
            f"no cache_salt, so isolation mode {mode.value} cannot be enforced on it; use "
            "/v1/chat/completions instead",
        )


def check_uncacheable(route: Route, limit: int | None) -> None:
    """Refuse `prompt_cache_max_len: 0` where it cannot be honoured: a route that fills the
    prefix cache but whose vLLM request model has no `cache_salt` (`/cohere/v2/chat`), so
    no one-off salt can keep the prompt out of the shared cache."""
    salted = route.kind is RouteClass.SALTED and route.reaches_kv_cache
    if limit == 0 and salted and not route.salt_field:
        raise FrontError(
            400,
            PROMPT_CACHE_MAX_LEN_NOT_SUPPORTED,
            f"{PROMPT_CACHE_MAX_LEN_FIELD}: 0 cannot be honoured on {route.path}: vLLM's "
            "request model for it has no cache_salt, so the prompt would be cached and "
            f"shared anyway; remove {PROMPT_CACHE_MAX_LEN_FIELD} or use /v1/chat/completions",
            param=PROMPT_CACHE_MAX_LEN_FIELD,
        )


def check_identity(route: Route, headers: MultiMapping[str], settings: PolicyReader) -> None:
    """Isolation by account: a salted request whose identity header or bearer token is
    malformed is refused (HTTP 400 `invalid_identity`), as the gateway's policy step refuses
    it before anything else (`tenancy.identity.check_identity_sources`; no account is read
    here: the front takes the account only from the step's attestation)."""
    if route.kind is RouteClass.SALTED:
        check_identity_sources(headers, settings)


def require_identity(route: Route, account: Account | None, settings: PolicyReader) -> None:
    """Isolation by account, required: a salted request without an authenticated account
    is refused (HTTP 401), at the gateway and at the front alike."""
    if settings.identity_required and account is None and route.kind is RouteClass.SALTED:
        raise FrontError(
            401,
            IDENTITY_REQUIRED,
            "this deployment serves authenticated accounts only, and the request has none: "
            f"send it through the gateway with {identity_carriers(settings)}",
            param=settings.identity_header or "Authorization",
        )


def require_key(route: Route, key: str | None, settings: PolicyReader) -> None:
    """Mode Required: a salted request without a key is refused."""
    required = settings.isolation_mode is IsolationMode.REQUIRED
    if key is None and required and route.kind is RouteClass.SALTED:
        raise FrontError(
            400,
            ISOLATION_KEY_REQUIRED,
            f"this deployment requires an isolation key: send {_key_carriers(settings)} "
            "with a string that names who may share cached prompts",
            param=settings.isolation_field or settings.isolation_header,
        )


def salt(
    route: Route,
    key: str | None,
    limit: int | None,
    mode: IsolationMode,
    secret: bytes | None,
    *,
    account: Account | None = None,
) -> tuple[Isolation, str | None]:
    """What isolates the request, and the salt vLLM gets (None: no salt at all).

    `prompt_cache_max_len: 0` on a salted route gets a one-off salt (it shares nothing);
    Shared mode salts nothing; an account gets its own salt (one per key it sends); PerKey
    without a key or an account is the unsalted shared scope; a key alone becomes the HMAC
    of the secret, a scope no account's salt ever equals."""
    if route.kind is RouteClass.SALTED and limit == 0:
        return Isolation.UNCACHEABLE, random_salt()
    if mode is IsolationMode.SHARED:
        return Isolation.SHARED, None
    if key is None and account is None:
        return Isolation.UNKEYED, None
    if secret is None:  # settings guarantee a secret in salting modes
        raise RuntimeError("a salting isolation mode is running without its secret")
    if account is not None:
        return Isolation.ACCOUNT, derive_account_salt(secret, account.digest, key)
    assert key is not None  # narrowed above
    return Isolation.KEYED, derive_salt(secret, key)


def usage(route: Route, body: dict[str, Any], settings: PolicyReader) -> tuple[bool, bool]:
    """Read `stream` and `stream_options` as vLLM will; on a streamed route that carries
    usage, ask vLLM for the usage chunk the usage headers need. Whether the request
    streams, and whether the front must strip a usage chunk the client did not ask for."""
    stream = coerce_bool(body, "stream", "stream") is True
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise FrontError(
            400,
            INVALID_FIELD,
            'stream_options must be an object, e.g. {"include_usage": true}',
            param="stream_options",
        )
    include = None
    if options is not None:
        include = coerce_bool(options, "include_usage", "stream_options.include_usage")
        coerce_bool(options, "continuous_usage_stats", "stream_options.continuous_usage_stats")
    if not (stream and route.usage_stream and settings.usage_headers_enabled):
        return stream, False
    if options is None:
        body["stream_options"] = {"include_usage": True}
        return stream, True
    if not include:
        options["include_usage"] = True
        return stream, True
    return stream, False


def session(headers: MultiMapping[str], body: dict[str, Any], settings: PolicyReader) -> str | None:
    """The session header value to copy from `user`, when the deployment does that and
    the client sent no header; a `user` a header could not carry is refused."""
    user = body.get(SESSION_USER_FIELD)
    if isinstance(user, str) and (_has_control(user) or has_lone_surrogate(user)):
        raise FrontError(
            400,
            INVALID_FIELD,
            f"{SESSION_USER_FIELD} must not contain control characters (CR, LF, NUL, ...) or "
            "invalid Unicode",
            param=SESSION_USER_FIELD,
        )
    if (
        settings.session_from_user
        and settings.session_header
        and settings.session_header not in headers
        and isinstance(user, str)
        and user
    ):
        return user
    return None


def apply_policy(
    route: Route,
    headers: MultiMapping[str],
    body: dict[str, Any],
    settings: PolicyReader,
    secret: bytes | None,
    *,
    account: Account | None = None,
) -> Plan:
    """Rewrite `body` in place for vLLM and say what else the proxy must do.

    `headers` must be a case-insensitive multidict (aiohttp's `CIMultiDictProxy`).
    `account`: the caller's authenticated account, or None (see the module's docstring).
    Raises `FrontError` for requests the policy refuses.
    """
    salt_sent, request_id_removed = strip_client_fields(body)
    check_identity(route, headers, settings)  # first, as the step reads the account first
    check_priority(body, settings)
    check_engine_state(body, settings)
    key = isolation_key(headers, body, settings)
    limit = max_len(body, settings)
    check_route_isolated(route, settings.isolation_mode)
    check_uncacheable(route, limit)
    require_identity(route, account, settings)
    require_key(route, key, settings)
    isolation, salt_value = salt(
        route, key, limit, settings.isolation_mode, secret, account=account
    )
    salted_path = route.kind is RouteClass.SALTED
    if salt_value is not None and salted_path and route.salt_field:
        body[CACHE_SALT_FIELD] = salt_value
    stream, strip_usage = usage(route, body, settings)
    return Plan(
        isolation=isolation,
        salt=salt_value if salted_path else None,
        use_embeds_cache=isolation is not Isolation.UNCACHEABLE,
        client_salt_removed=foreign_salt(salt_sent, isolation, salt_value),
        stream=stream,
        strip_usage_chunk=strip_usage,
        session_header_value=session(headers, body, settings),
        max_len_not_enforced=limit is not None and limit > 0,
        client_request_id_removed=request_id_removed,
    )

"""The gateway policy step's settings: each variable, flag, parser, default and bounds, declared
once.

The renderer writes these variables into the Endpoint Picker pod's `gateway-policy`
container; `promptcache gateway-policy` reads them (flags winning) into `GatewayPolicySettings`.
The isolation settings are the cache front's own declarations (same variables, parsers and
defaults), so the step and the front derive the same salt from the same configuration.
"""

from __future__ import annotations

from typing import Any, Final

from promptcache.contract.front import (
    DEFAULT_BODY_TIMEOUT_SECONDS,
    FRONT_SETTINGS,
    FrontEnv,
)
from promptcache.contract.names import (
    DEFAULT_SESSION_HEADER,
    EPP_EXT_PROC_PORT,
    EPP_LOCAL_GRPC_PORT,
    GATEWAY_POLICY_METRICS_PORT,
    SESSION_USER_FIELD,
)
from promptcache.contract.settings import (
    Bounds,
    Setting,
    as_float,
    as_int,
    check_host_port,
    check_optional_body_field,
    check_optional_header_name,
    check_optional_host_port,
    parse_host_port,
    parse_optional_body_field,
    parse_optional_header_name,
    parse_optional_host_port,
)


class GatewayPolicyEnv:
    """Environment variables the renderer sets on the `gateway-policy` container.

    Each has a matching `promptcache gateway-policy` flag; the flag wins when both are given.
    """

    LISTEN: Final[str] = "PROMPTCACHE_GATEWAY_POLICY_LISTEN"
    """HOST:PORT the step serves ext_proc on (what the gateway dials)."""
    UPSTREAM: Final[str] = "PROMPTCACHE_GATEWAY_POLICY_UPSTREAM"
    """HOST:PORT of the Endpoint Picker's own ext_proc port (plain gRPC over loopback)."""
    SESSION_HEADER: Final[str] = FrontEnv.SESSION_HEADER
    """The session-affinity header the EPP's session filter reads; empty: name no sessions."""
    USER_FIELD: Final[str] = "PROMPTCACHE_GATEWAY_POLICY_USER_FIELD"
    """The body field naming the session after `prompt_cache_key`; empty: none."""
    MAX_BODY_BYTES: Final[str] = "PROMPTCACHE_GATEWAY_POLICY_MAX_BODY_BYTES"
    """Largest body one request may have; larger ones get the front's HTTP 413."""
    MAX_BUFFERED_BYTES: Final[str] = "PROMPTCACHE_GATEWAY_POLICY_MAX_BUFFERED_BYTES"
    """Body bytes all streams together may hold; beyond it requests get HTTP 503."""
    DRAIN_SECONDS: Final[str] = "PROMPTCACHE_GATEWAY_POLICY_DRAIN_SECONDS"
    """How long in-flight streams may finish after SIGTERM."""
    BODY_TIMEOUT_SECONDS: Final[str] = "PROMPTCACHE_GATEWAY_POLICY_BODY_TIMEOUT_SECONDS"
    """How long a request's body may take to arrive once its headers have; then HTTP 408."""
    METRICS_LISTEN: Final[str] = "PROMPTCACHE_GATEWAY_POLICY_METRICS_LISTEN"
    """HOST:PORT of the step's Prometheus metrics (plain HTTP); empty: none."""
    WORKERS: Final[str] = "PROMPTCACHE_GATEWAY_POLICY_WORKERS"
    """Processes serving the ext_proc port together (SO_REUSEPORT); one core each."""
    ISOLATION_MODE: Final[str] = FrontEnv.ISOLATION_MODE
    ISOLATION_HEADER: Final[str] = FrontEnv.ISOLATION_HEADER
    ISOLATION_FIELD: Final[str] = FrontEnv.ISOLATION_FIELD
    SALT_KEY_FILE: Final[str] = FrontEnv.SALT_KEY_FILE
    HONOR_MAX_LEN: Final[str] = FrontEnv.HONOR_MAX_LEN
    ALLOW_CLIENT_PRIORITY: Final[str] = FrontEnv.ALLOW_CLIENT_PRIORITY
    ALLOW_ENGINE_STATE: Final[str] = FrontEnv.ALLOW_ENGINE_STATE
    FAIR_SHARE_BYTES_PER_SECOND: Final[str] = FrontEnv.FAIR_SHARE_BYTES_PER_SECOND
    TENANT_SHARE_PERCENT: Final[str] = FrontEnv.TENANT_SHARE_PERCENT
    """The front's: the most of the step's byte budget one client identity may hold."""
    """The front's: each key's share of the step's decoding work while others are active."""
    IDENTITY_HEADER: Final[str] = FrontEnv.IDENTITY_HEADER
    IDENTITY_BEARER: Final[str] = FrontEnv.IDENTITY_BEARER
    IDENTITY_REQUIRED: Final[str] = FrontEnv.IDENTITY_REQUIRED


DEFAULT_GATEWAY_POLICY_LISTEN: Final[str] = f"0.0.0.0:{EPP_EXT_PROC_PORT}"
"""Where the gateway dials: the port the EPP Service targets."""
DEFAULT_GATEWAY_POLICY_UPSTREAM: Final[str] = f"127.0.0.1:{EPP_LOCAL_GRPC_PORT}"
"""The EPP's own ext_proc port, inside the pod."""
DEFAULT_GATEWAY_POLICY_MAX_BODY_BYTES: Final[int] = 32 * 1024**2
"""The front's default; the renderer sets the resource's `front.maxRequestBytes`, so the
step refuses with 413 exactly what the front would. Nothing passes unread (that would route
without the tenant's salt or session)."""
DEFAULT_GATEWAY_POLICY_MAX_BUFFERED_BYTES: Final[int] = 64 * 1024**2
"""All streams together; with the per-request cap it bounds what the step holds. Charged
for a body's bytes as they arrive, then for its parse and its re-encoding while it is
decided (so a dense body is charged for what parsing it costs, not for its length)."""
GATEWAY_POLICY_BUDGET_PER_MAX_BODY: Final[int] = 4
"""Working memory deciding one body takes, per byte of it: its bytes, its parse (about
twice a text body's length) and its re-encoding. The renderer gives all streams together
enough that one client's share (`tenantSharePercent`) holds that for one maximal body, so
a stalled body, which holds only its bytes until the body timeout, holds a small part of
the budget (an eighth by default) and no client holds more than its share."""
DEFAULT_GATEWAY_POLICY_BODY_TIMEOUT_SECONDS: Final[float] = DEFAULT_BODY_TIMEOUT_SECONDS
"""The front's: a body arriving slower is refused by both with HTTP 408 `body_timeout`."""
DEFAULT_GATEWAY_POLICY_METRICS_LISTEN: Final[str] = f"0.0.0.0:{GATEWAY_POLICY_METRICS_PORT}"
"""Where the step serves its Prometheus metrics (refusals by code, internal errors)."""
DEFAULT_GATEWAY_POLICY_DRAIN_SECONDS: Final[float] = 30.0
"""In-flight streams may finish this long after SIGTERM (the EPP pod allows 130 s)."""
MAX_GATEWAY_POLICY_DRAIN_SECONDS: Final[float] = 3600.0
DEFAULT_GATEWAY_POLICY_WORKERS: Final[int] = 1
MAX_GATEWAY_POLICY_WORKERS: Final[int] = 64
"""One Python process relays about a core's worth of ext_proc streams (bench/gateway_hop.py);
more processes, on more cores, relay more (docs/endpoint-picker.md, 'Sizing')."""

ISOLATION_FIELDS: Final[tuple[str, ...]] = (
    "isolation_mode",
    "isolation_header",
    "isolation_field",
    "salt_key_file",
    "honor_prompt_cache_max_len",
    "allow_client_priority",
    "allow_engine_state",
    "identity_header",
    "identity_bearer",
    "identity_required",
    "fair_share_bytes_per_second",
    "tenant_share_percent",
)
"""The front's settings the step shares, declaration and all: its isolation, and each key's
fair share of the work bodies cost (the step meters a key as the front does)."""

GATEWAY_POLICY_SETTINGS: Final[tuple[Setting[Any], ...]] = (
    Setting("listen", "--listen", GatewayPolicyEnv.LISTEN, parse_host_port,
            DEFAULT_GATEWAY_POLICY_LISTEN,
            "HOST:PORT to serve ext_proc on (what the gateway dials)", check=check_host_port),
    Setting("upstream", "--upstream", GatewayPolicyEnv.UPSTREAM, parse_host_port,
            DEFAULT_GATEWAY_POLICY_UPSTREAM,
            "HOST:PORT of the Endpoint Picker's own ext_proc port (plain gRPC, loopback)",
            check=check_host_port),
    Setting("session_header", "--session-header", GatewayPolicyEnv.SESSION_HEADER,
            parse_optional_header_name, DEFAULT_SESSION_HEADER,
            "header the EPP's session filter reads; added from the body when absent; "
            "empty: name no sessions", empty_is_unset=False, check=check_optional_header_name),
    Setting("user_field", "--user-field", GatewayPolicyEnv.USER_FIELD,
            parse_optional_body_field, SESSION_USER_FIELD,
            "body field naming the session after prompt_cache_key; empty: none",
            empty_is_unset=False, check=check_optional_body_field),
    Setting("max_body_bytes", "--max-body-bytes", GatewayPolicyEnv.MAX_BODY_BYTES, as_int,
            DEFAULT_GATEWAY_POLICY_MAX_BODY_BYTES,
            "largest request body; larger ones get HTTP 413", bounds=Bounds(1)),
    Setting("max_buffered_bytes", "--max-buffered-bytes", GatewayPolicyEnv.MAX_BUFFERED_BYTES,
            as_int, DEFAULT_GATEWAY_POLICY_MAX_BUFFERED_BYTES,
            "body bytes all requests together may hold; beyond, HTTP 503"),
    Setting("body_timeout_seconds", "--body-timeout-seconds",
            GatewayPolicyEnv.BODY_TIMEOUT_SECONDS, as_float,
            DEFAULT_GATEWAY_POLICY_BODY_TIMEOUT_SECONDS,
            "seconds a body may take to arrive after its headers; then HTTP 408",
            bounds=Bounds(0.0, MAX_GATEWAY_POLICY_DRAIN_SECONDS, above=True)),
    Setting("metrics_listen", "--metrics-listen", GatewayPolicyEnv.METRICS_LISTEN,
            parse_optional_host_port, DEFAULT_GATEWAY_POLICY_METRICS_LISTEN,
            "HOST:PORT to serve Prometheus metrics on; empty: none", empty_is_unset=False,
            check=check_optional_host_port),
    Setting("drain_seconds", "--drain-seconds", GatewayPolicyEnv.DRAIN_SECONDS, as_float,
            DEFAULT_GATEWAY_POLICY_DRAIN_SECONDS, "how long open streams may finish after SIGTERM",
            bounds=Bounds(0.0, MAX_GATEWAY_POLICY_DRAIN_SECONDS)),
    Setting("workers", "--workers", GatewayPolicyEnv.WORKERS, as_int,
            DEFAULT_GATEWAY_POLICY_WORKERS,
            "processes serving the port together (SO_REUSEPORT), one per core the step may "
            "use; they share --max-buffered-bytes equally",
            bounds=Bounds(1, MAX_GATEWAY_POLICY_WORKERS)),
    *(s for s in FRONT_SETTINGS if s.field in ISOLATION_FIELDS),
)  # fmt: skip

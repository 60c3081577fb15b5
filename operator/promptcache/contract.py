"""Names shared by the control plane and the data plane, written down once.

The renderer writes these into pods and the cache front reads them back, so a
typo on either side would silently switch a feature off. Both sides import them
from here. This module must stay free of heavy imports (no torch, no Kubernetes
client): the operator and the front both load it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

# --- spec/000: the prompt-embeds cache size, per API-server process -----------
SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR: Final[str] = "SG_PROMPT_EMBEDS_CACHE_GIB"

# --- spec/004: what clients send ----------------------------------------------
DEFAULT_ISOLATION_HEADER: Final[str] = "x-prompt-cache-isolation-key"
DEFAULT_ISOLATION_FIELD: Final[str] = "prompt_cache_isolation_key"
PROMPT_CACHE_MAX_LEN_FIELD: Final[str] = "prompt_cache_max_len"
DEFAULT_SESSION_HEADER: Final[str] = "x-session-affinity"
SESSION_USER_FIELD: Final[str] = "user"
# --- spec/004: what clients get back --------------------------------------------
DEFAULT_PROMPT_TOKENS_HEADER: Final[str] = "dashflow-prompt-tokens"
DEFAULT_CACHED_PROMPT_TOKENS_HEADER: Final[str] = "dashflow-cached-prompt-tokens"

# --- vLLM request field the isolation policy controls -------------------------
CACHE_SALT_FIELD: Final[str] = "cache_salt"


class IsolationMode(StrEnum):
    """How the cache front turns an isolation key into vLLM's `cache_salt`."""

    SHARED = "Shared"
    """No salt: every request shares one cache (spec/004's dedicated default)."""
    PER_KEY = "PerKey"
    """A key, when sent, becomes an HMAC-derived salt; requests without one share."""
    REQUIRED = "Required"
    """Every request must carry a key; one without gets HTTP 400."""


# --- the model-server pod's shape ---------------------------------------------
SERVING_PORT: Final[int] = 8000
"""The port the InferencePool targets: the cache front's, or vLLM's without a front."""
VLLM_LOCAL_PORT: Final[int] = 8001
"""vLLM's port when a cache front stands in front of it; bound to 127.0.0.1 only."""
SALT_KEY_SECRET_KEY: Final[str] = "salt-key"  # noqa: S105 - a key name, not a secret
"""The key inside the salt Secret that holds the HMAC secret."""
SALT_KEY_MOUNT_DIR: Final[str] = "/etc/promptcache/salt"


class FrontEnv:
    """Environment variables the renderer sets on the cache-front container.

    Each has a matching `promptcache front` flag; the flag wins when both are given.
    """

    UPSTREAM: Final[str] = "PROMPTCACHE_UPSTREAM"
    LISTEN: Final[str] = "PROMPTCACHE_LISTEN"
    ISOLATION_MODE: Final[str] = "PROMPTCACHE_ISOLATION_MODE"
    ISOLATION_HEADER: Final[str] = "PROMPTCACHE_ISOLATION_HEADER"
    ISOLATION_FIELD: Final[str] = "PROMPTCACHE_ISOLATION_FIELD"
    SALT_KEY_FILE: Final[str] = "PROMPTCACHE_SALT_KEY_FILE"
    HONOR_MAX_LEN: Final[str] = "PROMPTCACHE_HONOR_PROMPT_CACHE_MAX_LEN"
    SESSION_HEADER: Final[str] = "PROMPTCACHE_SESSION_HEADER"
    SESSION_FROM_USER: Final[str] = "PROMPTCACHE_SESSION_FROM_USER"
    PROMPT_TOKENS_HEADER: Final[str] = "PROMPTCACHE_PROMPT_TOKENS_HEADER"
    CACHED_PROMPT_TOKENS_HEADER: Final[str] = "PROMPTCACHE_CACHED_PROMPT_TOKENS_HEADER"
    MAX_BODY_BYTES: Final[str] = "PROMPTCACHE_MAX_BODY_BYTES"
    WORKERS: Final[str] = "PROMPTCACHE_WORKERS"
    """Front processes sharing the serving port (SO_REUSEPORT), one per vLLM API server, each
    with its own prompt-embeds cache: the renderer sets it to `engine.apiServerCount`, which
    is why the per-pod ceiling is apiServerCount x SG_PROMPT_EMBEDS_CACHE_GIB (spec/000)."""
    MAX_IN_FLIGHT: Final[str] = "PROMPTCACHE_MAX_IN_FLIGHT"
    """Requests the front works on at once; more get HTTP 503 (bounds its memory)."""
    MAX_IN_FLIGHT_BYTES: Final[str] = "PROMPTCACHE_MAX_IN_FLIGHT_BYTES"
    """Bytes of request bodies (as read, parsed and forwarded) a front process holds at
    once; a request that would exceed it gets 503. Set it to the memory the container
    has beyond the cache ceiling."""
    DECODE_WORKERS: Final[str] = "PROMPTCACHE_DECODE_WORKERS"
    """Threads for base64/torch.load/hashing, kept off the event loop."""
    TURBOQUANT_DTYPE: Final[str] = "PROMPTCACHE_TURBOQUANT_DTYPE"
    """The dtype TurboQuant payloads are decoded to before vLLM sees them."""
    UPSTREAM_TIMEOUT_SECONDS: Final[str] = "PROMPTCACHE_UPSTREAM_TIMEOUT_SECONDS"
    """Longest the front waits for vLLM to start answering a request."""
    MAX_BODY_READS: Final[str] = "PROMPTCACHE_MAX_BODY_READS"
    """Request bodies a front process receives at once (separate from MAX_IN_FLIGHT)."""
    HEADER_TIMEOUT_SECONDS: Final[str] = "PROMPTCACHE_HEADER_TIMEOUT_SECONDS"
    """Time a connection has to deliver a request's headers (also the keep-alive idle time)."""
    BODY_TIMEOUT_SECONDS: Final[str] = "PROMPTCACHE_BODY_TIMEOUT_SECONDS"
    """Time a request has to deliver its whole body (HTTP 408 after)."""
    MAX_PROMPT_EMBEDS_REFERENCES: Final[str] = "PROMPTCACHE_MAX_PROMPT_EMBEDS_REFERENCES"
    """Prompt-embeds payloads and references one request may carry."""


# --- the Endpoint Picker pod with the session shim (spec/004 `user` field) -------
EPP_EXT_PROC_PORT: Final[int] = 9002
"""The ext_proc port the gateway dials through the EPP Service (the shim's, when present)."""
EPP_LOCAL_GRPC_PORT: Final[int] = 9012
"""The EPP's own ext_proc port behind the session shim (`--grpc-port`), inside the pod."""


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


# --- the cache front's answers a client program must recognise ----------------
PROMPT_EMBEDS_NOT_CACHED_ERROR_CODE: Final[str] = "prompt_embeds_not_cached"
"""`error.code` of the HTTP 409 a request gets when it references identifiers the
front does not hold; `error.missing_prompt_embeds_ids` lists exactly those."""
MISSING_PROMPT_EMBEDS_IDS_FIELD: Final[str] = "missing_prompt_embeds_ids"
FRONT_HEALTH_PATH: Final[str] = "/healthz"
"""Liveness of the cache front itself (the renderer's livenessProbe)."""
FRONT_READY_PATH: Final[str] = "/readyz"
"""Readiness: 200 only while vLLM behind the front answers its /health."""

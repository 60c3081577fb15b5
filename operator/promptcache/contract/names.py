"""Names shared by the control plane and the data plane, written down once.

The renderer writes these into pods and the cache front reads them back, so a
typo on either side would silently switch a feature off. Both sides import them
from here (through `promptcache.contract`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

# --- the resource's API group: its apiVersion, CRD name and annotation prefix --
API_GROUP: Final[str] = "serving.promptcache.io"
"""The one spelling of the group; `api.GROUP`, the annotation prefixes and the operator's
kopf storage derive from it."""
DEFAULT_IMAGE_REGISTRY: Final[str] = "ghcr.io/promptcache"
"""Where the release pipeline publishes this project's images (and the chart defaults to):
the operator's, the cache front's and the picker's (`contract.picker_profiles`)."""

# --- spec/000: the prompt-embeds cache size, per API-server process -----------
SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR: Final[str] = "SG_PROMPT_EMBEDS_CACHE_GIB"

# --- spec/004: what clients send ----------------------------------------------
DEFAULT_ISOLATION_HEADER: Final[str] = "x-prompt-cache-isolation-key"
DEFAULT_ISOLATION_FIELD: Final[str] = "prompt_cache_isolation_key"
PROMPT_CACHE_MAX_LEN_FIELD: Final[str] = "prompt_cache_max_len"
PROMPT_CACHE_KEY_FIELD: Final[str] = "prompt_cache_key"
"""OpenAI's cache-routing hint: names a session for routing, never an isolation key."""
DEFAULT_SESSION_HEADER: Final[str] = "x-session-affinity"
SESSION_USER_FIELD: Final[str] = "user"
# --- spec/004: what clients get back --------------------------------------------
DEFAULT_PROMPT_TOKENS_HEADER: Final[str] = "dashflow-prompt-tokens"
DEFAULT_CACHED_PROMPT_TOKENS_HEADER: Final[str] = "dashflow-cached-prompt-tokens"

# --- vLLM request field the isolation policy controls -------------------------
CACHE_SALT_FIELD: Final[str] = "cache_salt"

# --- isolation by account: who the caller is (docs/isolation.md) ----------------
AUTHORIZATION_HEADER: Final[str] = "authorization"
"""Where a bearer token arrives; its HMAC names the account when `identity.bearerToken` is on."""
IDENTITY_ATTESTATION_HEADER: Final[str] = "x-promptcache-identity"
"""Set by the gateway's policy step only (it removes a client's copy): the account it
derived, signed with a key derived from the salt Secret and bound to the request. The
cache front trusts an identity from nowhere else."""
IDENTITY_ATTESTATION_MAX_AGE_SECONDS: Final[int] = 60
"""How long an attestation is accepted after it was signed (the step signs once the body
has arrived, so only the picker's decision and the gateway's forwarding lie between)."""
IDENTITY_CLOCK_SKEW_SECONDS: Final[int] = 30
"""How far in the future an attestation's time may lie (the pods' clocks differ a little)."""

# --- predicted against delivered (issue 39, docs/endpoint-picker.md) ------------------
PREDICTED_MATCH_HEADER: Final[str] = "x-promptcache-predicted"
"""Set by promptcache's picker only (it overwrites a client's copy): the prefix match it
expected the chosen pod to hold, signed like the identity attestation
(`tenancy.prediction`). The cache front counts it when the signature holds, and never
forwards it to vLLM."""


class IsolationMode(StrEnum):
    """How the cache front turns an isolation key into vLLM's `cache_salt`."""

    SHARED = "Shared"
    """No salt: every request shares one cache (spec/004's dedicated default)."""
    PER_KEY = "PerKey"
    """A key, when sent, becomes an HMAC-derived salt; requests without one share."""
    REQUIRED = "Required"
    """Every request must carry a key; one without gets HTTP 400."""


def needs_salt_key(mode: IsolationMode | str) -> bool:
    """Whether a deployment in `mode` derives salts, so needs the HMAC salt key.

    The one place this is decided: the API model, the renderer (mount the Secret), the
    operator (generate or check the Secret) and the front (read it at start) all ask here.
    """
    return IsolationMode(mode) is not IsolationMode.SHARED


# --- the model-server pod's shape ---------------------------------------------
SERVING_PORT: Final[int] = 8000
"""The port the InferencePool targets: the cache front's, or vLLM's without a front."""
VLLM_LOCAL_PORT: Final[int] = 8001
"""vLLM's port when a cache front stands in front of it; bound to 127.0.0.1 only."""
FRONT_LIFECYCLE_PORT: Final[int] = 8002
"""The front's loopback-only lifecycle socket: it accepts (and closes) connections for as
long as the front process lives, so the vllm container's preStop hook waits on it until the
front has drained (`render.model_server`, `front.server`)."""
FRONT_LAME_DUCK_SECONDS: Final[float] = 5.0
"""After SIGTERM the front still serves new requests this long (answering them with
`Connection: close`, and /readyz with 503) before it stops listening: time for the picker
to see the pod leave (the kubelet marks a deleted pod not Ready at once)."""
FRONT_DRAIN_SECONDS: Final[float] = 90.0
"""Then it waits this long for the requests in flight (streams included) to finish."""
POD_TERMINATION_GRACE_SECONDS: Final[int] = 120
"""The model-server pod's grace: lame duck, drain, and vLLM's own stop fit inside it."""
SALT_KEY_SECRET_KEY: Final[str] = "salt-key"  # noqa: S105 - a key name, not a secret
"""The key inside the salt Secret that holds the HMAC secret."""
SALT_KEY_MOUNT_DIR: Final[str] = "/etc/promptcache/salt"
SALT_KEY_FILE: Final[str] = f"{SALT_KEY_MOUNT_DIR}/{SALT_KEY_SECRET_KEY}"
"""Where the front reads the salt key in a rendered pod (and its default)."""


# --- the Endpoint Picker pod with the gateway policy step (spec/004 `user` field) -------
EPP_EXT_PROC_PORT: Final[int] = 9002
"""The ext_proc port the gateway dials through the EPP Service (the shim's, when present)."""
EPP_LOCAL_GRPC_PORT: Final[int] = 9012
"""The EPP's own ext_proc port behind the gateway policy step (`--grpc-port`), inside the pod."""
GATEWAY_POLICY_METRICS_PORT: Final[int] = 9092
"""The policy step's Prometheus metrics (refusals, internal errors), beside the EPP's 9090."""


# --- the cache front's answers a client program must recognise ----------------
PROMPT_EMBEDS_NOT_CACHED_ERROR_CODE: Final[str] = "prompt_embeds_not_cached"
"""`error.code` of the HTTP 409 a request gets when it references identifiers the
front does not hold; `error.missing_prompt_embeds_ids` lists exactly those."""
MISSING_PROMPT_EMBEDS_IDS_FIELD: Final[str] = "missing_prompt_embeds_ids"
FRONT_HEALTH_PATH: Final[str] = "/healthz"
"""Liveness of the cache front itself (the renderer's livenessProbe)."""
FRONT_READY_PATH: Final[str] = "/readyz"
"""Readiness: 200 only while vLLM behind the front answers its /health."""

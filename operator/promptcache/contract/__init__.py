"""The contract between the planes: everything that crosses from the resource to a process.

The renderer writes, and the cache front and the gateway policy step read, the same
names with the same grammar, parsers and defaults; the API model checks the
same grammar and bounds. None of them defines its own copy.

- `names`: spec constants (headers, body fields, env names of spec/000), ports,
  the isolation modes and whether a mode needs the salt key.
- `grammar`: what a header name and a body-field name may be.
- `settings`: the `Setting` declaration (flag, variable, parser, default) and
  the parsers; `front` and `shim` declare each process' settings with it.
- `cache_size`: `SG_PROMPT_EMBEDS_CACHE_GIB`, its bound, parser and format.
- `picker`: which Endpoint Picker a rendered gateway targets, and the operator's default.
- `picker_profiles`: one row per picker (`PROFILES`): its image, config dialect, block-size
  floor, LRU default, features, and whether the policy step fronts it.
- `engine`: the `vllm serve` flags the operator writes or relies on, and the pattern of every
  spelling vLLM's parser reads as one of them (what `engine.extraArgs` may not carry).
- `session`: what names a request's session, and the `promptcache` picker's session plugin.
- `ladder`: the counters of the hit-ratio ladder (front writes, operator and rules read).
- `pods`: the parts of each rendered pod a `podTemplate` overlay may not touch.

This package imports nothing of this project but itself and nothing heavy (no
torch, no Kubernetes client): every plane loads it. The layering is enforced by
the import contracts in pyproject.toml (`lint-imports`).
"""

from __future__ import annotations

from promptcache.contract.cache_size import (
    MAX_CACHE_GIB,
    cache_gib_from_env,
    cache_gib_to_bytes,
    format_cache_gib,
    parse_cache_gib,
)
from promptcache.contract.engine import (
    FLAG_WITH_SPACE_PATTERN,
    OWNED_ENGINE_FLAGS,
    OwnedEngineFlags,
    VllmFlag,
    owned_flag_pattern,
)
from promptcache.contract.front import FRONT_SETTINGS, FrontEnv
from promptcache.contract.gateway_policy import (
    GATEWAY_POLICY_SETTINGS,
    GatewayPolicyEnv,
)
from promptcache.contract.grammar import (
    BODY_FIELD_PATTERN,
    HEADER_NAME_PATTERN,
    OPTIONAL_BODY_FIELD_PATTERN,
    OPTIONAL_HEADER_NAME_PATTERN,
    GrammarError,
    check_body_field,
    check_header_name,
    is_body_field,
    is_header_name,
)
from promptcache.contract.ladder import SCOPE_CLASSES, LadderCounter
from promptcache.contract.names import (
    API_GROUP,
    AUTHORIZATION_HEADER,
    CACHE_SALT_FIELD,
    DEFAULT_CACHED_PROMPT_TOKENS_HEADER,
    DEFAULT_IMAGE_REGISTRY,
    DEFAULT_ISOLATION_FIELD,
    DEFAULT_ISOLATION_HEADER,
    DEFAULT_PROMPT_TOKENS_HEADER,
    DEFAULT_SESSION_HEADER,
    EPP_EXT_PROC_PORT,
    EPP_LOCAL_GRPC_PORT,
    FRONT_DRAIN_SECONDS,
    FRONT_HEALTH_PATH,
    FRONT_LAME_DUCK_SECONDS,
    FRONT_LIFECYCLE_PORT,
    FRONT_READY_PATH,
    GATEWAY_POLICY_METRICS_PORT,
    IDENTITY_ATTESTATION_HEADER,
    IDENTITY_ATTESTATION_MAX_AGE_SECONDS,
    IDENTITY_CLOCK_SKEW_SECONDS,
    MISSING_PROMPT_EMBEDS_IDS_FIELD,
    POD_TERMINATION_GRACE_SECONDS,
    PREDICTED_MATCH_HEADER,
    PROMPT_CACHE_KEY_FIELD,
    PROMPT_CACHE_MAX_LEN_FIELD,
    PROMPT_EMBEDS_NOT_CACHED_ERROR_CODE,
    SALT_KEY_FILE,
    SALT_KEY_MOUNT_DIR,
    SALT_KEY_SECRET_KEY,
    SERVING_PORT,
    SESSION_USER_FIELD,
    SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR,
    VLLM_LOCAL_PORT,
    IsolationMode,
    needs_salt_key,
)
from promptcache.contract.picker import (
    DEFAULT_PICKER,
    DEFAULT_PICKER_ENV,
    PREDICTED_MATCH_PLUGIN,
    TENANT_SALT_PARSER,
    PickerFlag,
    PickerTarget,
    PredictedMatchParam,
    TenantSaltParam,
)
from promptcache.contract.picker_profiles import (
    DEFAULT_LRU_CAPACITY_PER_SERVER,
    PROFILES,
    PickerProfile,
    lacking,
    profile_of,
)
from promptcache.contract.picker_profiles import Feature as PickerFeature
from promptcache.contract.pods import (
    ENDPOINT_PICKER_POD,
    GO_GC_PERCENT_ENV,
    GO_MEMORY_LIMIT_ENV,
    MODEL_CACHE_MOUNT_PATH,
    MODEL_SERVER_POD,
    OPERATOR_ANNOTATION_PREFIX,
    OPERATOR_POD_LABELS,
    Command,
    Container,
    OwnedPodParts,
)
from promptcache.contract.session import (
    DEFAULT_MAX_SESSIONS,
    MAX_SESSION_ID_CHARS,
    SESSION_AFFINITY_PLUGIN,
    SessionParam,
    SessionSource,
    request_session,
    session_sources,
)
from promptcache.contract.settings import Setting, SettingsError, format_bool, format_float

__all__ = [
    "API_GROUP",
    "AUTHORIZATION_HEADER",
    "BODY_FIELD_PATTERN",
    "CACHE_SALT_FIELD",
    "DEFAULT_CACHED_PROMPT_TOKENS_HEADER",
    "DEFAULT_IMAGE_REGISTRY",
    "DEFAULT_ISOLATION_FIELD",
    "DEFAULT_ISOLATION_HEADER",
    "DEFAULT_LRU_CAPACITY_PER_SERVER",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_PICKER",
    "DEFAULT_PICKER_ENV",
    "DEFAULT_PROMPT_TOKENS_HEADER",
    "DEFAULT_SESSION_HEADER",
    "ENDPOINT_PICKER_POD",
    "EPP_EXT_PROC_PORT",
    "EPP_LOCAL_GRPC_PORT",
    "FLAG_WITH_SPACE_PATTERN",
    "FRONT_DRAIN_SECONDS",
    "FRONT_HEALTH_PATH",
    "FRONT_LAME_DUCK_SECONDS",
    "FRONT_LIFECYCLE_PORT",
    "FRONT_READY_PATH",
    "FRONT_SETTINGS",
    "GATEWAY_POLICY_METRICS_PORT",
    "GATEWAY_POLICY_SETTINGS",
    "GO_GC_PERCENT_ENV",
    "GO_MEMORY_LIMIT_ENV",
    "HEADER_NAME_PATTERN",
    "IDENTITY_ATTESTATION_HEADER",
    "IDENTITY_ATTESTATION_MAX_AGE_SECONDS",
    "IDENTITY_CLOCK_SKEW_SECONDS",
    "MAX_CACHE_GIB",
    "MAX_SESSION_ID_CHARS",
    "MISSING_PROMPT_EMBEDS_IDS_FIELD",
    "MODEL_CACHE_MOUNT_PATH",
    "MODEL_SERVER_POD",
    "OPERATOR_ANNOTATION_PREFIX",
    "OPERATOR_POD_LABELS",
    "OPTIONAL_BODY_FIELD_PATTERN",
    "OPTIONAL_HEADER_NAME_PATTERN",
    "OWNED_ENGINE_FLAGS",
    "POD_TERMINATION_GRACE_SECONDS",
    "PREDICTED_MATCH_HEADER",
    "PREDICTED_MATCH_PLUGIN",
    "PROFILES",
    "PROMPT_CACHE_KEY_FIELD",
    "PROMPT_CACHE_MAX_LEN_FIELD",
    "PROMPT_EMBEDS_NOT_CACHED_ERROR_CODE",
    "SALT_KEY_FILE",
    "SALT_KEY_MOUNT_DIR",
    "SALT_KEY_SECRET_KEY",
    "SCOPE_CLASSES",
    "SERVING_PORT",
    "SESSION_AFFINITY_PLUGIN",
    "SESSION_USER_FIELD",
    "SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR",
    "TENANT_SALT_PARSER",
    "VLLM_LOCAL_PORT",
    "Command",
    "Container",
    "FrontEnv",
    "GatewayPolicyEnv",
    "GrammarError",
    "IsolationMode",
    "LadderCounter",
    "OwnedEngineFlags",
    "OwnedPodParts",
    "PickerFeature",
    "PickerFlag",
    "PickerProfile",
    "PickerTarget",
    "PredictedMatchParam",
    "SessionParam",
    "SessionSource",
    "Setting",
    "SettingsError",
    "TenantSaltParam",
    "VllmFlag",
    "cache_gib_from_env",
    "cache_gib_to_bytes",
    "check_body_field",
    "check_header_name",
    "format_bool",
    "format_cache_gib",
    "format_float",
    "is_body_field",
    "is_header_name",
    "lacking",
    "needs_salt_key",
    "owned_flag_pattern",
    "parse_cache_gib",
    "profile_of",
    "request_session",
    "session_sources",
]

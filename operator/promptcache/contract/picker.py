"""Which Endpoint Picker a rendered gateway targets: the API's `spec.gateway.picker`, the
operator's `--default-picker` (chart value `defaultPicker`) and `promptcache render`'s."""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class PickerTarget(StrEnum):
    """The Endpoint Picker binary a rendered gateway targets (`spec.gateway.picker`).

    Each accepts a different dialect (config apiVersion, flags, plugins); the renderer
    emits for each only what that binary accepts (docs/endpoint-picker.md)."""

    LLM_D_ROUTER = "llm-d-router"
    """llm-d-router v0.10.0 (session plugins, 64-token floor), with the gateway policy step
    in front of it; the default before promptcache's own picker."""
    GIE = "gie-v1.5"
    """The upstream Gateway API Inference Extension EPP v1.5.0, the last GIE release with
    an EPP: no session plugin, lenient decoding, one shared prefix attribute."""
    PROMPTCACHE = "promptcache"
    """promptcache's own build (`picker/`): GIE v1.5.0's picker with promptcache's plugins,
    the tenant salt derived inside it (`TENANT_SALT_PARSER`), so no policy step fronts it.
    Otherwise GIE v1.5.0's behaviour and dialect."""


DEFAULT_PICKER: Final[PickerTarget] = PickerTarget.PROMPTCACHE
"""The operator-wide default when neither the resource nor the operator names one:
promptcache's own picker, so no Python relay sits on the request path (issue 42)."""
DEFAULT_PICKER_ENV: Final[str] = "PROMPTCACHE_DEFAULT_PICKER"
"""The operator's (and `promptcache render`'s) default picker; flag `--default-picker`."""

TENANT_SALT_PARSER: Final[str] = "promptcache-tenant-salt"
"""The `promptcache` picker's request parser plugin type (`picker/plugins/tenantsalt`, whose
`Type` the picker's Go tests hold to this value through the shared vectors)."""


class TenantSaltParam(StrEnum):
    """The tenant-salt parser's `parameters` (decoded strictly by the picker: a key not
    listed here stops it; picker/README.md)."""

    SALT_KEY_FILE = "saltKeyFile"
    ISOLATION_MODE = "isolationMode"
    ISOLATION_HEADER = "isolationHeader"
    ISOLATION_FIELD = "isolationField"
    HONOR_MAX_LEN = "honorPromptCacheMaxLen"
    ALLOW_CLIENT_PRIORITY = "allowClientPriority"
    ALLOW_ENGINE_STATE = "allowEngineState"
    IDENTITY_HEADER = "identityHeader"
    IDENTITY_BEARER = "identityBearer"
    IDENTITY_REQUIRED = "identityRequired"


class PickerFlag(StrEnum):
    """Flags promptcache's picker adds to GIE's (`picker/boundary`; the vectors hold the Go
    side to these names). Both default to 0 there, which leaves the bound off (GIE's own
    behaviour); the renderer always sets them for `gateway.picker: promptcache`, from the
    settings the cache front and the policy step take their limits from."""

    MAX_BODY_BYTES = "--max-body-bytes"
    """Largest request body (`front.maxRequestBytes`); above it the client gets the front's
    HTTP 413 `request_too_large`, and the picker holds no more of it."""
    BODY_TIMEOUT_SECONDS = "--body-timeout-seconds"
    """Time a body may take after its request headers (`front.bodyTimeoutSeconds`; then the
    front's HTTP 408 `body_timeout`), and one answer may wait for the gateway to read it
    (then the stream ends)."""


PREDICTED_MATCH_PLUGIN: Final[str] = "promptcache-predicted-match"
"""The `promptcache` picker's PreRequest plugin (`picker/plugins/predicted`) that tells the
chosen pod, signed, the prefix match GIE's producer found for it (issue 39)."""


class PredictedMatchParam(StrEnum):
    """The predicted-match plugin's `parameters` (decoded strictly by the picker)."""

    SALT_KEY_FILE = "saltKeyFile"
    PRODUCER_NAME = "producerName"
    """The prefix producer whose block hashes the workload and capacity rungs are measured
    on (the first tier's); empty: the one there is."""
    WINDOW_SECONDS = "windowSeconds"
    WINDOW_BLOCKS = "windowBlocks"
    LRU_BLOCKS = "lruBlocks"
    STRIDE_BLOCKS = "strideBlocks"
    """Every n-th block is tracked: the prefix found to within n-1 blocks, at 1/n the cost."""

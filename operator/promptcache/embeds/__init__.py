"""Prompt-embeds identifiers, the payload cache and the TurboQuant codec.

No Kubernetes here: this is the inference-side library (spec/000, spec/001).

Torch is imported lazily. The cache (`promptcache.embeds.cache`), the identifier
syntax check and the error classes need no torch, and importing any submodule
runs this `__init__` first; so the names that do need torch (the payload types,
the identifier, the wire decoder, the TurboQuant codec) are resolved on first
access through a module `__getattr__` (PEP 562). `from promptcache.embeds import
PromptEmbedsCache` stays cheap; `from promptcache.embeds import
compute_prompt_embeds_id` loads torch, as it must.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from promptcache.embeds.cache import (
    ENTRY_OVERHEAD_BYTES,
    SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR,
    PromptEmbedsCache,
    PromptEmbedsCacheStats,
    build_cache_from_env,
    shared_cache,
)
from promptcache.embeds.errors import (
    PayloadDecodeError,
    PayloadEncodingError,
    PayloadFormatError,
    PayloadTooLargeError,
)
from promptcache.embeds.idsyntax import (
    PROMPT_EMBEDS_ID_ALGORITHM,
    PROMPT_EMBEDS_ID_PATTERN,
    PROMPT_EMBEDS_ID_PREFIX,
    is_prompt_embeds_id,
)

if TYPE_CHECKING:
    from promptcache.embeds import turboquant
    from promptcache.embeds.ids import compute_prompt_embeds_id
    from promptcache.embeds.payload import PromptEmbedsPayload, TurboQuantPayload
    from promptcache.embeds.wire import decode_payload, encode_payload, identify_payload

__all__ = [
    "ENTRY_OVERHEAD_BYTES",
    "PROMPT_EMBEDS_ID_ALGORITHM",
    "PROMPT_EMBEDS_ID_PATTERN",
    "PROMPT_EMBEDS_ID_PREFIX",
    "SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR",
    "PayloadDecodeError",
    "PayloadEncodingError",
    "PayloadFormatError",
    "PayloadTooLargeError",
    "PromptEmbedsCache",
    "PromptEmbedsCacheStats",
    "PromptEmbedsPayload",
    "TurboQuantPayload",
    "build_cache_from_env",
    "compute_prompt_embeds_id",
    "decode_payload",
    "encode_payload",
    "identify_payload",
    "is_prompt_embeds_id",
    "shared_cache",
    "turboquant",
]

_LAZY: dict[str, str] = {
    "PromptEmbedsPayload": "promptcache.embeds.payload",
    "TurboQuantPayload": "promptcache.embeds.payload",
    "compute_prompt_embeds_id": "promptcache.embeds.ids",
    "decode_payload": "promptcache.embeds.wire",
    "encode_payload": "promptcache.embeds.wire",
    "identify_payload": "promptcache.embeds.wire",
}


def __getattr__(name: str) -> Any:
    if name == "turboquant":
        return importlib.import_module("promptcache.embeds.turboquant")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'promptcache.embeds' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)

"""The tenant salt, as the front uses it; defined once in `promptcache.salt` (the gateway's
policy step derives the same salt before routing)."""

from __future__ import annotations

from promptcache.salt import (
    KEYED_SALT_PREFIX,
    UNCACHEABLE_SALT_PREFIX,
    VLLM_SALT_FORBIDDEN,
    VLLM_SALT_MAX_CHARS,
    derive_salt,
    is_valid_vllm_salt,
    random_salt,
)

__all__ = [
    "KEYED_SALT_PREFIX",
    "UNCACHEABLE_SALT_PREFIX",
    "VLLM_SALT_FORBIDDEN",
    "VLLM_SALT_MAX_CHARS",
    "derive_salt",
    "is_valid_vllm_salt",
    "random_salt",
]

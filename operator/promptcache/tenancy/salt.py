"""Turning an isolation key into a vLLM `cache_salt`, and checking salts: defined once.

Both halves that need the tenant's salt import it from here: the cache front (before vLLM)
and the gateway's policy step (before the Endpoint Picker hashes the prompt), so the
prefix the picker indexes and the cache vLLM fills are salted alike.

The salt is `HMAC-SHA256(secret, key)`, not the key itself: a salt derived
without a secret could be recomputed by anyone who guesses a tenant's key,
and the prefix-cache timing side channel would be open again. The digest is
written in URL-safe base64 without padding (43 characters), which vLLM accepts:
at most 128 characters and none of `@`, `/`, `\\` or NUL.
"""

from __future__ import annotations

import base64
import hmac
import secrets
from typing import Final

VLLM_SALT_MAX_CHARS: Final[int] = 128
VLLM_SALT_FORBIDDEN: Final[frozenset[str]] = frozenset({"@", "/", "\\", "\0"})
KEYED_SALT_PREFIX: Final[str] = "pck1-"
"""Marks a salt derived from an isolation key (version 1 of the derivation)."""
UNCACHEABLE_SALT_PREFIX: Final[str] = "pcn1-"
"""Marks a one-off salt that makes a request share nothing (prompt_cache_max_len 0)."""
ACCOUNT_SALT_PREFIX: Final[str] = "pca1-"
"""Marks a salt derived from an account (and the account's isolation key, when sent)."""
_ACCOUNT_DOMAIN: Final[bytes] = b"promptcache/account-salt/v1\0"


def _encode(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def derive_salt(secret: bytes, isolation_key: str) -> str:
    """The salt for one isolation key; equal keys give equal salts under one secret."""
    # the one-shot C HMAC: the same digest as hmac.new(...).digest(), several times cheaper
    digest = hmac.digest(secret, isolation_key.encode("utf-8"), "sha256")
    return KEYED_SALT_PREFIX + _encode(digest)


def derive_account_salt(secret: bytes, account: bytes, isolation_key: str | None) -> str:
    """The salt for one account, and one of its isolation keys when it sends one.

    `account` is `tenancy.identity.Account.digest` (fixed length, so the encoding below is
    unambiguous). Never equal to `derive_salt` of any key: a client without the account
    cannot reach its scope by sending the same key, and one account keeps several scopes
    apart by key."""
    key_part = b"-" if isolation_key is None else b"k" + isolation_key.encode("utf-8")
    digest = hmac.digest(secret, _ACCOUNT_DOMAIN + account + key_part, "sha256")
    return ACCOUNT_SALT_PREFIX + _encode(digest)


def random_salt() -> str:
    """A salt no other request will ever carry, so nothing cached is reused."""
    return UNCACHEABLE_SALT_PREFIX + _encode(secrets.token_bytes(32))


def is_valid_vllm_salt(value: str) -> bool:
    """Whether vLLM would accept this `cache_salt` (non-empty, short, no forbidden chars)."""
    return 0 < len(value) <= VLLM_SALT_MAX_CHARS and not (set(value) & VLLM_SALT_FORBIDDEN)

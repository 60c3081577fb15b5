"""The prompt-embeds payload cache (spec/000), torch-free.

A byte-bounded LRU of base64 payloads *exactly as the client sent them*, so a
hit hands vLLM byte-identical input to the uncached path and a TurboQuant
payload stays compressed. This module never deserializes anything, so it does
not import torch: the cache front can build and size it cheaply.

The cache trusts its caller: `put` does not check that a payload hashes to the
identifier it is filed under (that would mean deserializing it).

Scopes: entries are keyed by `HMAC-SHA256(key=cache_salt, msg=identifier)`.
Requests with no salt (`None`) all share one scope. The empty-string salt is
NOT that scope: it is a salt like any other (see docs/prompt-embeds.md, "Salt
scopes"), so a caller that derives an empty salt by mistake never widens
isolation into the shared scope.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from promptcache.contract import (
    SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR,
    cache_gib_from_env,
    cache_gib_to_bytes,
)

__all__ = [
    "ENTRY_OVERHEAD_BYTES",
    "SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR",
    "PromptEmbedsCache",
    "PromptEmbedsCacheStats",
    "build_cache_from_env",
    "cache_capacity_from_env",
    "shared_cache",
]

ENTRY_OVERHEAD_BYTES: Final[int] = 256
"""Bytes charged per entry on top of the payload's own characters.

Measured on CPython 3.11 (tests/embeds/test_embeds_cache.py checks it stays an
upper bound): the payload str's header (49 B), the 33-byte key and its bytes
object (66 B), the OrderedDict slot and its linked-list node (~100 B), rounded
up. Charging it keeps many tiny entries from exceeding the configured memory.
"""

_UNSALTED: Final[bytes] = b"\x00"
_SALTED: Final[bytes] = b"\x01"


@dataclass(frozen=True, slots=True)
class PromptEmbedsCacheStats:
    """A snapshot of cache occupancy and effectiveness."""

    capacity_bytes: int
    """Bytes the cache may hold. 0 when caching is disabled."""
    entries: int
    """Payloads currently held."""
    hits: int
    """Lookups that found a payload."""
    lookups: int
    """Lookups made, whether or not they found anything."""
    oversize_rejections: int
    """Payloads never cached because they were larger than the whole cache."""
    used_bytes: int
    """Bytes currently charged to the cache, including per-entry overhead."""
    inserts: int = 0
    """Payloads stored (a replaced entry counts again)."""
    evictions: int = 0
    """Entries dropped, least recently used first, to make room for an insert. Evictions
    per insert near 1 with a low hit ratio is thrash: the cache is too small for the
    working set."""

    @property
    def hit_ratio(self) -> float:
        """Fraction of lookups that found a payload, or 0.0 before any lookup."""
        return self.hits / self.lookups if self.lookups else 0.0


_HMAC_BLOCK: Final[int] = 64
_IPAD: Final[bytes] = bytes(b ^ 0x36 for b in range(256))
_OPAD: Final[bytes] = bytes(b ^ 0x5C for b in range(256))
_PAD_MEMO_LIMIT: Final[int] = 4096
_pad_memo: dict[str | None, tuple[Any, Any]] = {}


def _hmac_pads(cache_salt: str | None) -> tuple[Any, Any]:
    """SHA-256 states after absorbing HMAC's inner and outer padded keys (RFC 2104).

    Precomputed per salt so each lookup costs two small hash finishes instead of
    four compressions: the same HMAC-SHA256, about twice as fast as `hmac.digest`
    (bench/embeds_cache.py). Bounded: the memo is dropped when it grows past
    `_PAD_MEMO_LIMIT` salts. Reads and writes of a dict are atomic under the GIL
    and hash objects lock themselves on `copy`, so no extra lock is needed.
    """
    pads = _pad_memo.get(cache_salt)
    if pads is None:
        if cache_salt is not None and "\x00" in cache_salt:
            raise ValueError("cache_salt must not contain NUL characters")
        key = b"" if cache_salt is None else cache_salt.encode("utf-8", "surrogatepass")
        if len(key) > _HMAC_BLOCK:
            key = hashlib.sha256(key).digest()
        key = key.ljust(_HMAC_BLOCK, b"\x00")
        pads = (hashlib.sha256(key.translate(_IPAD)), hashlib.sha256(key.translate(_OPAD)))
        if len(_pad_memo) >= _PAD_MEMO_LIMIT:
            _pad_memo.clear()
        _pad_memo[cache_salt] = pads
    return pads


def _scope_key(identifier: str, cache_salt: str | None) -> bytes:
    """The dictionary key: a scope tag then HMAC-SHA256(key=cache_salt, msg=identifier).

    The tag keeps the no-salt scope apart from the empty-string salt, which HMAC
    alone would not (an empty key and no key are the same to it). HMAC also
    zero-pads short keys, so a salt containing NUL would share a scope with the
    same salt without it; such salts are refused (vLLM refuses them too).
    Strings are encoded UTF-8 with `surrogatepass`, so every str has exactly one
    encoding.
    """
    inner_pad, outer_pad = _hmac_pads(cache_salt)
    inner = inner_pad.copy()
    # surrogatepass: any str (even a lone surrogate) has one, distinct encoding
    inner.update(identifier.encode("utf-8", "surrogatepass"))
    outer = outer_pad.copy()
    outer.update(inner.digest())
    digest: bytes = outer.digest()
    return (_UNSALTED if cache_salt is None else _SALTED) + digest


def _payload_bytes(payload: str) -> int:
    """Bytes a payload occupies: one per character for ASCII (base64 always is).

    CPython stores a non-ASCII str with up to four bytes per character; such a
    payload is not valid base64, but if one arrives it is charged the worst case.
    """
    return len(payload) if payload.isascii() else 4 * len(payload)


class PromptEmbedsCache:
    """A byte-bounded LRU cache of prompt-embeds payloads as received.

    Safe to share between threads: one lock guards the map and the counters, so
    concurrent `get`/`put`/`stats` never corrupt state and `stats` is a
    consistent snapshot. Key derivation (the HMAC) runs outside the lock.
    """

    __slots__ = (
        "_capacity",
        "_entries",
        "_evictions",
        "_hits",
        "_inserts",
        "_lock",
        "_lookups",
        "_oversize",
        "_used",
    )

    def __init__(self, capacity_bytes: int) -> None:
        """Size a cache; 0 or less disables it, and every lookup then misses."""
        self._capacity = max(int(capacity_bytes), 0)
        self._entries: OrderedDict[bytes, str] = OrderedDict()
        self._lock = threading.Lock()
        self._used = 0
        self._hits = 0
        self._lookups = 0
        self._oversize = 0
        self._inserts = 0
        self._evictions = 0

    @property
    def enabled(self) -> bool:
        """Whether this cache stores anything at all."""
        return self._capacity > 0

    @property
    def capacity_bytes(self) -> int:
        """Bytes the cache may hold (0 when disabled)."""
        return self._capacity

    @staticmethod
    def charge(payload: str) -> int:
        """Bytes an entry holding `payload` is charged: its bytes plus the overhead."""
        return _payload_bytes(payload) + ENTRY_OVERHEAD_BYTES

    def can_hold(self, payload: str) -> bool:
        """Whether the payload could be stored at all (non-empty, fits an empty cache)."""
        return self.enabled and bool(payload) and self.charge(payload) <= self._capacity

    def clear(self) -> None:
        """Drop every entry and reset the statistics, leaving the cache sized as it was."""
        with self._lock:
            self._entries.clear()
            self._used = self._hits = self._lookups = self._oversize = 0
            self._inserts = self._evictions = 0

    def get(self, identifier: str, cache_salt: str | None = None) -> str | None:
        """Look up the payload an identifier names within one scope; a hit refreshes it."""
        if self._capacity <= 0:
            return None
        key = _scope_key(identifier, cache_salt)
        with self._lock:
            self._lookups += 1
            payload = self._entries.get(key)
            if payload is None:
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return payload

    def put(self, identifier: str, payload: str, cache_salt: str | None = None) -> bool:
        """Add a payload under an identifier the caller has already verified it against.

        Returns:
            Whether it was stored. False means serve it uncached: it is empty, or
            larger than the whole cache (counted in `oversize_rejections`).
        """
        if not payload:
            return False
        charge = self.charge(payload)
        if charge > self._capacity:
            with self._lock:
                self._oversize += 1
            return False
        key = _scope_key(identifier, cache_salt)
        entries = self._entries
        with self._lock:
            old = entries.pop(key, None)
            if old is not None:
                self._used -= self.charge(old)
            limit = self._capacity - charge
            while self._used > limit:
                _, evicted = entries.popitem(last=False)
                self._used -= self.charge(evicted)
                self._evictions += 1
            entries[key] = payload
            self._used += charge
            self._inserts += 1
            return True

    def stats(self) -> PromptEmbedsCacheStats:
        """Take a consistent snapshot; a disabled cache reports zeroes but declined payloads."""
        with self._lock:
            return PromptEmbedsCacheStats(
                capacity_bytes=self._capacity,
                entries=len(self._entries),
                hits=self._hits,
                lookups=self._lookups,
                oversize_rejections=self._oversize,
                used_bytes=self._used,
                inserts=self._inserts,
                evictions=self._evictions,
            )

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"PromptEmbedsCache(capacity_bytes={s.capacity_bytes}, entries={s.entries}, "
            f"used_bytes={s.used_bytes})"
        )


def cache_capacity_from_env(environ: Mapping[str, str] | None = None) -> int:
    """Parse `SG_PROMPT_EMBEDS_CACHE_GIB` into bytes (0 = unset or disabled).

    The contract's parser (`promptcache.contract.cache_size`), which the front uses too.

    Raises:
        ValueError: naming the variable and the bad value, for anything that is
            not a finite number of GiB within the bound (negative, NaN, inf, text, empty).
    """
    return cache_gib_to_bytes(cache_gib_from_env(environ))


def build_cache_from_env() -> PromptEmbedsCache:
    """Build a cache holding `SG_PROMPT_EMBEDS_CACHE_GIB` GiB, disabled when 0 or unset.

    Raises:
        ValueError: if the variable is not a number of GiB from 0 to 1024 (spec/000's
            "not a non-negative number", plus empty values and sizes above the bound,
            which are typos, not caches); the message names the variable, the value and
            the bound. A mistyped size fails here rather than silently serving every
            request uncached.
    """
    return PromptEmbedsCache(cache_capacity_from_env())


_shared: PromptEmbedsCache | None = None
_shared_lock = threading.Lock()


def shared_cache() -> PromptEmbedsCache:
    """Return the one cache this process keeps, sized from the environment on first use.

    Shared rather than built per caller so the sizing variable bounds the process'
    memory. A lock makes "first use" happen once even under concurrent callers; a
    bad variable raises every time until fixed (nothing is cached on failure).
    """
    global _shared  # noqa: PLW0603 - the process-wide singleton is the point
    with _shared_lock:
        if _shared is None:
            _shared = build_cache_from_env()
        return _shared

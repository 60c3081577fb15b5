"""Each tenant's share of the work its request bodies cost a pod, while others are active.

Why: a large or dense JSON body is a valid request that costs the pod's CPU twice, once
in the front (parsed to be salted) and once in vLLM (parsed, validated, tokenised), on
the core every other tenant's requests need. Concurrency caps do not see this: one
tenant sending dense bodies one after another holds a single slot yet takes most of the
pod's core, and everyone else's cheap requests queue behind its parses
(`bench/hostile_load.py --layout pod`).

So the front meters each fairness key by what its bodies cost to decode: the memory a
body's parse materialises (`canonical.JsonScan.charge`, counted as the body arrives),
which grows with the number of JSON values, not the bytes: 4 MiB of `[1,1,...]` is
~104 MiB, a 4 MiB string ~8 MiB, a chat turn a few KiB. A token bucket that may run into
debt: a body is charged after it is read, and a key that owes waits before its next body
is read, until the debt is paid back at `bytes_per_second`. The debt is capped at
`MAX_DEBT_SECONDS` of the rate, so no wait is longer; past `MAX_WAITERS` waiting
requests of one key, more are refused with HTTP 429 (`fair_share_exceeded`).

The meter is work-conserving: it only charges and holds a key back while *another* key
has sent a request within `ACTIVE_SECONDS`. A lone tenant on an idle pod is never
slowed.

The key is the caller's identity as seen before the body: in the gateway's policy step,
the account header the gateway's authentication sets (when isolation by account names
one); then the isolation header, else the Authorization header; a request with none
shares the anonymous key. (The front does not trust the account header: a pod can be
reached directly.) It is hashed, and at most `MAX_KEYS` keys are remembered (the least
recently seen forgotten first, debts included), so the meter's memory is bounded whatever
keys clients invent.
Keys that clients choose freely (the isolation header without authentication) can be
multiplied by a client: the share is only as strong as the identity behind it.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from promptcache.tenancy import errors
from promptcache.tenancy.errors import FrontError

ACTIVE_SECONDS: Final[float] = 1.0
"""Another key that sent a request within this long makes the pod contended."""
MAX_DEBT_SECONDS: Final[float] = 10.0
"""The most a key may owe, in seconds of its rate: the longest a request waits."""
MAX_WAITERS: Final[int] = 16
"""Requests of one key waiting for its share at once; more are refused (429) at once."""
MAX_KEYS: Final[int] = 4096
"""Keys remembered at once (about 100 bytes each)."""
BURST_SECONDS: Final[float] = 1.0
"""Unused share a key may save up: this many seconds of `bytes_per_second`."""


@dataclass
class _Bucket:
    tokens: float
    """Bytes the key may still send now; negative: what it owes."""
    stamp: float
    """When `tokens` was last brought up to date."""


@dataclass(frozen=True)
class Refusal:
    """`MAX_WAITERS` of the key's requests already wait: refuse, retry after this long."""

    retry_after: float


class FairShare:
    """The per-key meter of decoding work (see the module's docstring); one per process,
    used from its event loop only."""

    def __init__(
        self,
        bytes_per_second: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_wait: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        """`on_wait` is told how long each held-back request waited (the process's metrics)."""
        self.rate = bytes_per_second
        self._on_wait = on_wait
        self.capacity = bytes_per_second * BURST_SECONDS
        self.max_debt = bytes_per_second * MAX_DEBT_SECONDS
        self._clock = clock
        self._buckets: OrderedDict[bytes, _Bucket] = OrderedDict()
        self._seen: OrderedDict[bytes, float] = OrderedDict()
        self._waiting: dict[bytes, int] = {}

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    @staticmethod
    def key_of(*identities: str | bytes) -> bytes:
        """A fixed-size key for the caller (its identity's text is never kept): the first
        of `identities` that is not empty (none: the anonymous key)."""
        identity = next((i for i in identities if i), b"")
        raw = identity if isinstance(identity, bytes) else identity.encode("utf-8", "surrogatepass")
        return hashlib.blake2b(raw, digest_size=16).digest()

    def seen(self, key: bytes) -> None:
        """Record that `key` sent a request now: it makes the pod contended for others."""
        self._seen[key] = self._clock()
        self._seen.move_to_end(key)
        while len(self._seen) > MAX_KEYS:
            self._seen.popitem(last=False)

    def contended(self, key: bytes) -> bool:
        """Whether a key other than `key` sent a request within `ACTIVE_SECONDS`."""
        since = self._clock() - ACTIVE_SECONDS
        for other, when in reversed(self._seen.items()):  # newest first: two steps at most
            if when < since:
                return False
            if other != key:
                return True
        return False

    def _bucket(self, key: bytes) -> _Bucket:
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = _Bucket(self.capacity, now)
            self._buckets[key] = bucket
            while len(self._buckets) > MAX_KEYS:
                self._buckets.popitem(last=False)
        else:
            bucket.tokens = min(self.capacity, bucket.tokens + (now - bucket.stamp) * self.rate)
            bucket.stamp = now
        self._buckets.move_to_end(key)
        return bucket

    def owed_seconds(self, key: bytes) -> float:
        """How long `key` must wait before its next body is read (0: not in debt, or no
        other key is active)."""
        if key not in self._buckets or not self.contended(key):
            return 0.0
        tokens = self._bucket(key).tokens
        return -tokens / self.rate if tokens < 0 else 0.0

    def remembered(self) -> int:
        """How many keys the meter holds state for now (at most `MAX_KEYS` each of seen
        and of debts)."""
        return max(len(self._seen), len(self._buckets))

    def waiting(self, key: bytes) -> int:
        """How many of `key`'s requests wait for its share now (at most `MAX_WAITERS`)."""
        return self._waiting.get(key, 0)

    def charge(self, key: bytes, cost: int) -> None:
        """Charge a body that cost `cost` to decode to `key`, while others are active."""
        if self.contended(key):
            bucket = self._bucket(key)
            bucket.tokens = max(bucket.tokens - cost, -self.max_debt)

    async def admit(self, key: bytes) -> Refusal | None:
        """Wait until `key` owes nothing (or no other key is active); a `Refusal` when
        `MAX_WAITERS` of its requests already wait."""
        wait = self.owed_seconds(key)
        if wait <= 0:
            return None
        waiting = self._waiting.get(key, 0)
        if waiting >= MAX_WAITERS:
            return Refusal(retry_after=wait)
        self._waiting[key] = waiting + 1
        started = time.monotonic()
        try:
            while wait > 0:
                await asyncio.sleep(wait)
                wait = self.owed_seconds(key)
            return None
        finally:
            self._on_wait(time.monotonic() - started)
            if self._waiting[key] <= 1:
                del self._waiting[key]
            else:
                self._waiting[key] -= 1


def share_exceeded(refusal: Refusal) -> FrontError:
    """The 429 both the front and the policy step answer a refused request with."""
    retry = str(max(1, math.ceil(refusal.retry_after)))
    return FrontError(
        429,
        errors.FAIR_SHARE_EXCEEDED,
        f"this client's requests have cost the server more than its share while other "
        f"clients are active, and {MAX_WAITERS} of them are already waiting; retry in "
        f"{retry} s, or send fewer or smaller requests",
        headers={"Retry-After": retry},
    )

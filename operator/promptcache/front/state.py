"""What every request handler of one front shares: settings, cache, metrics, budget.

Kept apart from the handlers so the upstream relay and the app can both use it
without importing each other.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from promptcache.embeds.cache import PromptEmbedsCache
from promptcache.front.metrics import FrontMetrics
from promptcache.front.pool import UpstreamPool
from promptcache.front.references import KindIndex
from promptcache.front.settings import FrontSettings
from promptcache.tenancy import errors
from promptcache.tenancy.canonical import json_charge
from promptcache.tenancy.errors import FrontError

__all__ = ["Charge", "FrontState", "json_charge"]


@dataclass
class FrontState:
    """Everything a request handler needs, built once per application."""

    settings: FrontSettings
    secret: bytes | None
    cache: PromptEmbedsCache
    metrics: FrontMetrics
    executor: ThreadPoolExecutor
    kinds: KindIndex = field(default_factory=KindIndex)
    pool: UpstreamPool | None = None
    in_flight: int = 0
    body_reads: int = 0
    bytes_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Guards `bytes_in_flight`: decode threads charge densified payloads too."""


class Charge:
    """One request's share of the in-flight byte budget, released when it ends.

    Admission control on memory: a request that would push the process past
    `max_in_flight_bytes` is refused with 503 (retry later) instead of risking
    the container's memory limit; one that could never fit gets 413. Charged
    before the memory is used: a body as it is read, its parse (`json_charge`),
    every payload verified or densified, and the forwarded body before it is
    built. Thread-safe (decode threads charge too).
    """

    def __init__(self, state: FrontState) -> None:
        self._state = state
        self.held = 0

    def take(self, n: int) -> None:
        state, limit = self._state, self._state.settings.max_in_flight_bytes
        with state.lock:
            if self.held + n > limit:
                raise FrontError(
                    413,
                    errors.REQUEST_TOO_LARGE,
                    f"the request needs about {self.held + n} bytes of working memory "
                    f"(its body, parsed, with every prompt-embeds payload and reference at "
                    f"its full size); this server gives one request at most {limit}",
                )
            if state.bytes_in_flight + n > limit:
                raise FrontError(
                    503,
                    errors.MEMORY_BUDGET_EXHAUSTED,
                    "the cache front's memory budget for requests in flight is in use; "
                    "retry shortly",
                )
            state.bytes_in_flight += n
            self.held += n

    def give_back(self, n: int) -> None:
        """Return part of the charge whose memory is already freed (a finished decode)."""
        with self._state.lock:
            n = min(n, self.held)
            self._state.bytes_in_flight -= n
            self.held -= n

    def release(self) -> None:
        with self._state.lock:
            self._state.bytes_in_flight -= self.held
            self.held = 0

"""What every request handler of one front shares: settings, cache, metrics, budget.

Kept apart from the handlers so the upstream relay and the app can both use it
without importing each other.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Final

import aiohttp
from aiohttp import web

from promptcache.embeds.cache import PromptEmbedsCache
from promptcache.front import errors
from promptcache.front.errors import FrontError
from promptcache.front.metrics import FrontMetrics
from promptcache.front.references import KindIndex
from promptcache.front.settings import FrontSettings

PARSE_FACTOR: Final = 2
"""A body is charged twice while read: the bytes, and the parsed objects' strings."""


@dataclass
class FrontState:
    """Everything a request handler needs, built once per application."""

    settings: FrontSettings
    secret: bytes | None
    cache: PromptEmbedsCache
    metrics: FrontMetrics
    executor: ThreadPoolExecutor
    kinds: KindIndex = field(default_factory=KindIndex)
    session: aiohttp.ClientSession | None = None
    in_flight: int = 0
    bytes_in_flight: int = 0


class Charge:
    """One request's share of the in-flight byte budget, released when it ends.

    Admission control on memory: a request that would push the process past
    `max_in_flight_bytes` is refused with 503 (retry later) instead of risking
    the container's memory limit; one that could never fit gets 413.
    """

    def __init__(self, state: FrontState) -> None:
        self._state = state
        self.held = 0

    def take(self, n: int) -> None:
        state, limit = self._state, self._state.settings.max_in_flight_bytes
        if self.held + n > limit:
            raise FrontError(
                413,
                errors.REQUEST_TOO_LARGE,
                f"the request needs about {self.held + n} bytes of working memory; this "
                f"server gives one request at most {limit}",
            )
        if state.bytes_in_flight + n > limit:
            raise FrontError(
                503,
                errors.FRONT_OVERLOADED,
                "the cache front is holding as many request bytes as it may; retry shortly",
            )
        state.bytes_in_flight += n
        self.held += n

    def release(self) -> None:
        self._state.bytes_in_flight -= self.held
        self.held = 0


STATE: Final = web.AppKey("promptcache_front_state", FrontState)

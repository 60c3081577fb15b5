"""What every request handler of one front shares: settings, cache, metrics, budget.

Kept apart from the handlers so the upstream relay and the app can both use it
without importing each other.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Final, TypeVar

from promptcache.embeds.cache import PromptEmbedsCache
from promptcache.front.metrics import FrontMetrics
from promptcache.front.pool import UpstreamPool
from promptcache.front.references import KindIndex
from promptcache.front.sampling import PredictionSampler
from promptcache.front.settings import FrontSettings
from promptcache.runtime.budget import SHARE_RESOURCE, BudgetWords, MemoryBudget, MemoryScope
from promptcache.runtime.spawn import SpawnPool
from promptcache.tenancy.attestation import Attester
from promptcache.tenancy.canonical import json_charge
from promptcache.tenancy.fair_share import FairShare
from promptcache.tenancy.prediction import PredictionReader
from promptcache.tenancy.shares import Ledger, share_of

__all__ = ["PROCESS_KEY", "FrontState", "MemoryScope", "json_charge"]

MEMORY_WORDS: Final = BudgetWords(
    server="this server",
    holder="the cache front",
    needs=" (its body, parsed, with every prompt-embeds payload and reference at its full size)",
    resource="memory budget for requests in flight",
)

T = TypeVar("T")

PROCESS_KEY: Final = b"\0front"
"""What the front holds for itself (a scrape of vLLM's metrics), apart from every client."""

STUCK_JOB_SECONDS: Final = 120.0
"""A decode or JSON job unfinished this long is stuck, not slow: the largest payload the
caps admit decodes in seconds, and a queue of them drains in well under a minute (so an
attack that saturates the workers never reads as stuck). `/healthz` then fails."""


@dataclass
class FrontState:
    """Everything a request handler needs, built once per application."""

    settings: FrontSettings
    secret: bytes | None
    cache: PromptEmbedsCache
    metrics: FrontMetrics
    executor: ThreadPoolExecutor
    kinds: KindIndex = field(default_factory=KindIndex)
    fair_share: FairShare = field(default_factory=lambda: FairShare(0))
    """Each key's share of the pod's decoding work (`create_state` sizes it from the settings)."""
    pool: UpstreamPool | None = None
    attester: Attester | None = None
    """Isolation by account: checks the policy step's signed account (None: off)."""
    predictions: PredictionReader | None = None
    """Checks promptcache's picker's signed prediction (None: no salt key to check it with,
    so none is believed)."""
    sampler: PredictionSampler = field(default_factory=PredictionSampler)
    """Which predictions `predictions` checks above a modest rate (`front.sampling`)."""
    slots: Ledger = field(init=False)
    """Each client identity's share of `max_in_flight` (`tenancy.shares`)."""
    reads: Ledger = field(init=False)
    """Each client identity's share of `max_body_reads`."""
    memory: MemoryBudget = field(init=False)
    """Each client identity's share of `max_in_flight_bytes` (`runtime.budget`: the policy
    step's budget too); a request charges a `scope` of it."""
    draining: bool = False
    """Stopping (SIGTERM): still serving, but not ready, and no connection is kept alive."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Guards `jobs` (decode threads finish them)."""
    spawn: SpawnPool = field(init=False)
    """The JSON worker processes (`runtime.spawn`; `decode_workers` of them)."""
    jobs: dict[int, float] = field(default_factory=dict)
    """Jobs submitted to the decode threads or JSON workers and not yet done: when each
    was submitted (`time.monotonic`)."""
    stuck_after: float = STUCK_JOB_SECONDS

    def __post_init__(self) -> None:
        s = self.settings
        percent = s.tenant_share_percent
        self.slots = Ledger(s.max_in_flight, share_of(s.max_in_flight, percent))
        self.reads = Ledger(s.max_body_reads, share_of(s.max_body_reads, percent))
        self.memory = MemoryBudget(
            s.max_in_flight_bytes,
            percent,
            MEMORY_WORDS,
            on_share_refused=lambda: self.metrics.share_refused(SHARE_RESOURCE),
        )
        self.spawn = SpawnPool(s.decode_workers)

    @property
    def json_processes(self) -> Executor | None:
        """The JSON workers' executor, None until the first large body (a test may set its own)."""
        return self.spawn.current

    @json_processes.setter
    def json_processes(self, executor: Executor | None) -> None:
        self.spawn.current = executor

    @property
    def in_flight(self) -> int:
        """Requests holding a concurrency slot now."""
        return self.slots.used

    @property
    def body_reads(self) -> int:
        """Request bodies being received now."""
        return self.reads.used

    @property
    def bytes_in_flight(self) -> int:
        """Working memory charged to requests in flight now."""
        return self.memory.used

    def submit(self, executor: Executor, job: Callable[[], T]) -> asyncio.Future[T]:
        """Run `job` on `executor`, tracked until it is done, even if the request that
        awaits it is cancelled (a stuck thread or worker stays visible to `/healthz`)."""
        future = executor.submit(job)
        key = id(future)
        with self.lock:
            self.jobs[key] = time.monotonic()

        def done(_: Future[T]) -> None:
            with self.lock:
                self.jobs.pop(key, None)

        future.add_done_callback(done)
        return asyncio.wrap_future(future)

    def oldest_job_seconds(self) -> float:
        """How long the oldest unfinished job has been waiting or running (0: none)."""
        with self.lock:
            oldest = min(self.jobs.values(), default=None)
        return 0.0 if oldest is None else time.monotonic() - oldest

    def json_pool(self) -> Executor:
        """The JSON worker processes for large or dense bodies (`front.offload`), started on
        first use (`runtime.spawn.SpawnPool`: spawned, bounded, nicer than the loop)."""
        return self.spawn.executor()

    def drop_json_pool(self, wait: bool = False) -> None:
        """Stop the JSON workers (waiting for them to exit when `wait`); a new pool starts
        at the next large body."""
        self.spawn.drop(wait)

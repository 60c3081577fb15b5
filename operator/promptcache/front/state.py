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
from promptcache.runtime.spawn import SpawnPool
from promptcache.tenancy import errors
from promptcache.tenancy.attestation import Attester
from promptcache.tenancy.canonical import json_charge
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.fair_share import FairShare
from promptcache.tenancy.prediction import PredictionReader
from promptcache.tenancy.shares import Ledger, Verdict, share_of, share_refusal

__all__ = ["PROCESS_KEY", "Charge", "FrontState", "json_charge"]

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
    memory: Ledger = field(init=False)
    """Each client identity's share of `max_in_flight_bytes`; used under `lock`."""
    draining: bool = False
    """Stopping (SIGTERM): still serving, but not ready, and no connection is kept alive."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Guards `memory`: decode threads charge densified payloads too."""
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
        self.memory = Ledger(s.max_in_flight_bytes, share_of(s.max_in_flight_bytes, percent))
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


class Charge:
    """One request's share of the in-flight byte budget, released when it ends.

    Admission control on memory: a request that would push the process past
    `max_in_flight_bytes` is refused with 503 (retry later) instead of risking
    the container's memory limit; one that could never fit in its client's share
    gets 413; a client that already holds its share while another client holds some too,
    or would eat into the reserve kept for clients holding less, gets 429
    (`tenancy.shares`), so one client cannot hold the budget while others want it.
    Charged before the memory is used: a body as it is read, its parse (`json_charge`),
    every payload verified or densified, the forwarded body before it is built, and
    vLLM's answer: one read whole before it is read, a streamed one for what it holds at
    a time (`hold`: the connection's read-ahead, the piece being written, an incomplete
    SSE event). Thread-safe (decode threads charge too).
    """

    def __init__(self, state: FrontState, key: bytes = PROCESS_KEY) -> None:
        self._state = state
        self.key = key
        """The client identity the charge counts against (`tenancy.shares.identity_key`)."""
        self.held = 0

    def take(self, n: int) -> None:
        state = self._state
        memory = state.memory
        with state.lock:
            if self.held + n > memory.share:
                raise FrontError(
                    413,
                    errors.REQUEST_TOO_LARGE,
                    f"the request needs about {self.held + n} bytes of working memory "
                    f"(its body, parsed, with every prompt-embeds payload and reference at "
                    f"its full size); this server gives one client at most {memory.share}",
                )
            verdict = memory.take(self.key, n)
            if verdict is Verdict.TAKE:
                self.held += n
                return
            held = memory.held(self.key)
        if verdict is Verdict.OVER_SHARE:
            state.metrics.share_refused("memory")
            raise share_refusal("memory budget for requests in flight", held, memory.share, "bytes")
        raise FrontError(
            503,
            errors.MEMORY_BUDGET_EXHAUSTED,
            "the cache front's memory budget for requests in flight is in use; retry shortly",
        )

    def hold(self, n: int) -> None:
        """Count `n` bytes this request holds without refusing: for an answer whose headers
        are already sent (a stream cannot turn into a 503), so that new requests are
        admitted against what the process really holds. Negative `n` gives back."""
        if n < 0:
            self.give_back(-n)
            return
        with self._state.lock:
            self._state.memory.hold(self.key, n)
            self.held += n

    def give_back(self, n: int) -> None:
        """Return part of the charge whose memory is already freed (a finished decode)."""
        with self._state.lock:
            n = min(n, self.held)
            self._state.memory.give(self.key, n)
            self.held -= n

    def release(self) -> None:
        with self._state.lock:
            self._state.memory.give(self.key, self.held)
            self.held = 0

"""Worker processes for large or dense JSON bodies, shared by the front and the step.

Parsing a large body in a thread would hold the process's GIL for seconds, and every
tenant's requests wait behind it; in a worker process it costs only CPU. The pool is:

- started on first use (most processes never see a large body);
- spawned, never forked (the parent runs threads, an event loop, gRPC);
- bounded (`workers`), so a burst of large bodies cannot take every core;
- nicer than the parent (`WORKER_NICENESS`): on the cores they share, the event loop,
  its probes and other tenants' small requests go first, and an attacker's bodies take
  the CPU that is left;
- dropped when a worker dies (killed, out of memory: `BrokenProcessPool`), its broken
  executor shut down; the next large body starts a new one.

    >>> pool = SpawnPool(workers=2)
    >>> await loop.run_in_executor(pool.executor(), job)
    >>> pool.drop()
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Final

WORKER_NICENESS: Final = 10
"""How much nicer than their parent the workers run."""


class SpawnPool:
    """A lazily started pool of `workers` spawned worker processes, `WORKER_NICENESS` nicer.

    `current` is the executor in use (None until the first job); a test may set it to an
    executor of its own."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.current: Executor | None = None

    def executor(self) -> Executor:
        """The pool, started on first use."""
        if self.current is None:
            self.current = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=os.nice,
                initargs=(WORKER_NICENESS,),
            )
        return self.current

    def drop(self, wait: bool = False) -> None:
        """Stop the workers (waiting for them to exit when `wait`), cancelling queued jobs;
        a new pool starts at the next job. Called when stopping, and when a worker died."""
        pool, self.current = self.current, None
        if pool is not None:
            pool.shutdown(wait=wait, cancel_futures=True)

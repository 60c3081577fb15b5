"""An executor that stands in for a process pool in tests, counting what is sent to it.

The front's JSON workers and the gateway policy step's decide workers are process pools;
a test swaps one for this to see which bodies were sent off the event loop (and still
get their answers: the jobs run, on one thread)."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class CountingExecutor(ThreadPoolExecutor):
    """Runs every job on one thread and counts them in `jobs`."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.jobs = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.jobs += 1
        return super().submit(fn, *args, **kwargs)

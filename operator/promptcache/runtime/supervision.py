"""A supervisor and its `--workers N` processes, for the cache front and the policy step.

Both run N spawned processes on one port (SO_REUSEPORT) under the process the container
started. Two ends of that are the same for both and written here:

- a worker stops when its supervisor is gone (`stop_when_orphaned`). In a pod the kernel
  ends every process of the container with its first one, but anywhere else (a supervisor
  killed by SIGKILL, a test, a process manager without PID namespaces) the worker would go
  on serving the port alone, unsupervised, and hold its inherited stdio open, so whoever
  waits for the supervisor's pipes to close waits forever;
- a supervisor ends its workers within a bounded time (`stop_processes`): SIGTERM so each
  drains, SIGKILL for what outlives the grace. The workers are not daemonic (each may
  start a pool of its own), so nothing else would end them.

How the supervisor starts and watches them stays with each process: the front's first
process serves too, the step's supervisor only watches and sums the metrics.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import time
from collections.abc import Iterable
from multiprocessing.process import BaseProcess

log = logging.getLogger("promptcache.runtime")


def stop_when_orphaned(stop: asyncio.Event, what: str) -> None:
    """Set `stop` once this process's multiprocessing parent has exited (nothing to do in a
    process that was not spawned by multiprocessing). The parent's sentinel becomes
    readable when it is gone, whatever ended it; the running loop watches it for the rest
    of the loop's life, so no stop and no SIGKILL of the supervisor leaves this process
    behind. `what` names this process in the warning."""
    supervisor = multiprocessing.parent_process()
    if supervisor is None:
        return
    loop = asyncio.get_running_loop()
    sentinel = supervisor.sentinel

    def orphaned() -> None:
        loop.remove_reader(sentinel)
        log.warning("%s: its supervising process is gone; draining and exiting", what)
        stop.set()

    loop.add_reader(sentinel, orphaned)


def stop_processes(procs: Iterable[BaseProcess], grace_s: float) -> None:
    """SIGTERM each live one (they drain what they serve), then SIGKILL what outlives
    `grace_s`, counted once for all of them; return when every one has exited."""
    procs = list(procs)
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        proc.join(max(deadline - time.monotonic(), 0))
        if proc.is_alive():
            proc.kill()
            proc.join()

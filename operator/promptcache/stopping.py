"""How every long-running promptcache process learns it should stop.

The operator, the cache front and the gateway's policy step each run until SIGTERM (the
kubelet stopping the pod) or SIGINT (a person at a terminal), then drain. Declared once so
the planes agree on which signals mean "stop", without the data plane importing the
controller's server.

A spawned worker process (`--workers N` of the front or the policy step) has one more reason
to stop: its supervisor is gone. In a pod the kernel ends every process of the container
with its first one, but anywhere else (a supervisor killed by SIGKILL, a test, a process
manager without PID namespaces) the worker would go on serving the port alone,
unsupervised, and hold its inherited stdio open, so whoever waits for the supervisor's
pipes to close waits forever.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import signal
from collections.abc import Sequence
from typing import Final

log = logging.getLogger("promptcache.stopping")

STOP_SIGNALS: Final[tuple[signal.Signals, ...]] = (signal.SIGTERM, signal.SIGINT)


def stop_event(signals: Sequence[signal.Signals] = STOP_SIGNALS) -> asyncio.Event:
    """An event set when one of `signals` arrives (the running loop handles them)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    return stop


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

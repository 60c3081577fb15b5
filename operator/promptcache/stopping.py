"""How every long-running promptcache process learns it should stop.

The operator, the cache front and the gateway's policy step each run until SIGTERM (the
kubelet stopping the pod) or SIGINT (a person at a terminal), then drain. Declared once so
the planes agree on which signals mean "stop", without the data plane importing the
controller's server.

A spawned worker process (`--workers N` of the front or the policy step) has one more reason
to stop, its supervisor gone: that is the data plane's own (`runtime.supervision`).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Sequence
from typing import Final

STOP_SIGNALS: Final[tuple[signal.Signals, ...]] = (signal.SIGTERM, signal.SIGINT)


def stop_event(signals: Sequence[signal.Signals] = STOP_SIGNALS) -> asyncio.Event:
    """An event set when one of `signals` arrives (the running loop handles them)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    return stop

"""runtime.supervision: a supervisor ends its `--workers N` processes, whatever they do.

Real spawned processes, as the front and the policy step start them. That a worker stops
once its supervisor is SIGKILLed is tested on the real commands:
tests/front/test_front_command.py and tests/gateway/test_policy_workers.py.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
from multiprocessing.connection import Connection

from promptcache.runtime.supervision import stop_processes

STARTED_WITHIN_S = 60.0


def _deaf_to_sigterm(ready: Connection) -> None:
    """A worker stuck in its drain: SIGTERM does nothing to it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.send(None)
    time.sleep(600)


def test_sigterm_for_each_then_sigkill_for_what_outlives_the_grace() -> None:
    context = multiprocessing.get_context("spawn")
    mine, theirs = context.Pipe(duplex=False)
    deaf = context.Process(target=_deaf_to_sigterm, args=(theirs,))
    obeying = context.Process(target=time.sleep, args=(600,))
    exited = context.Process(target=time.sleep, args=(0,))
    procs = [exited, deaf, obeying]
    for proc in procs:
        proc.start()
    theirs.close()
    try:
        exited.join(STARTED_WITHIN_S)
        assert mine.poll(STARTED_WITHIN_S), "the deaf worker never started"
        mine.recv()  # it ignores SIGTERM from here on
        stop_processes(procs, grace_s=0.5)
        assert [proc.exitcode for proc in procs] == [0, -signal.SIGKILL, -signal.SIGTERM]
    finally:
        mine.close()
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()

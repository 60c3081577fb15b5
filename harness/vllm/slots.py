"""A machine-wide cap on real engines running at once.

Each `vllm serve` takes about 4 GB here; the machine has 24 GiB and is shared by test
sessions, benches and the demo. An engine holds one slot (an exclusive `flock` on one of
`MAX_ENGINES` files) for as long as it runs; a process that wants a slot while all are
held waits, printing who it waits for, instead of pushing the machine into swap or the
OOM killer. The lock dies with the process, so a crashed test never leaks a slot.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

MAX_ENGINES_ENV = "PROMPTCACHE_MAX_ENGINES"
DEFAULT_MAX_ENGINES = 3
WAIT_ENV = "PROMPTCACHE_ENGINE_SLOT_WAIT_SECONDS"
DEFAULT_WAIT_S = 1800.0
"""Long enough for a bench on the same machine to finish; `scripts/test` sets less, since
in a test run nothing else holds slots and a long wait means a pod nobody stopped."""
SLOT_DIR = Path(os.environ.get("PROMPTCACHE_ENGINE_SLOTS", "/tmp/promptcache-engine-slots"))


def max_engines() -> int:
    return max(1, int(os.environ.get(MAX_ENGINES_ENV, DEFAULT_MAX_ENGINES)))


@contextlib.contextmanager
def engine_slot(who: str, timeout_s: float | None = None) -> Iterator[int]:
    """Hold one engine slot for the duration of the block; yields the slot's number."""
    if timeout_s is None:
        timeout_s = float(os.environ.get(WAIT_ENV, DEFAULT_WAIT_S))
    SLOT_DIR.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    said = 0.0
    while True:
        for slot in range(max_engines()):
            handle: IO[str] = (SLOT_DIR / f"slot-{slot}").open("a+")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            handle.seek(0)
            handle.truncate()
            handle.write(f"{os.getpid()} {who}\n")
            handle.flush()
            try:
                yield slot
            finally:
                handle.close()
            return
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(f"no engine slot free within {timeout_s:.0f} s ({holders()})")
        if now - said > 60:
            print(f"engine slots: {who} waits for a free slot ({holders()})", file=sys.stderr)
            said = now
        time.sleep(1.0)


def holders() -> str:
    found = [p.read_text().strip() for p in sorted(SLOT_DIR.glob("slot-*")) if p.stat().st_size]
    return "; ".join(found) or "none recorded"

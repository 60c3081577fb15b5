"""CPU seconds of a process and everything it started, read from /proc (Linux).

A test that compares how two sizes of work scale must compare work, not wall time: on a
shared machine the wall time of one request varies with whatever else runs (a 3x spell is
common at a load of 20 on two cores), while the CPU the front and its JSON workers spend
on it does not. The workers are separate processes, so `time.process_time()` alone misses
them; their counters are in /proc while they run."""

from __future__ import annotations

import os
import time
from pathlib import Path

_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone between the listing and the read
        return None
    # the command name (field 2) is in parentheses and may hold spaces: split after it
    return raw[raw.rindex(")") + 2 :].split()


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out += [int(c) for c in task.read_text().split()]
        except OSError:
            continue
    return out


def descendants(pid: int) -> list[int]:
    """The live processes `pid` started, and theirs, at the moment of reading."""
    found: list[int] = []
    pending = _children(pid)
    while pending:
        child = pending.pop()
        found.append(child)
        pending += _children(child)
    return found


def tree_cpu_seconds(pid: int | None = None) -> float:
    """User and system CPU seconds of `pid` (default: this process) and of its live
    descendants, to the kernel's clock tick (10 ms)."""
    root = os.getpid() if pid is None else pid
    total = time.process_time() if root == os.getpid() else 0.0
    for child in descendants(root) if root == os.getpid() else [root, *descendants(root)]:
        fields = _stat_fields(child)
        if fields is None:
            continue
        utime, stime = int(fields[11]), int(fields[12])  # stat fields 14 and 15
        total += (utime + stime) / _TICKS_PER_SECOND
    return total

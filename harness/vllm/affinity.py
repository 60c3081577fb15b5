"""An engine starts inside the core its pod was given; its scheduler processes float after.

Why. Every Python that imports torch asks MKL how many cores there are, and MKL counts
them by pinning itself to each core it may use, in turn (`at::init_num_threads` ->
`MKL_Read_ThreadENV_Count_Cores`: `sched_setaffinity` to cores 0-1, to 0, to 1, to 0-1
again; `strace -k` on the engine layer's torch, 2026-12-07). A `vllm serve` does that in
each of its three processes (API server, EngineCore, worker), and in the model-registry
probe it may start. On this machine's kernel (Linux 6.18 in a 2-vCPU Firecracker guest) a
move onto the core where another engine's worker spins sometimes does not finish for
minutes: in the adapters e2e module a new pod's EngineCore sat 195 s, and in the next roll
218 s, with under a second of CPU, its kernel stack in `sched_setaffinity` ->
`affine_move_task`, while the old pod's worker served on the other core. It went on at
once when a debugger attached to it. From the new pod's start to the old one's deletion
those two rolls took 255 s and 280 s (the second cut short by that debugger); in the next
run of the same test, where no start stalled, 72 s and 67 s.

A process whose only allowed core is one core has nowhere to move while MKL counts. So
`ProcessPod` starts an engine whose env binds it to cores (`VLLM_CPU_OMP_THREADS_BIND`,
which `harness.engine.cluster_pods` sets per pod) with those cores as its only CPUs, as a
kubelet's static CPU manager starts a Guaranteed pod inside its cpuset. Once the engine's
startup probe passes, `release` gives every process of the engine but the worker every
core again, as they had before: only the start differs. The worker stays, since vLLM
binds its OpenMP threads to those cores itself.

An engine without a core (`nobind`: bare `VllmServer`s and a module's own pods) starts as
before; a `VllmServer` given `start_cores` starts as the kubelet's engines do, which
`bench/engine_start_beside.py` uses to compare both starts beside a serving engine.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from harness.cpu import descendants
from harness.vllm.cpu import OMP_BIND_ENV

WORKER_TITLE: Final = "VLLM::Worker"
"""The process title vLLM gives its worker (`ps`, `/proc/PID/comm`), which keeps its core."""


def bound_cores(env: Mapping[str, str]) -> frozenset[int] | None:
    """The cores `env` binds the engine's worker to (`VLLM_CPU_OMP_THREADS_BIND` as a list
    of cores and ranges: `1`, `0,1`, `0-3`), or None for `auto`, `nobind`, a bind per rank
    (`0|1`) or none; cores this process may not use are dropped."""
    value = env.get(OMP_BIND_ENV, "").strip()
    cores: set[int] = set()
    for part in value.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            return None
        cores.update(range(int(first), int(last or first) + 1))
    usable = cores & os.sched_getaffinity(0)
    return frozenset(usable) or None


def confined(cores: frozenset[int], argv: list[str]) -> list[str]:
    """`argv` run with `cores` as its only CPUs from its first instruction on (util-linux's
    `taskset`, which sets them and execs `argv` in the same process)."""
    return ["taskset", "--cpu-list", ",".join(map(str, sorted(cores))), *argv]


def _title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def release(root: int, keep: str = WORKER_TITLE) -> list[int]:
    """Give every thread of `root` and its descendants the CPUs this process may use, but
    those of processes titled `keep`; returns the processes released. Widening never
    moves a thread (the core it is on stays allowed), so this cannot stall as the count
    above does. A process or thread that ended meanwhile is skipped."""
    every = os.sched_getaffinity(0)
    released: list[int] = []
    for pid in [root, *descendants(root)]:
        if _title(pid).startswith(keep):
            continue
        try:
            threads = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
        except OSError:
            continue
        for tid in threads:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, every)
        released.append(pid)
    return released

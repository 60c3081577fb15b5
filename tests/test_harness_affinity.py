"""An engine bound to a core starts inside it, and all of it but its worker floats after:
`harness.vllm.affinity` on real processes (a stand-in for the engine's process tree: a
parent with a thread, and a child titled as vLLM titles its worker)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cpu import descendants
from harness.vllm.affinity import WORKER_TITLE, bound_cores, confined, release
from harness.vllm.cpu import OMP_BIND_ENV

CORES = sorted(os.sched_getaffinity(0))
needs_two = pytest.mark.skipif(len(CORES) < 2, reason="one usable core: nothing to confine to")

TREE = f"""
import os, subprocess, sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
worker = subprocess.Popen([sys.executable, "-c",
    "open('/proc/self/comm', 'w').write({WORKER_TITLE!r}); import time; time.sleep(60)"])
print(worker.pid, flush=True)
time.sleep(60)
"""
"""A parent with a second thread, and a child that titles itself as vLLM's worker."""


def _allowed(pid: int) -> dict[int, set[int]]:
    """The CPUs each thread of `pid` may use."""
    return {
        int(task.name): os.sched_getaffinity(int(task.name))
        for task in Path(f"/proc/{pid}/task").iterdir()
    }


def _title(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


@pytest.fixture
def tree() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """The stand-in started confined to the last core, with its worker's pid."""
    argv = confined(frozenset({CORES[-1]}), [sys.executable, "-c", TREE])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        worker = int(proc.stdout.readline())
        deadline = time.monotonic() + 30
        while _title(worker) != WORKER_TITLE:  # the child titles itself as it starts
            assert time.monotonic() < deadline, f"the worker stand-in is titled {_title(worker)}"
            time.sleep(0.05)
        yield proc, worker
    finally:
        os.killpg(proc.pid, 9)
        proc.wait(timeout=30)


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (str(CORES[0]), {CORES[0]}),
        (",".join(map(str, CORES)), set(CORES)),
        (f"{CORES[0]}-{CORES[-1]}", set(range(CORES[0], CORES[-1] + 1)) & set(CORES)),
        (f" {CORES[-1]} ", {CORES[-1]}),
        ("auto", None),
        ("nobind", None),
        ("all", None),
        ("0|1", None),  # a bind per rank: several workers, no one core to start in
        ("", None),
        ("1-", None),
        ("-1", None),
        (str(max(CORES) + 64), None),  # a core this machine does not offer
    ],
)
def test_bound_cores_reads_the_engines_bind(value: str, want: set[int] | None) -> None:
    got = bound_cores({OMP_BIND_ENV: value})
    assert (None if got is None else set(got)) == want


def test_no_bind_no_cores() -> None:
    assert bound_cores({}) is None


@needs_two
def test_the_whole_tree_starts_inside_the_core(tree: tuple[subprocess.Popen[str], int]) -> None:
    proc, worker = tree
    pids = [proc.pid, *descendants(proc.pid)]
    assert worker in pids
    for pid in pids:
        for tid, cpus in _allowed(pid).items():
            assert cpus == {CORES[-1]}, f"process {pid} thread {tid} ({_title(pid)}): {cpus}"


@needs_two
def test_release_frees_every_thread_but_the_workers(
    tree: tuple[subprocess.Popen[str], int],
) -> None:
    proc, worker = tree
    released = release(proc.pid)
    assert proc.pid in released
    assert worker not in released
    parent_threads = _allowed(proc.pid)
    assert len(parent_threads) >= 2, "the stand-in's second thread is missing"
    for tid, cpus in parent_threads.items():
        assert cpus == set(CORES), f"thread {tid} of the parent still on {cpus}"
    for tid, cpus in _allowed(worker).items():
        assert cpus == {CORES[-1]}, f"thread {tid} of the worker left its core: {cpus}"


def test_release_skips_a_process_that_is_gone() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    assert release(proc.pid) == []

"""harness.cpu counts the CPU of the processes a test started, while they still run."""

from __future__ import annotations

import os
import subprocess
import sys

from harness.cpu import descendants, tree_cpu_seconds

BURN = """
import sys, time
started = time.process_time()
while time.process_time() - started < 0.3:
    pass
print("burnt", flush=True)
sys.stdin.read()
"""


def test_a_live_childs_cpu_is_counted() -> None:
    before = tree_cpu_seconds()
    child = subprocess.Popen(
        [sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"burnt\n"
        spent = tree_cpu_seconds() - before
    finally:
        child.communicate(b"")
    assert spent >= 0.29, spent  # the child's 0.3 s, counted to the clock tick


NEST = """
import subprocess, sys
grandchild = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                              stdin=subprocess.PIPE)
print(grandchild.pid, flush=True)
sys.stdin.read()
grandchild.communicate(b"")
"""


def test_descendants_reach_a_grandchild() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", NEST], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        assert descendants(child.pid) == [grandchild]
        assert {child.pid, grandchild} <= set(descendants(os.getpid()))
    finally:
        child.communicate(b"")
    assert descendants(child.pid) == []  # gone: nothing to read, no error

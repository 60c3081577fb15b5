"""harness.cpu counts the CPU of the processes a test started, while they still run."""

from __future__ import annotations

import subprocess
import sys

from harness.cpu import tree_cpu_seconds

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

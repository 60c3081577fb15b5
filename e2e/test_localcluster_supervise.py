"""localcluster.supervise on real child process groups: an early exit fails the wait at once
with the exit code and the log tail; `stop` ends a whole group, and kills what ignores
SIGTERM after the grace period; liveness from another process goes by /proc."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.localcluster.errors import ClusterError, ComponentExitedError
from harness.localcluster.supervise import Supervisor, pid_alive
from harness.waiting import wait_until

# Every child gets the work dir as its last argument, as the components get the cluster dir
# in their flags: that is what marks a pid as ours in /proc.
EXITS = "import sys; print('starting up'); print('bad flag --nope', flush=True); sys.exit(3)"
SLEEPS_WITH_CHILD = (
    "import subprocess, sys, time; "
    "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', sys.argv[1]]); "
    "print(c.pid, flush=True); time.sleep(600)"
)
SLEEPS = "import time; print('ready', flush=True); time.sleep(600)"
IGNORES_TERM = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(600)"
)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Supervisor]:
    pids: dict[str, int] = {}
    sup = Supervisor(tmp_path, pids)
    try:
        yield sup
    finally:
        for pid in pids.values():  # whatever a failed test left
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def start(sup: Supervisor, name: str, code: str) -> None:
    sup.start(name, [sys.executable, "-c", code, str(sup.workdir)])


def log_has(sup: Supervisor, name: str, text: str) -> bool:
    return sup.log_path(name).is_file() and text in sup.log_path(name).read_text()


def test_an_early_exit_fails_the_wait_with_code_and_log_tail(procs: Supervisor) -> None:
    saved: list[dict[str, int]] = []
    procs.on_change = lambda: saved.append(dict(procs.pids))
    start(procs, "broken", EXITS)
    assert saved == [{"broken": procs.pids["broken"]}]  # persisted at start
    with pytest.raises(ComponentExitedError) as err:
        # Never true: only the component's death can end this wait before the timeout.
        procs.wait_until("broken ready", lambda: False, 300, "broken")
    assert "broken exited (code 3)" in str(err.value)
    assert "bad flag --nope" in str(err.value)
    assert "starting up" in str(err.value)


def test_a_wait_that_times_out_names_what_and_shows_the_log(procs: Supervisor) -> None:
    start(procs, "slow", IGNORES_TERM)
    procs.wait_until("slow logs", lambda: log_has(procs, "slow", "ready"), 60, "slow")
    with pytest.raises(ClusterError) as err:
        procs.wait_until("something never true", lambda: False, 0.5, "slow")
    assert not isinstance(err.value, ComponentExitedError)
    assert "timed out after" in str(err.value)
    assert "waiting for something never true" in str(err.value)
    assert "ready" in str(err.value)
    procs.stop(["slow"], grace=0.2)


def test_connection_errors_are_not_yet_ready(procs: Supervisor) -> None:
    start(procs, "up", IGNORES_TERM)
    calls = []

    def check() -> bool:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError("port not open yet")
        return True

    procs.wait_until("port", check, 60, "up")
    assert len(calls) == 3
    procs.stop(["up"], grace=0.2)


def test_stop_ends_the_whole_group(procs: Supervisor) -> None:
    start(procs, "parent", SLEEPS_WITH_CHILD)
    procs.wait_until(
        "grandchild started",
        lambda: procs.log_path("parent").read_text().strip().isdigit(),
        60,
        "parent",
    )
    grandchild = int(procs.log_path("parent").read_text().strip())
    assert pid_alive(grandchild, str(procs.workdir))
    procs.stop(["parent"], grace=30)
    assert not procs.alive("parent")
    wait_until(
        lambda: pid_alive(grandchild, str(procs.workdir)),
        f"the grandchild {grandchild} gone after its group was stopped (alive?)",
        within_s=30,
        interval_s=0.05,
        until=lambda alive: not alive,
    )


def test_sigterm_ignored_then_killed_after_grace(
    procs: Supervisor, capsys: pytest.CaptureFixture[str]
) -> None:
    start(procs, "stubborn", IGNORES_TERM)
    procs.wait_until("handler set", lambda: log_has(procs, "stubborn", "ready"), 60, "stubborn")
    pid = procs.pids["stubborn"]
    procs.stop(["stubborn"], grace=0.5)
    assert not procs.alive("stubborn")
    assert f"stubborn (pid {pid}) ignored SIGTERM for 0s; killing" in capsys.readouterr().err


def test_another_process_sees_liveness_through_proc(procs: Supervisor, tmp_path: Path) -> None:
    """`down` from another shell has no Popen handles: a fresh Supervisor over the same pids
    judges by /proc, and only a pid whose command line names the work dir is ours."""
    start(procs, "svc", SLEEPS)
    # Until the child has exec'd, /proc shows the forked parent's command line: wait for it.
    procs.wait_until("svc started", lambda: log_has(procs, "svc", "ready"), 60, "svc")
    other = Supervisor(procs.workdir, dict(procs.pids))
    assert other.alive("svc")
    assert not pid_alive(os.getpid(), str(tmp_path / "elsewhere"))  # alive, but not ours
    other.stop(["svc"], grace=30)
    assert not other.alive("svc")
    # /proc drops an exiting process's command line a moment before the kernel reports its
    # exit to the parent: our own handle may lag the /proc view by that moment.
    wait_until(
        lambda: procs.alive("svc"),
        "our own handle seeing svc exit (alive?)",
        within_s=30,
        interval_s=0.05,
        until=lambda alive: not alive,
    )

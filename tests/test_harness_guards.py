"""harness/pytest_guards.py: a module leaving a child process, or a test leaving an asyncio
task, fails and names it; what a fixture stops in its teardown is fine.

Each case runs a real pytest session on small test files with the plugin loaded, as the
suite loads it, and reads its verdict."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LEAKY = """
import subprocess

def test_leaves_a_process():
    subprocess.Popen(["sleep", "3017.5"])

def test_after_it():
    pass
"""

TIDY = """
import multiprocessing
import subprocess
from concurrent.futures import ProcessPoolExecutor
import pytest

@pytest.fixture(scope="session")
def session_sleeper():
    proc = subprocess.Popen(["sleep", "3017.25"])
    yield proc
    proc.kill()
    proc.wait()

@pytest.fixture(scope="module")
def pool():
    # Workers start on the first job, inside a test; the fixture stops them at its teardown.
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield pool

def test_a_module_fixtures_lazy_workers_are_the_modules(pool, session_sleeper):
    assert pool.submit(abs, -3).result(timeout=60) == 3

@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "3017.75"])
    yield proc
    proc.terminate()
    proc.wait()

def test_stops_what_it_started(sleeper):
    assert sleeper.poll() is None
"""

TASKS = """
import asyncio
import pytest

async def forever():
    await asyncio.sleep(3600)

async def test_leaves_a_task():
    asyncio.create_task(forever(), name="the-forgotten-one")
    await asyncio.sleep(0)

@pytest.fixture
async def server_task():
    task = asyncio.create_task(forever())
    yield task
    task.cancel()

async def test_a_fixture_that_cancels_its_task(server_task):
    await asyncio.sleep(0)
    assert not server_task.done()

async def test_awaits_what_it_starts():
    await asyncio.wait_for(asyncio.create_task(asyncio.sleep(0.01)), 5)
"""


def test_leaked_processes_and_tasks_fail_and_are_named(tmp_path: Path) -> None:
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    (tmp_path / "test_tidy.py").write_text(TIDY)
    (tmp_path / "test_tasks.py").write_text(TASKS)
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "operator")])}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "harness.pytest_guards"]
    run = subprocess.run(
        [*cmd, "-rA", "-q", "test_leaky.py", "test_tidy.py", "test_tasks.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    out = run.stdout
    # The ERRORS section names the pid, and so does the short summary where pytest prints it
    # whole (it does when the CI variable is set): one process, named once or twice.
    leaked = sorted({int(pid) for pid in re.findall(r"pid (\d+): sleep 3017\.5 ", out)})
    try:
        assert "ERROR test_leaky.py::test_after_it" in out, out  # the module's last test
        assert "this module left 1 child process(es) running" in out, out
        assert "(appeared during test_leaky.py::test_leaves_a_process)" in out, out
        assert len(leaked) == 1, out
        assert "ERROR test_tasks.py::test_leaves_a_task" in out, out
        assert "the-forgotten-one: forever at" in out, out
        for ok in (
            "test_tidy.py::test_a_module_fixtures_lazy_workers_are_the_modules",
            "test_tidy.py::test_stops_what_it_started",
            "test_tasks.py::test_a_fixture_that_cancels_its_task",
            "test_tasks.py::test_awaits_what_it_starts",
        ):
            assert f"PASSED {ok}" in out, out
            assert f"ERROR {ok}" not in out, out
        assert "7 passed, 2 errors" in out, out
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True)
        assert "sleep 3017.25" not in ps.stdout
        assert "sleep 3017.75" not in ps.stdout
    finally:
        for pid in leaked:  # left running by design: the guard names, it does not kill
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

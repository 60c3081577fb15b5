"""Pytest plugin: a test module that leaves a child process behind fails, and so does a test
that leaves an asyncio task pending; both name what they left.

Why: what a test leaves running outlives it silently. A child process holds a port, a
slot or a core for the rest of the session and makes a later, unrelated test fail on a
busy machine; an asyncio task still pending when the test's event loop closes is cancelled
without a word by pytest-asyncio, so a test that forgot to stop a server or await a
request passes while its code would leak in production.

- Processes are checked per module, after the module's fixtures are torn down: a
  module-scoped fixture may start workers lazily inside a test (a process pool spawns on
  its first job) and stop them at its teardown, which is fine. A child still running then
  fails the module's last test, naming it and the test during which it appeared; it is
  left running (killing what a wider fixture might still use would fail unrelated tests).
  Exempt: children born while a session-scoped fixture was set up, multiprocessing's
  resource tracker (one per interpreter, for its whole life), and the pods a wider fixture
  starts lazily (`ProcessPod.outlives_module`, e.g. the engine tests' `front_for`). Pods as
  such are checked by `e2e/conftest.py`.
- Tasks are checked per test, on the test's own event loop (pytest-asyncio's
  function-scoped runner), after the async fixtures are torn down and before the loop
  closes.

Registered from tests/conftest.py and e2e/conftest.py (as harness.pytest_cluster is).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Generator, Iterator
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

import pytest

from harness.pod import running_pods

EXIT_GRACE_S = 2.0
"""A child a fixture stopped without waiting for it gets this long to go before it counts."""

_session_owned: set[int] = set()
"""Children born while a session-scoped fixture was being set up: the session's, not a
module's (a module that first asks for the fixture pays for its start, not its leak)."""
_first_seen: dict[int, str] = {}
"""When a child first appeared: the test (node id) during which it did."""


def child_pids(pid: int | None = None) -> set[int]:
    """The live (not zombie) direct children of `pid` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    found: set[int] = set()
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            found.update(int(c) for c in children.read_text().split())
    return {c for c in found if _alive(c)}


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _describe(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        cmd = " ".join(a.decode(errors="replace") for a in argv if a)
    except OSError:
        cmd = "?"
    during = _first_seen.get(pid)
    return f"pid {pid}: {cmd[:300]}" + (f" (appeared during {during})" if during else "")


def _exempt_pids() -> set[int]:
    """The session's children: its fixtures', the resource tracker, wider fixtures' pods."""
    pids = set(_session_owned)
    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    if tracker is not None:
        pids.add(tracker)
    for pod in running_pods():
        if pod.outlives_module:
            pids.update(c.proc.pid for c in pod.containers if c.proc is not None)
    return pids


_CAN_READ_CHILDREN = Path(f"/proc/{os.getpid()}/task").is_dir()


@pytest.fixture(scope="module", autouse=True)
def no_child_process_outlives_its_module() -> Iterator[None]:
    """Fails the module whose fixtures and tests leave a child process running."""
    if not _CAN_READ_CHILDREN:  # not Linux: nothing to read children from
        yield
        return
    before = child_pids()
    yield
    deadline = time.monotonic() + EXIT_GRACE_S
    left = child_pids() - before - _exempt_pids()
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = {p for p in left if _alive(p)} - _exempt_pids()
    if left:
        names = [_describe(p) for p in sorted(left)]
        pytest.fail(
            f"this module left {len(names)} child process(es) running:\n  " + "\n  ".join(names),
            pytrace=False,
        )


@pytest.fixture(autouse=True)
def _note_children_a_test_starts(request: pytest.FixtureRequest) -> Iterator[None]:
    """Remembers during which test each child appeared, for the module's message."""
    if not _CAN_READ_CHILDREN:
        yield
        return
    before = child_pids()
    yield
    for pid in child_pids() - before:
        _first_seen.setdefault(pid, request.node.nodeid)


def _describe_task(task: asyncio.Task[Any]) -> str:
    coro = task.get_coro()
    where = ""
    frame = getattr(coro, "cr_frame", None)
    if frame is not None:
        where = f" at {frame.f_code.co_filename}:{frame.f_lineno}"
    name = getattr(coro, "__qualname__", repr(coro))
    return f"{task.get_name()}: {name}{where}"


def _pending_tasks(runner: asyncio.Runner) -> list[asyncio.Task[Any]]:
    loop = runner.get_loop()
    if loop.is_closed():
        return []
    # A task cancelled in a fixture's teardown finishes on the loop's next turns.
    for _ in range(3):
        if not asyncio.all_tasks(loop):
            break
        loop.run_until_complete(asyncio.sleep(0))
    return [t for t in asyncio.all_tasks(loop) if not t.done()]


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
) -> Generator[None, Any, Any]:
    """Notes the children a session-scoped fixture starts (the session's, not a module's);
    and on a test's own event loop (pytest-asyncio's function-scoped runner), once the async
    fixtures registered after it are torn down and before the loop closes (which would
    cancel what is left without a word), fails on any task still pending."""
    if fixturedef.scope == "session" and _CAN_READ_CHILDREN:
        before = child_pids()
        try:
            return (yield)
        finally:
            _session_owned.update(child_pids() - before)
    result = yield
    if fixturedef.argname == "_function_scoped_runner" and isinstance(result, asyncio.Runner):
        runner = result

        def check() -> None:
            pending = _pending_tasks(runner)
            if pending:
                names = sorted(_describe_task(t) for t in pending)
                pytest.fail(
                    f"this test left {len(names)} asyncio task(s) pending (cancelled with "
                    "its event loop):\n  " + "\n  ".join(names),
                    pytrace=False,
                )

        fixturedef.addfinalizer(check)
    return result

"""harness/waiting.py: a failed wait names what it waited for and the probe's last state and
error; async probes are awaited; a process that exits fails `wait_for_line` at once.

Real processes, real sockets, real time: nothing here is mocked."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.operator import wait_for
from harness.waiting import NotMet, eventually, wait_for_line, wait_until


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_the_failure_names_what_and_quotes_the_last_state() -> None:
    seen: list[int] = []

    def probe() -> dict[str, int]:
        seen.append(len(seen))
        return {"probes": len(seen)}

    with pytest.raises(NotMet) as failed:
        wait_until(
            probe, "the counter to go negative", within_s=0.3, until=lambda s: s["probes"] < 0
        )
    message = str(failed.value)
    assert message.startswith("the counter to go negative: not met within 0.3 s"), message
    assert f"last state: {{'probes': {len(seen)}}}" in message, message
    assert len(seen) > 1, "probed more than once in 0.3 s"


def test_the_failure_quotes_the_probes_last_error() -> None:
    port = _closed_port()

    def probe() -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
            return conn.recv(1)

    with pytest.raises(NotMet) as failed:
        wait_until(probe, "a greeting", within_s=0.2, retry_on=(OSError,))
    message = str(failed.value)
    assert "last state: (the probe never returned)" in message, message
    assert "last error from the probe: ConnectionRefusedError" in message, message


def test_an_error_not_retried_fails_at_once() -> None:
    empty: dict[str, int] = {}
    t0 = time.monotonic()
    with pytest.raises(KeyError):
        wait_until(lambda: empty["missing"], "a key", within_s=30)
    assert time.monotonic() - t0 < 5


def test_it_returns_the_state_met_and_backs_off() -> None:
    """A listener that comes up later: the wait returns the probe's state, and polls a few
    dozen times at most, not every millisecond."""
    port = _closed_port()
    probes = 0

    def probe() -> str:
        nonlocal probes
        probes += 1
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return "connected"

    server = subprocess.Popen(
        [sys.executable, "-c",
         "import socket, time; time.sleep(0.5); s = socket.create_server(('127.0.0.1', "
         f"{port})); s.accept()[0].close()"],
    )  # fmt: skip
    try:
        got = wait_until(
            probe, "the late listener", within_s=60, interval_s=0.2, retry_on=(OSError,)
        )
        assert got == "connected"
        assert 2 <= probes <= 40, probes
    finally:
        server.kill()
        server.wait()


def test_fail_if_stops_the_wait_at_once_with_its_reason() -> None:
    t0 = time.monotonic()
    with pytest.raises(NotMet) as failed:
        wait_until(
            lambda: 1, "two", within_s=60, until=lambda n: n == 2,
            fail_if=lambda: "nothing will change it", detail=lambda: "the context",
        )  # fmt: skip
    assert time.monotonic() - t0 < 5
    message = str(failed.value)
    assert message.startswith("two: nothing will change it"), message
    assert "last state: 1" in message
    assert message.endswith("the context")


def test_the_e2e_wait_for_judges_with_until_and_stops_on_fail_if() -> None:
    """`harness.operator.wait_for` (the e2e modules' argument order) passes `until` and
    `fail_if` through: a state that is truthy but not the one wanted does not end the wait,
    and a reason to stop ends it at once, quoting the last state."""
    states = iter([{"a": 1}, {"a": 2}])
    assert wait_for(lambda: next(states), "a is 2", 60, 0.01, until=lambda s: s == {"a": 2}) == {
        "a": 2
    }
    t0 = time.monotonic()
    with pytest.raises(NotMet) as failed:
        wait_for(
            lambda: {"a": 1}, "a is 2", 60, 0.01,
            until=lambda s: s == {"a": 2}, fail_if=lambda: "the pod keeps failing",
        )  # fmt: skip
    assert time.monotonic() - t0 < 5
    message = str(failed.value)
    assert message.startswith("a is 2: the pod keeps failing"), message
    assert "last state: {'a': 1}" in message


async def test_an_async_probe_is_awaited_and_its_state_returned() -> None:
    port = _closed_port()
    accepted = 0

    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        writer.write(b"hello")
        await writer.drain()
        writer.close()

    async def probe() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            return await reader.read(5)
        finally:
            writer.close()
            await writer.wait_closed()

    async def serve_later() -> asyncio.Server:
        await asyncio.sleep(0.2)
        return await asyncio.start_server(greet, "127.0.0.1", port)

    starting = asyncio.create_task(serve_later())
    try:
        got = await eventually(probe, "a greeting", within_s=60, retry_on=(OSError,))
        assert got == b"hello"
        assert accepted == 1
    finally:
        server = await starting
        server.close()
        await server.wait_closed()


async def test_an_async_probes_last_state_is_in_the_failure() -> None:
    values = iter(range(1000))

    async def probe() -> int:
        await asyncio.sleep(0)
        return next(values)

    with pytest.raises(NotMet) as failed:
        await eventually(probe, "a thousand", within_s=0.2, until=lambda n: n >= 1000)
    last = next(values) - 1
    assert f"last state: {last}\n" in str(failed.value) + "\n", str(failed.value)


async def test_a_sync_probe_works_in_eventually() -> None:
    box: list[str] = []
    asyncio.get_running_loop().call_later(0.1, box.append, "filled")
    assert await eventually(lambda: list(box), "the box filled", within_s=60) == ["filled"]


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()


def _spawn(code: str, log: Path, procs: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT)
    procs.append(proc)
    return proc


def test_wait_for_line_fails_at_once_when_the_process_exits(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    log = tmp_path / "dying.log"
    proc = _spawn("import sys; print('cannot bind the port', flush=True); sys.exit(3)", log, procs)
    t0 = time.monotonic()
    with pytest.raises(NotMet) as failed:
        wait_for_line(log, "listening", proc, within_s=120)
    assert time.monotonic() - t0 < 60, "failed at the exit, not at the deadline"
    message = str(failed.value)
    assert "the process exited 3 before logging 'listening'" in message, message
    assert message.endswith("log tail:\ncannot bind the port"), message


def test_wait_for_line_returns_the_log_once_the_line_is_there(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    log = tmp_path / "ready.log"
    code = "import time; time.sleep(0.2); print('listening on 1234', flush=True); time.sleep(600)"
    proc = _spawn(code, log, procs)
    assert wait_for_line(log, "listening", proc, within_s=60) == "listening on 1234\n"
    assert proc.poll() is None


def test_a_line_logged_by_a_process_that_then_exited_counts(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    log = tmp_path / "oneshot.log"
    proc = _spawn("print('done', flush=True)", log, procs)
    proc.wait()
    assert wait_for_line(log, "done", proc, within_s=60) == "done\n"

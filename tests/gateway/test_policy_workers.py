"""`promptcache gateway-policy --workers N`: several processes on one port, as one step.

The real command runs as a subprocess in front of the recording stand-in picker; gateways
dial it over fresh connections (SO_REUSEPORT spreads connections, not streams)."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc.aio
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from harness.extproc_gateway import (
    JSON,
    TIMEOUT,
    Gateway,
    Upstream,
    body_msg,
    chat,
    echoed,
    headers_msg,
    read_rest,
)
from harness.net import free_port
from harness.waiting import eventually

STARTED = "gateway policy step listening on"
Launch = Callable[..., "Step"]


class Step:
    """One `promptcache gateway-policy` process and its log."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log_path = log
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "promptcache.cli", "gateway-policy", *argv],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def started(self) -> None:
        """Until the log holds the start-up line; at once if the step exits first."""

        def exited() -> str | None:
            code = self.proc.poll()
            return None if code is None else f"exited {code}"

        await eventually(
            self.log,
            f"{STARTED!r} in the step's log",
            within_s=TIMEOUT,
            interval_s=0.05,
            until=lambda log: STARTED in log,
            fail_if=exited,
            detail=lambda: f"log:\n{self.log()}",
        )

    async def exited(self) -> int:
        code = await asyncio.to_thread(self.proc.wait, TIMEOUT)
        self._log.close()
        return code

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(TIMEOUT)
        self._log.close()


@pytest.fixture
def launch(upstream: Upstream, tmp_path: Path) -> Iterator[Launch]:
    started: list[Step] = []

    def factory(*argv: str, port: int, metrics: int | None = None) -> Step:
        step = Step(
            [
                "--listen", f"127.0.0.1:{port}", "--upstream", upstream.target,
                "--metrics-listen", f"127.0.0.1:{metrics}" if metrics else "",
                "--max-buffered-bytes", str(64 * 1024**2), "--drain-seconds", "5",
                "--isolation-mode", "Shared", *argv,
            ],
            tmp_path / f"step-{len(started)}.log",
        )  # fmt: skip
        started.append(step)
        return step

    try:
        yield factory
    finally:
        for step in started:
            step.stop()


async def exchange_each_on_a_new_connection(port: int, n: int, **headers: str) -> list[Any]:
    """`n` requests, each on its own connection (as `n` gateway threads would send them)."""

    async def one(i: int) -> Any:
        # grpc-python shares connections between a process's channels unless told not to
        options = [("grpc.use_local_subchannel_pool", 1)]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            call = pb_grpc.ExternalProcessorStub(channel).Process(timeout=TIMEOUT)
            await call.write(headers_msg({**JSON, **headers}))
            await call.write(body_msg(chat(f"user-{i}")))
            await call.done_writing()
            return [r async for r in call]

    return await asyncio.gather(*(one(i) for i in range(n)))


async def test_workers_share_the_port_and_each_serves(launch: Launch, upstream: Upstream) -> None:
    port = free_port()
    step = launch("--workers", "2", port=port)
    await step.started()
    answers = await exchange_each_on_a_new_connection(port, 16)
    # every request was decided (its `user` named the session) and reached the picker
    assert [echoed(a) for a in answers] == [f"user-{i}" for i in range(16)]
    # Each worker dials the picker over a connection of its own: two workers served
    # (16 connections all landing on one of two workers: 2**-15).
    assert len({s.peer for s in upstream.fake.streams}) == 2


async def test_refusals_are_counted_once_across_workers(launch: Launch, tmp_path: Path) -> None:
    """Each worker counts its own; the metrics port serves their sum."""
    salt = tmp_path / "salt-key"
    salt.write_text("0" * 64)
    salt.chmod(0o600)
    port, metrics = free_port(), free_port()
    step = launch(
        "--workers", "2", "--isolation-mode", "Required", "--salt-key-file", str(salt),
        port=port, metrics=metrics,
    )  # fmt: skip
    await step.started()
    answers = await exchange_each_on_a_new_connection(port, 6)
    assert all(a[0].WhichOneof("response") == "immediate_response" for a in answers)
    text = await asyncio.to_thread(_scrape, metrics)
    line = 'promptcache_gateway_policy_refusals_total{code="isolation_key_required"} 6.0'
    assert line in text.splitlines(), text


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=TIMEOUT) as resp:
        return str(resp.read().decode())


async def test_a_second_step_cannot_share_the_port(launch: Launch) -> None:
    port = free_port()
    first = launch("--workers", "2", port=port)
    await first.started()
    second = launch("--workers", "2", port=port)
    assert await second.exited() == 1
    assert f"cannot listen on 127.0.0.1:{port}: another policy step serves it" in second.log()
    single = launch(port=port)  # without SO_REUSEPORT it cannot bind beside the workers
    assert await single.exited() == 1
    assert f"cannot listen on 127.0.0.1:{port}" in single.log()


async def test_sigterm_drains_the_workers_and_frees_the_port(launch: Launch) -> None:
    port = free_port()
    step = launch("--workers", "2", port=port)
    await step.started()
    gateway = Gateway(f"127.0.0.1:{port}")
    try:
        call = gateway.open()
        await call.write(headers_msg(JSON))
        await call.write(body_msg(chat("open")))
        assert (await asyncio.wait_for(call.read(), TIMEOUT)).WhichOneof("response")
        step.proc.send_signal(signal.SIGTERM)
        # The open stream is answered to its end after SIGTERM (drain), then all exit.
        await call.done_writing()
        rest = [r.WhichOneof("response") for r in await read_rest(call)]
        assert rest == ["request_body"]
    finally:
        await gateway.close()
    assert await step.exited() == 0
    with socket.socket() as probe:
        # nothing of the step listens on it any more (closed connections may linger)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))
        probe.listen()


async def test_workers_of_a_killed_step_drain_and_free_the_port(launch: Launch) -> None:
    """A supervisor killed outright (SIGKILL: no drain of its own) leaves no worker serving
    the port on its own: each notices within a second, drains and exits."""
    port = free_port()
    step = launch("--workers", "2", port=port)
    await step.started()
    step.proc.kill()
    await step.exited()

    def port_free() -> bool:
        with socket.socket() as probe:
            try:
                probe.connect(("127.0.0.1", port))
            except ConnectionRefusedError:
                return True
            return False

    await eventually(
        lambda: asyncio.to_thread(port_free),
        "the killed step's workers letting go of its port (free?)",
        within_s=TIMEOUT,
        interval_s=0.1,
    )

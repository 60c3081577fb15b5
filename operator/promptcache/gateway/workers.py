"""Several policy-step processes on one port: `promptcache gateway-policy --workers N`.

One Python process relays about one core's worth of ext_proc streams: nearly all of its CPU
goes to gRPC's per-message work (bench/gateway_hop.py), which no change inside the process
removes. The Endpoint Picker pod has one active picker (replicas beyond one stand by for
leader election), so the step scales inside the pod: N spawned processes each bind the
listen port with SO_REUSEPORT, and the kernel spreads the gateway's connections over them.

This process supervises them and serves their summed metrics (prometheus_client's
multiprocess mode, in a private temporary directory). It claims the port first, with an
abstract Unix socket named after it, so a second step still fails instead of taking a
share of the streams (the single-process step gets the same guarantee from binding without
SO_REUSEPORT). Each worker holds an equal share of `--max-buffered-bytes`, so the step as a
whole holds what one process did. A worker that dies takes the step down with it (exit 1):
the kubelet restarts the container, as it would restart a single-process step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Final

from promptcache.contract.settings import split_host_port
from promptcache.gateway.settings import GatewayPolicySettings
from promptcache.runtime.supervision import stop_processes, stop_when_orphaned
from promptcache.stopping import STOP_SIGNALS, stop_event

log = logging.getLogger("promptcache.gateway_policy")

START_TIMEOUT_SECONDS: Final[float] = 60.0
_MULTIPROC_ENV: Final[str] = "PROMETHEUS_MULTIPROC_DIR"
_LOG_FORMAT: Final[str] = "%(asctime)s %(levelname)s %(name)s %(message)s"


def claim_port(listen: str) -> socket.socket:
    """An abstract Unix socket named after `listen`: a second step (same pod, same network
    namespace) cannot bind it, so it cannot join this one's SO_REUSEPORT group. Keep the
    socket open for as long as the port is served."""
    claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        claim.bind(f"\0promptcache-gateway-policy:{listen}")
    except OSError:
        claim.close()
        raise OSError(f"cannot listen on {listen}: another policy step serves it") from None
    return claim


def _worker(settings: GatewayPolicySettings, secret: bytes | None, ready: Connection) -> None:
    """A spawned worker's body: serve until SIGTERM or SIGINT, then drain."""
    logging.basicConfig(level=logging.INFO, format=_LOG_FORMAT)
    asyncio.run(_serve_worker(settings, secret, ready))


async def _serve_worker(
    settings: GatewayPolicySettings, secret: bytes | None, ready: Connection
) -> None:
    # Imported here, in the spawned process, after the supervisor set the metrics directory:
    # prometheus_client reads it when first imported.
    from promptcache.gateway.server import start  # noqa: PLC0415

    try:
        running = await start(settings, secret, reuse_port=True)
    except (OSError, ValueError) as error:
        ready.send(str(error))
        return
    stopping = stop_event()
    stop_when_orphaned(stopping, "a policy-step worker")
    ready.send(None)
    try:
        await stopping.wait()
    finally:
        await running.stop()


def _start_workers(
    settings: GatewayPolicySettings, secret: bytes | None
) -> tuple[list[BaseProcess], str | None]:
    """Spawn `settings.workers` processes and wait until each serves or fails; the
    processes, and the first failure (None: all serve)."""
    context = multiprocessing.get_context("spawn")  # no fork of a process that ran gRPC
    procs: list[BaseProcess] = []
    pending: dict[Connection, BaseProcess] = {}
    for i in range(settings.workers):
        mine, theirs = context.Pipe(duplex=False)
        proc = context.Process(
            target=_worker, args=(settings, secret, theirs), name=f"gateway-policy-{i}"
        )
        proc.start()
        theirs.close()
        procs.append(proc)
        pending[mine] = proc
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return procs, f"a worker did not start within {START_TIMEOUT_SECONDS:g} s"
        woken = set(wait(list(pending), timeout=remaining))
        for conn in [c for c in pending if c in woken]:
            try:
                failure = conn.recv()
            except EOFError:
                failure = f"a worker exited with {pending[conn].exitcode} before serving"
            if failure is not None:
                return procs, str(failure)
            del pending[conn]
    return procs, None


def _serve_metrics(settings: GatewayPolicySettings, directory: str) -> None:
    from prometheus_client import CollectorRegistry, start_http_server  # noqa: PLC0415
    from prometheus_client.multiprocess import MultiProcessCollector  # noqa: PLC0415

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    host, port = split_host_port("--metrics-listen", settings.metrics_listen)
    start_http_server(port, addr=host, registry=registry)


def serve_workers(settings: GatewayPolicySettings, secret: bytes | None = None) -> int:
    """Run `settings.workers` processes on the port until SIGTERM or SIGINT, then drain them;
    the `gateway-policy` sub-command's body when `--workers` is above one."""
    logging.basicConfig(level=logging.INFO, format=_LOG_FORMAT)
    try:
        claim = claim_port(settings.listen)
    except OSError as error:
        log.error("gateway policy step cannot start: %s", error)
        return 1
    directory = tempfile.mkdtemp(prefix="promptcache-gateway-policy-metrics-")
    os.environ[_MULTIPROC_ENV] = directory  # inherited by the workers, read at their import
    wake_read, wake_write = socket.socketpair()
    wake_read.setblocking(False)
    wake_write.setblocking(False)
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)
    signal.set_wakeup_fd(wake_write.fileno())
    procs: list[BaseProcess] = []
    try:
        procs, failure = _start_workers(settings, secret)
        if failure is not None:
            log.error("gateway policy step cannot start: %s", failure)
            return 1
        if settings.metrics_listen:
            _serve_metrics(settings, directory)
        log.info(
            "gateway policy step listening on %s with %d worker processes, relaying ext_proc "
            "to the Endpoint Picker at %s; isolation %s; bodies up to %d bytes (%d bytes for "
            "all requests, an equal share per worker)",
            settings.listen, settings.workers, settings.upstream,
            settings.isolation_mode.value, settings.max_body_bytes, settings.max_buffered_bytes,
        )  # fmt: skip
        sentinels = {proc.sentinel: proc for proc in procs}
        while not stopping:
            woken = wait([*sentinels, wake_read])
            if wake_read in woken:
                with contextlib.suppress(BlockingIOError):
                    wake_read.recv(64)  # a signal arrived: the loop checks `stopping`
                continue
            proc = sentinels[woken[0]]  # type: ignore[index]
            log.error(
                "gateway policy step worker %s exited with %s; stopping the step",
                proc.name, proc.exitcode,
            )  # fmt: skip
            return 1
        log.info(
            "gateway policy step stopping: draining open streams for %ss", settings.drain_seconds
        )
        return 0
    finally:
        stop_processes(procs, settings.drain_seconds + 5)  # each drains its open streams
        signal.set_wakeup_fd(-1)
        wake_read.close()
        wake_write.close()
        claim.close()
        shutil.rmtree(directory, ignore_errors=True)
        log.info("gateway policy step stopped")

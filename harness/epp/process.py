"""Start and stop the real Endpoint Picker process with a given config and flags.

The EPP is run as users run it: the rendered `EndpointPickerConfig` and the
rendered container args, of which the harness rewrites only ports (free ones on
127.0.0.1) and file paths (the config file). Transport stays as rendered: a picker
rendered without `--secure-serving=false` serves TLS, and the harness talks to it
through a TLS relay as a gateway would (`tls_relay.py`). Its log is kept in a file
so a failing test can show it, and so tests can read the effective configuration
the EPP prints at start-up.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import grpc

from harness.net import accepts_connections, free_port
from harness.waiting import wait_until

from .extproc import ExtProcClient

# What the harness rewrites: ports, and the config file's path. Nothing else.
_PORT_FLAGS = ("--grpc-port", "--grpc-health-port", "--metrics-port")
_PATH_FLAGS = ("--config-file", "--config-text")
_HARNESS_FLAGS = (*_PORT_FLAGS, *_PATH_FLAGS)


def terminate(proc: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    """SIGTERM, a grace period, then SIGKILL; the exit code (None: it never ran)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    return proc.returncode


def strip_flags(args: Iterable[str], names: Sequence[str] = _HARNESS_FLAGS) -> list[str]:
    """Drop `--name=value` / `--name value` pairs for flags the harness sets itself."""
    out: list[str] = []
    it = iter(args)
    for arg in it:
        name = arg.split("=", 1)[0]
        if name in names:
            if "=" not in arg:
                nxt = next(it, None)
                # A bare boolean flag has no separate value.
                if nxt is not None and nxt.startswith("--"):
                    out.append(nxt)
            continue
        out.append(arg)
    return out


@dataclass
class EppPorts:
    grpc: int
    health: int
    metrics: int


class EppProcess:
    """One running Endpoint Picker; use as a context manager so it always stops."""

    def __init__(
        self,
        binary: Path,
        config_text: str,
        workdir: Path,
        pool_name: str | None,
        pool_namespace: str = "default",
        extra_args: Sequence[str] = (),
        kubeconfig: Path | None = None,
    ) -> None:
        """`extra_args`: the rendered container args (plus any a test adds on purpose);
        `--pool-name`/`--pool-namespace` are added only when they are missing."""
        self.binary = binary
        self.workdir = workdir
        self.config_path = workdir / "epp-config.yaml"
        self.log_path = workdir / "epp.log"
        self.ports = EppPorts(free_port(), free_port(), free_port())
        self.config_path.write_text(config_text)
        args = [
            f"--grpc-port={self.ports.grpc}",
            f"--grpc-health-port={self.ports.health}",
            f"--metrics-port={self.ports.metrics}",
            f"--config-file={self.config_path}",
        ]
        rendered = strip_flags(extra_args, _HARNESS_FLAGS)
        names = {a.split("=", 1)[0] for a in rendered}
        if pool_name is not None and "--pool-name" not in names:
            args += [f"--pool-name={pool_name}", f"--pool-namespace={pool_namespace}"]
        self.secure = not any(
            a.split("=", 1)[0] == "--secure-serving" and a.split("=", 1)[-1] == "false"
            for a in rendered
        )
        """Whether the picker serves ext_proc over TLS (its default), as rendered."""
        self.args = [str(binary), *args, *rendered]
        self.env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG",)}
        if kubeconfig is not None:
            self.env["KUBECONFIG"] = str(kubeconfig)
        # No proxies for loopback gRPC/HTTP, whatever the CI environment says.
        self.env["NO_PROXY"] = self.env["no_proxy"] = "127.0.0.1,localhost"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None

    # --- lifecycle ---------------------------------------------------------------
    def start(self) -> EppProcess:
        self._log = self.log_path.open("wb")
        self._proc = subprocess.Popen(
            self.args, stdout=self._log, stderr=subprocess.STDOUT, env=self.env, cwd=self.workdir
        )
        return self

    def stop(self, timeout_s: float = 20.0) -> int | None:
        if self._proc is None:
            return None
        code = terminate(self._proc, timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def __enter__(self) -> EppProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_exit(self, timeout_s: float) -> int | None:
        """Exit code, or None if it is still running after timeout_s."""
        assert self._proc is not None
        try:
            return self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    @property
    def pid(self) -> int:
        """The running process's id (benches meter its CPU and memory)."""
        assert self._proc is not None, "not started"
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    # --- observation -------------------------------------------------------------
    def log(self) -> str:
        if self._log is not None:
            self._log.flush()
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def metrics_text(self) -> str:
        url = f"http://127.0.0.1:{self.ports.metrics}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return str(resp.read().decode())

    def healthy(self) -> bool:
        """gRPC health check on the health port, as the Deployment's probe does."""
        with grpc.insecure_channel(f"127.0.0.1:{self.ports.health}") as ch:
            call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = ch.unary_unary(
                "/grpc.health.v1.Health/Check"
            )
            try:
                raw = call(b"", timeout=2)
            except grpc.RpcError:
                return False
        return bool(raw == b"\x08\x01")  # HealthCheckResponse{status: SERVING}

    def client(self) -> ExtProcClient:
        """A gateway's ext_proc client, over TLS when the picker serves TLS."""
        return ExtProcClient(f"127.0.0.1:{self.ports.grpc}", tls=self.secure)

    def serving_ext_proc(self) -> bool:
        """Whether the ext_proc port accepts connections (with TLS the picker first makes a
        self-signed key, seconds on a busy machine, after its health port is up)."""
        return accepts_connections("127.0.0.1", self.ports.grpc)

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        """Until the EPP serves health and ext_proc; fails at once if it exits, with its log."""
        wait_until(
            lambda: {"health": self.healthy(), "ext_proc": self.serving_ext_proc()},
            "the EPP serving health and ext_proc",
            within_s=timeout_s,
            interval_s=0.2,
            until=lambda up: all(up.values()),
            fail_if=self._exited,
            detail=lambda: f"log tail:\n{self.log_tail()}",
        )

    def _exited(self) -> str | None:
        code = self.returncode
        return None if code is None else f"EPP exited with {code}"

    def queue_sizes(self) -> dict[str, float]:
        """Per-endpoint waiting queue the EPP last scraped, keyed by endpoint name."""
        out: dict[str, float] = {}
        with contextlib.suppress(OSError):
            for line in self.metrics_text().splitlines():
                m = re.match(r"inference_pool_per_pod_queue_size\{([^}]*)\}\s+(\S+)", line)
                if not m:
                    continue
                pod = re.search(r'model_server_pod="([^"]+)"', m.group(1))
                if pod:
                    out[pod.group(1)] = float(m.group(2))
        return out

    def pool_gauges(self) -> dict[str, float]:
        """The pool-wide gauges the EPP last computed from pods with fresh metrics
        (`ready_pods`, `average_kv_cache_utilization`, ...; GIE refreshes them every 5 s),
        keyed without the `inference_pool_` prefix; empty while its metrics port is down.
        They tell a test what the picker itself has scraped, e.g. that a pod's load is
        already in the scores before a test asks for picks that depend on it."""
        out: dict[str, float] = {}
        with contextlib.suppress(OSError):
            for line in self.metrics_text().splitlines():
                m = re.match(r"inference_pool_(\w+)\{[^}]*\}\s+(\S+)$", line)
                if m and m.group(1) != "per_pod_queue_size":
                    out[m.group(1)] = float(m.group(2))
        return out

    def wait_scraped(self, expected: Mapping[str, float], timeout_s: float = 60.0) -> None:
        """Until the EPP's own metrics show each endpoint's queue at the expected value.

        Keys are pod names; the EPP names an endpoint `<pod>-rank-<n>`. This proves
        it found the pods and scraped their metrics servers, not just that it is up.
        """
        wait_until(
            lambda: {re.sub(r"-rank-\d+$", "", k): v for k, v in self.queue_sizes().items()},
            f"the EPP reporting queues {dict(expected)} (by pod)",
            within_s=timeout_s,
            interval_s=0.2,
            until=lambda by_pod: all(by_pod.get(k) == v for k, v in expected.items()),
            fail_if=self._exited,
            detail=lambda: f"log tail:\n{self.log_tail()}",
        )

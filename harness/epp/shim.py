"""The real gateway policy step (`promptcache gateway-policy`), run as rendered.

The EPP pod's `gateway-policy` container is started here with the rendered args and
environment. Only ports and file paths change, and only in a way that keeps the rendered
wiring: its listen and metrics ports become free loopback ports, its upstream becomes the port the
harness really gave the EPP in place of the rendered `--grpc-port` (the harness checks
first that the rendered upstream is exactly `127.0.0.1:<rendered --grpc-port>`), and its
salt key file becomes a local file holding the pool's salt Secret (the fronts read the
same one).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from harness.net import free_port
from harness.waiting import wait_for_line
from promptcache.contract import GatewayPolicyEnv

from .extproc import ExtProcClient
from .process import terminate

STARTED_LINE = "gateway policy step listening on"


class GatewayPolicyProcess:
    """One running shim; `stop()` sends SIGTERM and returns its exit code."""

    def __init__(
        self,
        args: Sequence[str],
        env: Mapping[str, str],
        upstream_port: int,
        workdir: Path,
        salt_key_file: Path | None = None,
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.log_path = workdir / "gateway-policy.log"
        full = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTCACHE_")}
        full.update(env)
        full[GatewayPolicyEnv.LISTEN] = f"127.0.0.1:{self.port}"
        full[GatewayPolicyEnv.UPSTREAM] = f"127.0.0.1:{upstream_port}"
        if GatewayPolicyEnv.METRICS_LISTEN in env:  # two pools' steps on one host
            self.metrics_port = free_port()
            full[GatewayPolicyEnv.METRICS_LISTEN] = f"127.0.0.1:{self.metrics_port}"
        if GatewayPolicyEnv.SALT_KEY_FILE in env:
            if salt_key_file is None:
                raise AssertionError("the rendered step reads a salt key: pass the pool's")
            full[GatewayPolicyEnv.SALT_KEY_FILE] = str(salt_key_file)
        full["NO_PROXY"] = full["no_proxy"] = "127.0.0.1,localhost"
        self.env = full
        self.args = [sys.executable, "-m", "promptcache.cli", *args]
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None

    @property
    def pid(self) -> int:
        """The running process's id (benches meter its CPU and memory)."""
        assert self._proc is not None, "start it first"
        return self._proc.pid

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self) -> GatewayPolicyProcess:
        self._log = self.log_path.open("wb")
        self._proc = subprocess.Popen(
            self.args, stdout=self._log, stderr=subprocess.STDOUT, env=self.env
        )
        return self

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until the shim logs its start-up line (it binds before logging)."""
        assert self._proc is not None
        wait_for_line(self.log_path, STARTED_LINE, self._proc, within_s=timeout_s)

    def client(self) -> ExtProcClient:
        return ExtProcClient(self.target)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        if self._proc is None:
            return None
        code = terminate(self._proc, timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

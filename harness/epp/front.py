"""The real cache front, run as a process in front of one stand-in pod.

With the front in the pod it owns the port the InferencePool targets, so the
Endpoint Picker scrapes the front's /metrics, which must carry vLLM's metrics
merged with its own. Running the real front here is what shows that.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

from harness.net import answers_ok
from harness.waiting import log_tail, wait_until
from promptcache.contract import FRONT_READY_PATH, FrontEnv


class FrontProcess:
    """`python -m promptcache.front` listening on a pod IP, upstream the stand-in."""

    def __init__(
        self,
        listen: tuple[str, int],
        upstream: str,
        env: Mapping[str, str],
        workdir: Path,
        salt_key_file: Path | None = None,
    ) -> None:
        """`salt_key_file`: the pool's salt Secret (one per pool, as in a cluster); a fresh
        random one when not given."""
        self.ip, self.port = listen
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / "front.log"
        full = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTCACHE_")}
        full.update(env)
        full[FrontEnv.LISTEN] = f"{self.ip}:{self.port}"
        full[FrontEnv.UPSTREAM] = upstream
        full[FrontEnv.WORKERS] = "1"  # one process is enough for routing tests
        # No lame duck: it keeps a stopping front serving while the picker and the Gateway
        # learn the pod is going, but the harness stops the picker and the policy step
        # before the pods (`PoolOnCluster.close`), so here it only waited: 5 s per front,
        # one front after another, 20 s of every 4-pod picker test's teardown. The lame
        # duck itself is proven on the real front by tests/front/test_front_command.py.
        full[FrontEnv.LAME_DUCK_SECONDS] = "0"
        lifecycle = full.get(FrontEnv.LIFECYCLE_LISTEN, "")
        if lifecycle:
            # the pod's loopback is its own IP here (as `harness.pod` translates it): two
            # fronts of one pool must not both bind 127.0.0.1's lifecycle port
            full[FrontEnv.LIFECYCLE_LISTEN] = f"{self.ip}:{lifecycle.rsplit(':', 1)[1]}"
        if env.get(FrontEnv.SALT_KEY_FILE) is not None:
            if salt_key_file is None:
                salt_key_file = workdir / "salt-key"
                salt_key_file.write_text(secrets.token_hex(32))
                salt_key_file.chmod(0o600)
            full[FrontEnv.SALT_KEY_FILE] = str(salt_key_file)
        self.env = full
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None

    def start(self) -> FrontProcess:
        self._log = self.log_path.open("wb")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "promptcache.front"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
        )
        return self

    def wait_ready(self, timeout_s: float = 60) -> None:
        url = f"http://{self.ip}:{self.port}{FRONT_READY_PATH}"
        proc = self._proc
        assert proc is not None, "start it first"
        wait_until(
            lambda: answers_ok(url),
            f"the front ready at {url}",
            within_s=timeout_s,
            interval_s=0.2,
            fail_if=lambda: None if proc.poll() is None else f"the front exited {proc.returncode}",
            detail=lambda: f"log tail:\n{log_tail(self.log_path)}",
        )

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://{self.ip}:{self.port}/metrics", timeout=5) as resp:
            return str(resp.read().decode())

    def terminate(self) -> None:
        """SIGTERM without waiting: stopping many fronts costs one drain, not one each."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()

    def stop(self) -> None:
        """SIGTERM (unless sent already), then wait for the drain; SIGKILL after 15 s."""
        self.terminate()
        if self._proc is not None:
            try:
                self._proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)
        if self._log is not None:
            self._log.close()
            self._log = None

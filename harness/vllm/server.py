"""`vllm serve` as a supervised process: start, wait for health, kill -9, restart, stop.

One `VllmServer` is one engine (an API server, its engine core and worker processes,
all in one process group so that a stop or a `kill -9` reaches every one of them). It
holds an engine slot (`slots`) from start to stop. Logs go to `workdir/vllm.log`; every
failure message carries their tail, since a test that cannot start its engine is
otherwise impossible to diagnose.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import IO, Any

from harness.vllm.affinity import confined, release
from harness.vllm.cpu import cpu_engine_args, engine_cache_root, engine_env
from harness.vllm.layer import engine_dir
from harness.vllm.slots import engine_slot

START_TIMEOUT_S = 900.0
"""A cold start (model load, CPU kernels, first warm-up) takes 30-70 s on a quiet 2-core
machine and several times that while other engines or builds run beside it."""


class EngineFailedError(RuntimeError):
    """The engine exited or never became healthy; the message has its log's tail."""


class VllmServer:
    """One real vLLM engine on `host:port` serving `model` (a local folder)."""

    def __init__(
        self,
        workdir: Path,
        args: Sequence[str],
        *,
        host: str,
        port: int,
        env: Mapping[str, str] | None = None,
        kv_cache_bytes: int | None = None,
        name: str = "vllm",
        start_cores: frozenset[int] | None = None,
    ) -> None:
        """`args`: what follows `vllm serve`, as rendered (model first); the CPU
        translation is applied here, once. `start_cores`: the only CPUs of the engine until
        it is healthy (`harness.vllm.affinity`; None: start as this process runs)."""
        self.workdir = workdir
        self.host, self.port = host, port
        self.name = name
        self.args = cpu_engine_args(
            args, **({} if kv_cache_bytes is None else {"kv_cache_bytes": kv_cache_bytes})
        )
        self.env = engine_env(env or {}, cache_root=workdir / "vllm-cache")
        self.log_path = workdir / f"{name}.log"
        self.starts = 0
        self.start_cores = start_cores
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._slot = ExitStack()
        self._holds_slot = False

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> VllmServer:
        if self._proc is not None and self._proc.poll() is None:
            return self
        if not self._holds_slot:  # one slot across restarts
            self._slot.enter_context(engine_slot(f"{self.name} {self.url}"))
            self._holds_slot = True
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        prefix = [] if self.start_cores is None else confined(self.start_cores, [])
        argv = [*prefix, str(engine_dir() / "bin" / "vllm"), "serve", *self.args]
        shown = " ".join([*prefix, "vllm serve", *self.args])
        self._log.write(f"\n=== start {self.starts + 1}: {shown}\n".encode())
        self._log.flush()
        env = {**os.environ, **self.env}
        env.pop("PYTHONPATH", None)  # the engine's own virtualenv, nothing of ours
        engine_cache_root(Path(env["VLLM_CACHE_ROOT"]))
        self._proc = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.workdir,
            start_new_session=True,
        )
        self.starts += 1
        return self

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> VllmServer:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                code = None if self._proc is None else self._proc.returncode
                raise EngineFailedError(
                    f"{self.name} exited ({code}) before it was healthy:\n{self.log_tail()}"
                )
            if self.health() == 200:
                if self.start_cores is not None:
                    release(self._proc.pid)
                return self
            time.sleep(0.5)
        raise EngineFailedError(
            f"{self.name} not healthy within {timeout_s:.0f} s:\n{self.log_tail()}"
        )

    def health(self) -> int | None:
        """`/health`'s status, or None when nothing answers."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as error:
            return int(error.code)
        except OSError:
            return None

    def kill9(self) -> None:
        """SIGKILL the whole engine (API server, engine core, workers) at once."""
        if self._proc is None:
            return
        with suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait(timeout=30)
        self._close_log()

    def stop(self, grace_s: float = 20.0) -> None:
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGTERM)
                self._proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait(timeout=30)
            except ProcessLookupError:
                pass
        self._reap_group()
        self._close_log()
        self._slot.close()
        self._holds_slot = False

    def _reap_group(self) -> None:
        """Workers that outlive the API server still hold memory: kill what is left."""
        if self._proc is None:
            return
        with suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> VllmServer:
        return self.start().wait_healthy()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- reading it ---------------------------------------------------------------------
    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def get_json(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=30) as resp:
            return json.loads(resp.read())

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as resp:
            return str(resp.read().decode())

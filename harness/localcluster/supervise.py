"""Child process groups: start one with its log, wait for it while watching it, stop it.

Each component runs in its own session (so it outlives the `up` that started it, and `down`
from another shell can signal its whole group by pid). Liveness uses the `Popen` handle
when this process started the child (exit codes for the error message), else `/proc`: a
pid counts as ours only while its command line still names the cluster dir, so a recycled
pid running something else is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path

from .errors import ClusterError, ComponentExitedError, say


def pid_alive(pid: int, marker: str) -> bool:
    """Alive and still ours: a recycled pid running something else is not ours to signal."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    return marker.encode() in cmdline


class Supervisor:
    """The processes of one cluster dir: `pids` is shared with the caller's state (it is
    updated in place) and `on_change` persists it after every start."""

    def __init__(
        self,
        workdir: Path,
        pids: dict[str, int],
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.workdir = workdir
        self.pids = pids
        self.on_change = on_change
        # Handles of the processes this supervisor started: exit codes for diagnostics,
        # and liveness without relying on /proc cmdline matching.
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def log_path(self, component: str) -> Path:
        return self.workdir / "logs" / f"{component}.log"

    def start(self, component: str, argv: list[str]) -> None:
        """Start `argv` in a new session, stdout and stderr appended to its log."""
        self.log_path(component).parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path(component), "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.workdir,
            start_new_session=True,  # survives `up` returning; `down` ends it by pid
        )
        log.close()
        self._procs[component] = proc
        self.pids[component] = proc.pid
        self.on_change()

    def alive(self, component: str) -> bool:
        proc = self._procs.get(component)
        if proc is not None and proc.pid == self.pids.get(component):
            return proc.poll() is None
        return pid_alive(self.pids[component], str(self.workdir))

    def returncode(self, component: str) -> int | None:
        proc = self._procs.get(component)
        return proc.returncode if proc is not None else None

    def log_tail(self, component: str, lines: int = 25) -> str:
        try:
            text = self.log_path(component).read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"

    def wait_until(
        self, what: str, check: Callable[[], bool], timeout: float, component: str
    ) -> None:
        """Poll `check()` until true; fail early if the component died, with its log tail.

        Connection errors from `check` count as "not yet" (the port is not open yet)."""
        say(f"waiting for {what}")
        start = time.monotonic()
        deadline = start + timeout
        while True:
            if component and not self.alive(component):
                code = self.returncode(component)
                raise ComponentExitedError(
                    f"{component} exited (code {'?' if code is None else code}); "
                    f"last log lines:\n{self.log_tail(component)}"
                )
            try:
                if check():
                    say(f"  {what}: ready after {time.monotonic() - start:.1f}s")
                    return
            except (OSError, urllib.error.URLError, ssl.SSLError):
                pass
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"timed out after {timeout:.0f}s waiting for {what}; "
                    f"last log lines of {component}:\n{self.log_tail(component)}"
                )
            time.sleep(0.25)

    def stop(self, components: Iterable[str], grace: float = 20) -> None:
        """SIGTERM a set of components' groups together, SIGKILL whatever outlives `grace`
        seconds. Components already gone are skipped."""
        live = [c for c in components if c in self.pids and self.alive(c)]
        for comp in live:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pids[comp], signal.SIGTERM)
        deadline = time.monotonic() + grace
        for comp in live:
            pid = self.pids[comp]
            while self.alive(comp) and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.alive(comp):
                say(f"{comp} (pid {pid}) ignored SIGTERM for {grace:.0f}s; killing")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                # SIGKILL is delivered asynchronously: return only once it is gone, so the
                # caller can remove the cluster dir it writes into.
                kill_deadline = time.monotonic() + 10
                while self.alive(comp) and time.monotonic() < kill_deadline:
                    time.sleep(0.05)


def http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    """A readiness probe: the URL answers 200 (loopback only)."""
    with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:  # loopback only
        return bool(resp.status == 200)


def insecure_ssl() -> ssl.SSLContext:
    """For component health ports: they serve self-signed certs made at start; only
    loopback is asked."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx

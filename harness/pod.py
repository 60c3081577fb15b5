"""A rendered model-server pod run as processes on this machine: a small kubelet.

kwok plays the kubelets of the local control plane but runs nothing. For the pods whose
containers must really run (the cache front and a real `vllm serve`), `ProcessPod` does
what a kubelet would, from the pod spec alone:

* **network namespace**: the pod's IP is a loopback address of its own (all of 127/8 is
  bound to `lo`), so `127.0.0.1` and `0.0.0.0` in the rendered args, env and exec probes
  mean that address: two pods never collide on the same port, and nothing else changes;
* **volumes**: each volume is a folder under the pod's work directory (Secrets written as
  files, as the kubelet projects them), and a mount path in args or env names that folder;
* **env**: `value` and `valueFrom.secretKeyRef` (resolved through the caller);
* **containers**: the front image's entrypoint is `promptcache` (Dockerfile), the vLLM
  image's is `vllm serve`; the engine's args go through `harness.vllm.cpu` once;
* **probes**: startup, liveness and readiness as rendered (httpGet and exec, period,
  timeout, failure threshold), evaluated in a thread; a container whose liveness fails
  is restarted; the pod is Ready when every container is started and every readiness
  probe passes. `on_ready` hears every change of readiness and every restart, so a
  cluster test can write them to the pod's status the way the kubelet does;
* **stopping** (`terminate`, what the kubelet does for a deleted pod): not Ready at once,
  each container's `lifecycle.preStop` hook (exec, httpGet, sleep) and then SIGTERM to
  that container, all containers at once, and SIGKILL to whatever still runs when the
  pod's `terminationGracePeriodSeconds` is over;
* **cpus**: an engine whose env binds it to a core starts with that core as its only CPU,
  the rest of its processes get every core back once its startup probe passes
  (`harness.vllm.affinity` says why);
* **restarts** with a back-off that doubles from one second (a kubelet starts at ten);
* **termination messages**: a container that exits non-zero under
  `terminationMessagePolicy: FallbackToLogsOnError` leaves the tail of its log (the last
  80 lines, at most 2048 bytes, as the kubelet cuts it) as its last state's message.

What is not emulated: resource limits, cgroups, users (the processes run as the test's
user), image contents. The rendered security context is tested statically elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from harness.vllm.affinity import bound_cores, confined, release
from harness.vllm.cpu import cpu_engine_args, engine_cache_root, engine_env
from harness.vllm.layer import engine_dir
from harness.vllm.server import START_TIMEOUT_S
from harness.vllm.slots import engine_slot
from promptcache.contract import Container as ContainerName

VLLM_CONTAINER = ContainerName.VLLM.value
SecretResolver = Callable[[str, str], bytes]
"""(Secret name, key) -> value."""
_LOCALHOSTS = ("127.0.0.1", "0.0.0.0")
FALLBACK_TO_LOGS = "FallbackToLogsOnError"
FALLBACK_LINES, FALLBACK_BYTES = 80, 2048
"""How much log the kubelet keeps as the message (its `MaxContainerTerminationMessage*`)."""

_RUNNING: set[ProcessPod] = set()
_RUNNING_LOCK = threading.Lock()


def running_pods() -> list[ProcessPod]:
    """Every pod of this process started and not stopped yet: what a test module leaves
    behind holds an engine slot (and a port) until the session ends."""
    with _RUNNING_LOCK:
        return sorted(_RUNNING, key=lambda p: p.name)


def pod_local(value: str, pod_ip: str, mounts: Mapping[str, Path]) -> str:
    """`value` as seen from inside the pod, on this host: the pod's addresses and mounts.

    One exception: a path that exists on this host and not in the pod's volume is left as
    it is. Here the host's files stand in for what an image or a volume would carry (the
    tiny model is a host directory named by `spec.model.name`), and a cache directory
    under `/tmp` must not vanish behind the pod's `/tmp` emptyDir.

    Paths inside a value (`--flag=/mount/...`, a JSON string such as vLLM's
    `--lora-modules '{"path": "/adapters/..."}'`) are mapped in one pass: a path already
    mapped to its host directory is never mapped again. Mount by mount, `/adapters` became
    `/tmp/<cache>/adapters/...`, which the pod's `/tmp` mount then sent into its emptyDir,
    where vLLM found no adapter (a CI run from a cache under /tmp)."""
    for local in _LOCALHOSTS:
        value = value.replace(local, pod_ip)
    ordered = sorted(mounts.items(), key=lambda kv: -len(kv[0]))
    for mount, host_dir in ordered:
        if value == mount or value.startswith(mount.rstrip("/") + "/"):
            inside = str(host_dir) + value[len(mount.rstrip("/")) :]
            if value != mount and Path(value).exists() and not Path(inside).exists():
                return value
            return inside
    if not ordered:
        return value
    host_of = {mount.rstrip("/"): str(host_dir) for mount, host_dir in ordered}
    embedded = re.compile(
        r'(?<=[="])(' + "|".join(re.escape(m.rstrip("/")) for m, _ in ordered) + r')(?=/|"|$)'
    )
    return embedded.sub(lambda m: host_of[m.group(1)], value)


@dataclass
class _Probe:
    spec: dict[str, Any]
    kind: str = "probe"
    """`startup`, `liveness` or `readiness`: how the event log names it."""
    failures: int = 0
    last_detail: str = ""
    """How the last run ended (status, exit code, timeout) and how long it took."""
    passed: bool = False
    last_run: float = 0.0

    @property
    def period(self) -> float:
        return float(self.spec.get("periodSeconds", 10))

    @property
    def timeout(self) -> float:
        return float(self.spec.get("timeoutSeconds", 1))

    @property
    def threshold(self) -> int:
        return int(self.spec.get("failureThreshold", 3))


@dataclass
class Container:
    """One container of the pod as a process group."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    startup: _Probe | None = None
    liveness: _Probe | None = None
    readiness: _Probe | None = None
    termination_policy: str = "File"
    pre_stop: Mapping[str, Any] | None = None
    """`lifecycle.preStop` as rendered."""
    cleanup: list[str] | None = None
    """What removes what the process leaves when killed (a container run from an image:
    SIGKILL stops podman, not the container)."""
    start_cores: frozenset[int] | None = None
    """The only CPUs the process may use until its startup probe passes (an engine bound
    to a core: `harness.vllm.affinity`), or None to start it as this process runs."""
    restarts: int = 0
    started: bool = False
    exited_at: float | None = None
    last_terminated: dict[str, Any] | None = None
    """The previous run's end, as `containerStatuses[].lastState.terminated` says it."""
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self, cwd: Path) -> None:
        self._log = self.log_path.open("ab")
        argv = self.argv if self.start_cores is None else confined(self.start_cores, self.argv)
        self._log.write(f"\n=== start {self.restarts + 1}: {shlex.join(argv)}\n".encode())
        self._log.flush()
        self.proc = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=cwd,
            start_new_session=True,
        )
        self.started = self.startup is None
        self.exited_at = None
        for probe in (self.startup, self.liveness, self.readiness):
            if probe is not None:
                probe.failures, probe.passed, probe.last_run = 0, False, 0.0

    def signal(self, sig: int) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def stop(self, grace_s: float = 20.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
        self.signal(signal.SIGKILL)  # and whatever it left in its group
        self.proc.wait(timeout=30)
        if self.cleanup is not None:
            subprocess.run(self.cleanup, env=self.env, capture_output=True, check=False)
        if self._log is not None:
            self._log.close()
            self._log = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def record_exit(self) -> None:
        """Note how the run ended (its exit code, and under FallbackToLogsOnError with a
        failure, the tail of its log as the message)."""
        code = self.proc.poll() if self.proc is not None else None
        if code is None:
            return
        exit_code = 128 - code if code < 0 else code  # killed by a signal: 128 + signal
        message = ""
        if exit_code != 0 and self.termination_policy == FALLBACK_TO_LOGS:
            try:
                lines = self.log_path.read_bytes().splitlines(keepends=True)[-FALLBACK_LINES:]
            except OSError:
                lines = []
            message = b"".join(lines)[-FALLBACK_BYTES:].decode("utf-8", errors="replace")
        self.last_terminated = {
            "exitCode": exit_code,
            "reason": "Completed" if exit_code == 0 else "Error",
            "message": message,
        }

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class ProcessPod:
    """The containers of one pod spec, run as processes on `ip`, with a kubelet's probes."""

    def __init__(
        self,
        name: str,
        pod_spec: Mapping[str, Any],
        ip: str,
        workdir: Path,
        secrets: SecretResolver,
        *,
        kv_cache_bytes: int | None = None,
        on_ready: Callable[[ProcessPod, bool], None] | None = None,
        promptcache_argv: tuple[str, ...] = (sys.executable, "-m", "promptcache.cli"),
        images: Mapping[str, str] | None = None,
    ) -> None:
        """`images`: container name -> image reference, for the containers run from their
        image with podman (`harness.images.PodRun`) rather than from the checkout."""
        self.name, self.ip, self.workdir = name, ip, workdir
        self._images = dict(images or {})
        self.spec = pod_spec
        self.outlives_module = False
        """Set by a fixture wider than a module (the session's engine pod): the check that
        no test module leaves a pod running passes it by."""
        self._secrets = secrets
        self._on_ready = on_ready
        self.ready = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._slot: contextlib.AbstractContextManager[int] | None = None
        self.mounts_by_container: dict[str, dict[str, Path]] = {}
        self.volumes = self._materialise_volumes()
        self.ports = {
            p["name"]: int(p["containerPort"])
            for c in pod_spec["containers"]
            for p in c.get("ports", [])
            if "name" in p
        }
        self.containers = [
            self._container(c, kv_cache_bytes, promptcache_argv) for c in pod_spec["containers"]
        ]

    # --- building ------------------------------------------------------------------------
    def _materialise_volumes(self) -> dict[str, Path]:
        out: dict[str, Path] = {}
        for volume in self.spec.get("volumes", []):
            if "hostPath" in volume:  # as a kubelet does: the node's own directory
                out[volume["name"]] = Path(volume["hostPath"]["path"])
                continue
            path = self.workdir / "volumes" / volume["name"]
            path.mkdir(parents=True, exist_ok=True)
            secret = volume.get("secret")
            if secret is not None:
                items = secret.get("items") or []
                for item in items:
                    target = path / item.get("path", item["key"])
                    target.write_bytes(self._secrets(secret["secretName"], item["key"]))
                    target.chmod(0o600)
            out[volume["name"]] = path
        return out

    def _env(self, container: Mapping[str, Any], mounts: Mapping[str, Path]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTCACHE_")}
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = pod_local(str(item["value"]), self.ip, mounts)
            elif "secretKeyRef" in item.get("valueFrom", {}):
                ref = item["valueFrom"]["secretKeyRef"]
                env[item["name"]] = self._secrets(ref["name"], ref["key"]).decode()
        return env

    def _container(
        self,
        spec: Mapping[str, Any],
        kv_cache_bytes: int | None,
        promptcache_argv: tuple[str, ...],
    ) -> Container:
        mounts = {m["mountPath"]: self.volumes[m["name"]] for m in spec.get("volumeMounts", [])}
        self.mounts_by_container[spec["name"]] = mounts
        image = self._images.get(spec["name"])
        if image is not None:
            return self._image_container(spec, image)
        args = [pod_local(str(a), self.ip, mounts) for a in spec.get("args", [])]
        env = self._env(spec, mounts)
        if spec["name"] == VLLM_CONTAINER:
            translated = cpu_engine_args(
                args, **({} if kv_cache_bytes is None else {"kv_cache_bytes": kv_cache_bytes})
            )
            argv = [str(engine_dir() / "bin" / "vllm"), "serve", *translated]
            env = engine_env(env, cache_root=engine_cache_root(self.workdir / "vllm-cache"))
            env.pop("PYTHONPATH", None)
        else:
            argv = [*promptcache_argv, *args]

        container = self._as_container(spec, argv, env)
        if spec["name"] == VLLM_CONTAINER and container.startup is not None:
            container.start_cores = bound_cores(env)  # released when the probe passes
        return container

    def _as_container(
        self,
        spec: Mapping[str, Any],
        argv: list[str],
        env: dict[str, str],
        cleanup: list[str] | None = None,
    ) -> Container:
        def probe(kind: str) -> _Probe | None:
            return _Probe(spec[kind], kind=kind.removesuffix("Probe")) if kind in spec else None

        return Container(
            name=spec["name"],
            argv=argv,
            env=env,
            log_path=self.workdir / f"{spec['name']}.log",
            startup=probe("startupProbe"),
            liveness=probe("livenessProbe"),
            readiness=probe("readinessProbe"),
            termination_policy=str(spec.get("terminationMessagePolicy", "File")),
            pre_stop=(spec.get("lifecycle") or {}).get("preStop"),
            cleanup=cleanup,
        )

    def _image_container(self, spec: Mapping[str, Any], image: str) -> Container:
        """The container run from IMAGE as its pod spec says (user, read-only root, no
        capability, its emptyDirs and Secret files), on the host network at the pod's IP:
        the pod's addresses in its env become the pod IP, as for a process container; its
        paths stay the container's own."""
        from harness.images import PodRun  # noqa: PLC0415 (podman's harness, only here)
        from tools.images import podman_env  # noqa: PLC0415

        volumes = {v["name"]: v for v in self.spec.get("volumes", [])}
        files: dict[str, dict[str, bytes]] = {}
        for mount in spec.get("volumeMounts", []):
            secret = volumes[mount["name"]].get("secret")
            if secret is not None:
                files[mount["name"]] = {
                    item.get("path", item["key"]): self._secrets(secret["secretName"], item["key"])
                    for item in secret.get("items") or []
                }
        run = PodRun(
            image,
            self.spec,
            spec,
            self.workdir / f"{spec['name']}-image",
            files=files,
            env={
                item["name"]: pod_local(str(item["value"]), self.ip, {})
                for item in spec.get("env", [])
                if "value" in item
            },
            fields={"metadata.name": self.name},
            network="host",
            name=f"promptcache-pod-{self.ip.replace('.', '-')}-{spec['name']}",
        )
        cleanup = ["podman", "rm", "--force", "--time=0", run.name]
        return self._as_container(spec, run.argv(), podman_env(), cleanup)

    # --- running -------------------------------------------------------------------------
    def container(self, name: str) -> Container:
        return next(c for c in self.containers if c.name == name)

    def url(self, port: str = "http") -> str:
        return f"http://{self.ip}:{self.ports[port]}"

    def start(self) -> ProcessPod:
        """Start the containers and the probes; a pod stopped before (or while waiting
        for an engine slot) stays stopped, so a kubelet that stops a pod mid-start
        never leaves an engine running that nobody will stop."""
        if self._stop.is_set():
            return self
        self.workdir.mkdir(parents=True, exist_ok=True)
        if any(c.name == VLLM_CONTAINER for c in self.containers) and self._slot is None:
            slot = engine_slot(f"pod {self.name} {self.ip}")
            slot.__enter__()  # may wait for another engine to stop
            self._slot = slot
        with self._lock:
            if self._stop.is_set():
                self._release_slot()
                return self
            for c in self.containers:
                c.start(self.workdir)
            self._thread = threading.Thread(
                target=self._kubelet, name=f"kubelet-{self.name}", daemon=True
            )
            self._thread.start()
            with _RUNNING_LOCK:
                _RUNNING.add(self)
        return self

    def crash_looping(self) -> str | None:
        """What a container that keeps failing said last (its log tail), or None: a wait for
        this pod, or for what it would make true, can stop at once instead of at its
        timeout."""
        for c in self.containers:
            if c.proc is not None and c.proc.poll() is not None and c.restarts > 5:
                return f"{self.name}/{c.name} keeps failing:\n{c.log_tail()}"
        return None

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> ProcessPod:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.ready:
                return self
            if (failing := self.crash_looping()) is not None:
                raise RuntimeError(failing)
            time.sleep(0.25)
        tails = "\n".join(f"--- {c.name}\n{c.log_tail()}" for c in self.containers)
        raise TimeoutError(f"pod {self.name} not Ready within {timeout_s:.0f} s:\n{tails}")

    def wait_until(self, ready: bool, timeout_s: float) -> float:
        """Seconds until the pod's readiness became `ready` (TimeoutError past `timeout_s`)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.ready is ready:
                return time.monotonic() - t0
            time.sleep(0.05)
        raise TimeoutError(f"pod {self.name} still ready={self.ready} after {timeout_s:.0f} s")

    def stop(self) -> None:
        self._halt_probes()
        for c in reversed(self.containers):
            c.stop()
        self._let_go()

    def _halt_probes(self) -> None:
        """Under the lock `start` checks, so a start still waiting for a slot sees it."""
        with self._lock:
            self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def event(self, what: str) -> None:
        """One line of the pod's event log (`kubelet.log` in its work directory, beside the
        containers' logs): what the kubelet did and why, with the wall-clock time the
        containers' own logs use, so a restart or a stop lines up with what they said."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S") + f",{int(time.time() * 1000) % 1000:03d}"
        with (self.workdir / "kubelet.log").open("a") as log:
            log.write(f"{stamp} {what}\n")

    def _let_go(self) -> None:
        """Once every container has stopped: the engine slot, and the list of running pods."""
        self._release_slot()
        with _RUNNING_LOCK:
            _RUNNING.discard(self)

    def _release_slot(self) -> None:
        if self._slot is not None:
            self._slot.__exit__(None, None, None)
            self._slot = None

    def terminate(self) -> float:
        """Stop as the kubelet stops a deleted pod; returns the seconds it took.

        The probes stop and the pod is not Ready at once; then for every container at the
        same time: its preStop hook, then SIGTERM, then SIGKILL when the grace period
        (`terminationGracePeriodSeconds`, 30 by default) is over."""
        started = time.monotonic()
        self._halt_probes()
        self.ready = False
        deadline = started + float(self.spec.get("terminationGracePeriodSeconds", 30))

        self.event("deleted: not Ready; running the preStop hooks, then SIGTERM")

        def stop_one(c: Container) -> None:
            if c.pre_stop is not None and c.running():
                self._hook(c, c.pre_stop, deadline)
                self.event(f"{c.name}: its preStop hook returned; SIGTERM")
            c.stop(grace_s=max(0.0, deadline - time.monotonic()))
            self.event(f"{c.name}: stopped")

        threads = [
            threading.Thread(target=stop_one, args=(c,), name=f"stop-{self.name}-{c.name}")
            for c in self.containers
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self._let_go()
        return time.monotonic() - started

    def _hook(self, c: Container, hook: Mapping[str, Any], deadline: float) -> None:
        """Run one lifecycle hook until it ends or the grace period does (its result, as
        for the kubelet, does not stop the container being stopped)."""
        left = max(0.0, deadline - time.monotonic())
        if "sleep" in hook:
            time.sleep(min(left, float(hook["sleep"]["seconds"])))
        elif "exec" in hook:
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run(
                    self._exec_argv(c, hook), capture_output=True, timeout=left, check=False
                )
        elif "httpGet" in hook:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(self._http_url(hook["httpGet"]), timeout=left).close()
        else:
            raise ValueError(f"hook kind not emulated: {sorted(hook)}")

    def _exec_argv(self, c: Container, spec: Mapping[str, Any]) -> list[str]:
        mounts = self.mounts_by_container.get(c.name, {})
        argv = [pod_local(str(a), self.ip, mounts) for a in spec["exec"]["command"]]
        if argv and argv[0] in ("python3", "python"):
            argv[0] = sys.executable
        return argv

    def _http_url(self, get: Mapping[str, Any]) -> str:
        port = get["port"]
        number = self.ports[port] if isinstance(port, str) else int(port)
        return f"http://{self.ip}:{number}{get.get('path', '/')}"

    def __enter__(self) -> ProcessPod:
        try:
            return self.start().wait_ready()
        except BaseException:  # `with` never calls __exit__ for a failed __enter__
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the kubelet's loop --------------------------------------------------------------
    def _kubelet(self) -> None:
        restarts = tuple(c.restarts for c in self.containers)
        while not self._stop.wait(0.1):
            now = time.monotonic()
            with self._lock:
                for c in self.containers:
                    self._tick(c, now)
                ready = all(
                    c.running() and c.started and (c.readiness is None or c.readiness.passed)
                    for c in self.containers
                )
            now_restarts = tuple(c.restarts for c in self.containers)
            if ready != self.ready or now_restarts != restarts:
                self.ready, restarts = ready, now_restarts
                if self._on_ready is not None:
                    self._on_ready(self, ready)

    def _tick(self, c: Container, now: float) -> None:
        if not c.running():
            self._restart_exited(c, now)
        elif not c.started:
            self._startup(c, now)
        else:
            self._liveness_and_readiness(c, now)

    def _restart_exited(self, c: Container, now: float) -> None:
        """restartPolicy Always, with a back-off of 1, 2, 4 ... 32 seconds (a kubelet's
        starts at 10 and stops at 300: shorter here, for the tests' sake)."""
        if c.proc is None:
            return
        if c.exited_at is None:
            c.exited_at = now
            c.record_exit()
            self.event(f"{c.name}: exited ({c.last_terminated}); restarting it after a back-off")
            if self._on_ready is not None:
                self._on_ready(self, False)  # the kubelet reports the exit at once
        elif now - c.exited_at > float(2 ** min(c.restarts, 5)):
            c.stop(grace_s=0)
            c.restarts += 1
            c.start(self.workdir)

    def _startup(self, c: Container, now: float) -> None:
        assert c.startup is not None
        if not self._due(c.startup, now):
            return
        ok = self._run(c.startup, c)
        c.startup.failures = 0 if ok else c.startup.failures + 1
        if ok:
            c.started = True
            if c.start_cores is not None and c.proc is not None:
                release(c.proc.pid)
        elif c.startup.failures >= c.startup.threshold:
            self._restart(c, c.startup)

    def _liveness_and_readiness(self, c: Container, now: float) -> None:
        if c.liveness is not None and self._due(c.liveness, now):
            ok = self._run(c.liveness, c)
            c.liveness.failures = 0 if ok else c.liveness.failures + 1
            if c.liveness.failures >= c.liveness.threshold:
                self._restart(c, c.liveness)
                return
        if c.readiness is not None and self._due(c.readiness, now):
            ok = self._run(c.readiness, c)
            c.readiness.failures = 0 if ok else c.readiness.failures + 1
            if ok:
                c.readiness.passed = True
            elif c.readiness.failures >= c.readiness.threshold:
                c.readiness.passed = False

    def _restart(self, c: Container, probe: _Probe) -> None:
        self.event(
            f"{c.name}: restarting it, its {probe.kind} probe failed {probe.failures} times"
            f" in a row (the last: {probe.last_detail})"
        )
        c.stop(grace_s=5)
        c.record_exit()
        c.restarts += 1
        c.start(self.workdir)

    @staticmethod
    def _due(probe: _Probe, now: float) -> bool:
        first_delay = float(probe.spec.get("initialDelaySeconds", 0))
        if probe.last_run == 0.0:
            probe.last_run = now - probe.period + first_delay
        if now - probe.last_run >= probe.period:
            probe.last_run = now
            return True
        return False

    def _run(self, probe: _Probe, c: Container) -> bool:
        """Run one probe; a failure is written to the pod's event log with what failed, so
        a restart can be told from the log alone (a kubelet's events say the same)."""
        started = time.monotonic()
        ok, detail = self._outcome(probe, c)
        probe.last_detail = f"{detail} after {time.monotonic() - started:.1f} s"
        if not ok:
            self.event(f"{c.name}: {probe.kind} probe failed: {probe.last_detail}")
        return ok

    def _outcome(self, probe: _Probe, c: Container) -> tuple[bool, str]:
        spec = probe.spec
        if "httpGet" in spec:
            url = self._http_url(spec["httpGet"])
            try:
                with urllib.request.urlopen(url, timeout=probe.timeout) as resp:
                    return 200 <= int(resp.status) < 400, f"HTTP {resp.status}"
            except urllib.error.HTTPError as error:
                return 200 <= int(error.code) < 400, f"HTTP {error.code}"
            except OSError as error:
                return False, f"{url}: {error}"
        if "exec" in spec:
            argv = self._exec_argv(c, spec)
            try:
                done = subprocess.run(argv, capture_output=True, timeout=probe.timeout, check=False)
            except subprocess.TimeoutExpired:
                return False, f"no exit within its {probe.timeout:.0f} s timeout"
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
            return done.returncode == 0, f"exit {done.returncode}" + "".join(f": {t}" for t in tail)
        raise ValueError(f"probe kind not emulated: {sorted(spec)}")

"""The kubelet's half for kwok pods that really run: their status written from real probes.

kwok makes a pod annotated `kubelet.harness.promptcache.io/processes` Running with a pod
IP but never Ready (harness/localcluster/lifecycle.py). `run_on_cluster` reads that pod from
the API server, resolves its Secrets there, runs its containers as a `ProcessPod`, and
writes Ready / ContainersReady and each container's `ready`, restart count and last
termination (with its message) to the pod's status whenever the probes change their verdict
or a container restarts, so the Deployment, the operator and the picker see
what a real kubelet would report. `stop_on_cluster` stops it and says so (not Ready), as
a kubelet would once the containers have gone.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.engine.pods import SaltSecrets
from harness.localcluster.lifecycle import PROCESS_POD_ANNOTATION
from harness.pod import ProcessPod
from harness.pytest_cluster import Cluster
from harness.vllm.cpu import OMP_BIND_ENV
from promptcache.contract import Container

if TYPE_CHECKING:
    from harness.epp.pool import PoolOnCluster
    from harness.epp.rendered import Rendered

PROCESS_POD_TEMPLATE = {"metadata": {"annotations": {PROCESS_POD_ANNOTATION: "true"}}}
"""`spec.model.podTemplate` that makes the model-server pods run as processes."""


def _secrets(cluster: Cluster, namespace: str) -> Any:
    def resolve(name: str, key: str) -> bytes:
        secret = cluster.get_json("secret", name, "-n", namespace)
        return base64.b64decode(secret["data"][key])

    return resolve


def _write_readiness(cluster: Cluster, namespace: str) -> Any:
    def write(pod: ProcessPod, ready: bool) -> None:
        status = "True" if ready else "False"
        patch = {
            "status": {
                "conditions": [
                    {"type": "Ready", "status": status},
                    {"type": "ContainersReady", "status": status},
                ],
                "containerStatuses": [
                    {
                        "name": c.name,
                        "ready": c.running()
                        and c.started
                        and (c.readiness is None or c.readiness.passed),
                        "started": c.started,
                        "restartCount": c.restarts,
                        **(
                            {"lastState": {"terminated": c.last_terminated}}
                            if c.last_terminated is not None
                            else {}
                        ),
                    }
                    for c in pod.containers
                ],
            }
        }
        cluster.kubectl(
            "-n",
            namespace,
            "patch",
            "pod",
            pod.name,
            "--subresource=status",
            "--type=strategic",
            "-p",
            json.dumps(patch),
        )

    return write


def salt_key_of(cluster: Cluster, rendered: Rendered) -> bytes | None:
    """The key of the salt Secret the operator made for `rendered`'s pods (as the model
    server mounts it), or None when the pods mount none: the harness's picker and policy
    step must read the very key the fronts read, or nothing they sign is believed."""
    for obj in rendered.objects:
        if obj.get("kind") != "Deployment":
            continue
        for vol in obj["spec"]["template"]["spec"].get("volumes", []):
            secret = vol.get("secret", {}).get("secretName")
            if secret:
                data = cluster.get_json("secret", secret, "-n", rendered.namespace)["data"]
                return base64.b64decode(data[vol["secret"]["items"][0]["key"]])
    return None


def run_on_cluster(
    cluster: Cluster, namespace: str, pod_name: str, workdir: Path, **kwargs: Any
) -> ProcessPod:
    """Start the containers of an annotated kwok pod; its readiness goes to the API server."""
    obj = cluster.get_json("pod", pod_name, "-n", namespace)
    assert obj["metadata"].get("annotations", {}).get(PROCESS_POD_ANNOTATION) == "true"
    ip = obj["status"]["podIP"]
    return ProcessPod(
        pod_name,
        obj["spec"],
        ip,
        workdir,
        _secrets(cluster, namespace),
        on_ready=_write_readiness(cluster, namespace),
        **kwargs,
    ).start()


def stop_on_cluster(cluster: Cluster, namespace: str, pod: ProcessPod) -> None:
    """Stop the pod's processes and write that it is no longer Ready: nothing serves on
    its IP any more, and the Deployment, the operator and the picker must not think so."""
    pod.stop()
    with contextlib.suppress(AssertionError):  # the pod object is gone: nothing to correct
        _write_readiness(cluster, namespace)(pod, False)


def start_pool_pods(
    pool: PoolOnCluster,
    workdir: Path,
    kv_cache_bytes: int,
    say: Callable[[str], None] = print,
    ready_timeout_s: float = 900,
    first_core: int = 0,
    reports_to: Cluster | None = None,
) -> list[ProcessPod]:
    """One ProcessPod per kwok pod of `pool`'s model Deployment, on its IP, with the pool's
    salt Secret (the policy step reads the same key); all started at once (each waits for
    an engine slot), then waited for.

    `reports_to`: the pods are annotated to run as processes (kwok leaves them not Ready),
    and their probes' verdict is written to that cluster, as a kubelet would, so the
    Deployment and the operator see the engines' real readiness.

    Each engine's worker is bound to a core of its own, from `first_core` on (so two pools
    need not share one) (`VLLM_CPU_OMP_THREADS_BIND`: the CPU build otherwise binds every
    worker to core 0): a machine layout, not a translation of
    the rendered pod, which is otherwise run as the API server holds it."""
    secrets_ = SaltSecrets()
    pool.salt_key_file.write_bytes(secrets_.key)
    spec = pool.rendered.model_deployment["spec"]["template"]["spec"]
    cores = sorted(os.sched_getaffinity(0))
    pods = []
    on_ready = None if reports_to is None else _write_readiness(reports_to, pool.rendered.namespace)
    objs = pool.wait_pods(ready=reports_to is None)
    for i, obj in enumerate(objs):
        mine = json.loads(json.dumps(spec))
        for c in mine["containers"]:
            if c["name"] == Container.VLLM:
                env = c.setdefault("env", [])
                env.append(
                    {
                        "name": OMP_BIND_ENV,
                        "value": str(cores[(first_core + i) % len(cores)]),
                    }
                )
        name, ip = obj["metadata"]["name"], obj["status"]["podIP"]
        pods.append(
            ProcessPod(
                name,
                mine,
                ip,
                workdir / name,
                secrets_,
                kv_cache_bytes=kv_cache_bytes,
                on_ready=on_ready,
            )
        )
    started = time.monotonic()
    try:
        for p in pods:
            say(f"starting pod {p.name} on {p.ip} (front + vllm, {kv_cache_bytes >> 20} MiB KV)")
            p.start()
        for p in pods:
            p.wait_ready(timeout_s=ready_timeout_s)
    except BaseException:
        for p in pods:
            p.stop()
        raise
    say(f"{len(pods)} pods Ready after {time.monotonic() - started:.0f} s")
    return pods


class ProcessKubelet:
    """The kubelet for every annotated pod matching `selector` in `namespace`, as they come
    and go: a Deployment's rollout, a scale or a deletion plays out with real processes.

    Every `period_s` it lists the pods (`Cluster.pods_json`: no kubectl process). A new pod
    that kwok has given an IP is started from its spec as the API server holds it (its own
    thread: starting waits for an engine slot); a pod that is gone or being deleted is
    terminated as a kubelet would (`ProcessPod.terminate`: preStop hooks, SIGTERM, the grace
    period), in its own thread too, so the old pod drains while the new one serves. kwok
    deletes a pod object at once, so here the picker sees a deleted pod leave at once; a
    real kubelet marks it not Ready first, which the front's lame duck covers either way.
    """

    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        selector: str,
        workdir: Path,
        *,
        kv_cache_bytes: int | None = None,
        period_s: float = 0.5,
        say: Callable[[str], None] = print,
    ) -> None:
        self.cluster, self.namespace, self.selector = cluster, namespace, selector
        self.workdir, self.kv_cache_bytes, self.period_s, self.say = (
            workdir,
            kv_cache_bytes,
            period_s,
            say,
        )
        self.pods: dict[str, ProcessPod] = {}
        """Running (or starting) pods by name."""
        self._claimed: set[str] = set()
        """Pods a start thread was spawned for, claimed by the loop before it spawns: the
        thread builds the pod (Secrets read with kubectl) before it can register it, and a
        second tick that saw the name unregistered started a twin on the same IP that
        nobody stopped (an engine restarting for the rest of the session, on a slot)."""
        self.stopping: dict[str, float] = {}
        """When each deleted pod's stop began (`time.monotonic()`)."""
        self.terminated: dict[str, float] = {}
        """Pods stopped, with the seconds their termination took."""
        self._cores = sorted(os.sched_getaffinity(0))
        self._bound: dict[str, int] = {}
        """The core each engine still running (starting, serving or draining) is bound to."""
        self._binding = threading.Lock()
        self._leaving: dict[str, bool] = {}
        """Pods deleted and still stopping, by whether they served when deleted."""
        self._releasing: dict[str, threading.Event] = {}
        """The IPs of deleted pods still stopping, set once each has stopped. kwok frees a
        deleted pod's IP at once and may give it to the next pod while the old one's
        processes still hold its ports (a front that could not bind, restarted after a
        back-off); a kubelet frees an IP only with the old pod's sandbox."""
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._loop = threading.Thread(target=self._run, name=f"kubelet-{namespace}", daemon=True)

    def __enter__(self) -> ProcessKubelet:
        self._loop.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._loop.join(timeout=30)
        for t in self._threads:
            t.join(timeout=300)
        for pod in list(self.pods.values()):
            pod.stop()
        self.pods.clear()

    def ready(self) -> list[ProcessPod]:
        return [p for p in self.pods.values() if p.ready]

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                listed = self.cluster.pods_json(self.namespace, self.selector)
            except Exception:  # an HTTP error or a lost connection: list again next period
                continue
            live = {
                p["metadata"]["name"]: p
                for p in listed["items"]
                if not p["metadata"].get("deletionTimestamp")
            }
            for name in [n for n in self.pods if n not in live]:  # first: their IPs held
                gone = self.pods.pop(name)
                self._releasing[gone.ip] = threading.Event()
                self._spawn(self._terminate, gone)
            for name, obj in live.items():
                annotated = obj["metadata"].get("annotations", {}).get(PROCESS_POD_ANNOTATION)
                if name in self._claimed or annotated != "true":
                    continue
                if obj["status"].get("podIP"):
                    self._claimed.add(name)
                    self._spawn(self._start, obj)

    def _spawn(self, target: Callable[..., None], arg: Any) -> None:
        t = threading.Thread(target=target, args=(arg,), daemon=True)
        self._threads.append(t)
        t.start()

    def _start(self, obj: dict[str, Any]) -> None:
        name, ip = obj["metadata"]["name"], obj["status"]["podIP"]
        spec = json.loads(json.dumps(obj["spec"]))
        core = self._least_bound_core(name)
        for c in spec["containers"]:
            if c["name"] == Container.VLLM:  # a machine layout: each engine on a core of its own
                c.setdefault("env", []).append({"name": OMP_BIND_ENV, "value": str(core)})
        write = _write_readiness(self.cluster, self.namespace)

        def report(pod: ProcessPod, ready: bool) -> None:
            with contextlib.suppress(AssertionError):  # the pod object may be gone already
                write(pod, ready)

        released = self._releasing.get(ip)
        if released is not None and not released.is_set():
            self.say(f"kubelet: {name} waits for the pod stopping on {ip} to let it go")
            released.wait(timeout=float(spec.get("terminationGracePeriodSeconds", 30)) + 60)
        pod = ProcessPod(
            name,
            spec,
            ip,
            self.workdir / name,
            _secrets(self.cluster, self.namespace),
            kv_cache_bytes=self.kv_cache_bytes,
            on_ready=report,
        )
        self.pods[name] = pod
        if self._stop.is_set():  # the kubelet stopped while this pod was being built
            return
        self.say(f"kubelet: starting {name} on {ip}")
        pod.start()

    def _least_bound_core(self, name: str) -> int:
        """The core fewest running engines are bound to. A new pod of a rollout starts
        while the old one still serves (and drains): bound to the same core, the new
        engine's start waited behind the old one's busy worker for many minutes (the CPU
        build always runs its worker in a process of its own, which after each step spins
        for a second waiting for the next, vLLM 0.32's `SpinCondition`: under any steady
        traffic it holds its core; idle, the engine uses about 1 % of one, measured
        2026-12-07); counting starts round-robin put
        them together whenever the number of pods started so far said so. Engines that
        serve count first: a pod whose engine keeps failing to start (a bad adapter) uses
        little of its core, and the serving one beside it is what a new engine must avoid."""
        with self._binding:
            serving = {core: 0 for core in self._cores}
            bound = {core: 0 for core in self._cores}
            for pod_name, core in self._bound.items():
                bound[core] += 1
                pod = self.pods.get(pod_name)
                # a Ready engine may be serving on its core (and goes on while it drains);
                # one failing to start mostly waits
                ready = pod.ready if pod is not None else self._leaving.get(pod_name, False)
                serving[core] += 1 if ready else 0
            core = min(self._cores, key=lambda c: (serving[c], bound[c]))
            self._bound[name] = core
            return core

    def _terminate(self, pod: ProcessPod) -> None:
        with self._binding:
            self._leaving[pod.name] = pod.ready
        released = self._releasing[pod.ip]
        self.stopping[pod.name] = time.monotonic()
        self.say(f"kubelet: {pod.name} was deleted; stopping it")
        try:
            self.terminated[pod.name] = pod.terminate()
        finally:
            released.set()
        with self._binding:
            self._bound.pop(pod.name, None)
            self._leaving.pop(pod.name, None)
        self.say(f"kubelet: {pod.name} stopped in {self.terminated[pod.name]:.1f} s")

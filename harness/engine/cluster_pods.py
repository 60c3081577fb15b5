"""The kubelet's half for kwok pods that really run: their status written from real probes.

kwok makes a pod annotated `kubelet.harness.promptcache.io/processes` Running with a pod
IP but never Ready (e2e/localcluster/lifecycle.py). `run_on_cluster` reads that pod from
the API server, resolves its Secrets there, runs its containers as a `ProcessPod`, and
writes Ready / ContainersReady and each container's `ready` to the pod's status whenever
the probes change their verdict, so the Deployment, the operator and the picker see
what a real kubelet would report. `stop_on_cluster` stops it and says so (not Ready), as
a kubelet would once the containers have gone.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from e2e.localcluster.lifecycle import PROCESS_POD_ANNOTATION
from harness.engine.pods import SaltSecrets
from harness.pod import ProcessPod
from harness.pytest_cluster import Cluster

if TYPE_CHECKING:
    from collections.abc import Callable

    from harness.epp.pool import PoolOnCluster

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
) -> list[ProcessPod]:
    """One ProcessPod per kwok pod of `pool`'s model Deployment, on its IP, with the pool's
    salt Secret (the policy step reads the same key); all started at once (each waits for
    an engine slot), then waited for.

    Each engine's worker is bound to a core of its own, from `first_core` on (so two pools
    need not share one) (`VLLM_CPU_OMP_THREADS_BIND`: the CPU build otherwise binds every
    worker to core 0): a machine layout, not a translation of
    the rendered pod, which is otherwise run as the API server holds it."""
    secrets_ = SaltSecrets()
    pool.salt_key_file.write_bytes(secrets_.key)
    spec = pool.rendered.model_deployment["spec"]["template"]["spec"]
    cores = sorted(os.sched_getaffinity(0))
    pods = []
    for i, obj in enumerate(pool.wait_pods()):
        mine = json.loads(json.dumps(spec))
        for c in mine["containers"]:
            if c["name"] == "vllm":
                env = c.setdefault("env", [])
                env.append(
                    {
                        "name": "VLLM_CPU_OMP_THREADS_BIND",
                        "value": str(cores[(first_core + i) % len(cores)]),
                    }
                )
        name, ip = obj["metadata"]["name"], obj["status"]["podIP"]
        pods.append(
            ProcessPod(name, mine, ip, workdir / name, secrets_, kv_cache_bytes=kv_cache_bytes)
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

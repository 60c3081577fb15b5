"""The demo's second half: traffic through the gateway path, and the cache working.

On the demo cluster the model-server pods are kwok pods with loopback IPs. For
each one this binds what the rendered pod runs: the stand-in vLLM
(`harness.standin`: a block-level prefix cache, a latency model, vLLM's
metrics) on the vLLM port, and the real cache front (`python -m promptcache.front`,
the rendered environment, the operator's salt Secret) on the serving port. The
real Endpoint Picker runs with the rendered config and args as the rendered
ServiceAccount, behind the rendered gateway policy step when the pod has one (it
puts the tenant's salt into the body the picker hashes; the picker then serves
plain gRPC on the pod's loopback, as rendered), and picks a pod for every request
over ext_proc, asked on the port the gateway would dial.

The same multi-tenant, multi-turn chat workload runs twice on fresh caches: once
with load-only routing (queue + KV-cache scorers), once with the generated
prefix-aware config. While it runs the operator scrapes the fronts' `/metrics`
into `status.prefixCache`, so `kubectl get pcd` shows the hit ratio rising.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from e2e import pytest_cluster
from e2e.epp.front import FrontProcess
from e2e.epp.pool import PodHandle, PoolOnCluster
from e2e.epp.process import EppProcess
from e2e.epp.rendered import Rendered, load_example, render_resource
from e2e.epp.shim import ShimProcess
from e2e.epp.traffic import (
    LOAD_ONLY,
    Pick,
    Stats,
    Target,
    Workload,
    for_gie,
    picker_router,
    random_router,
    run_trace,
    schedule,
    use_gie_picker,
)
from harness.standin import EngineConfig, FakePod, VllmMetrics
from promptcache.contract import DEFAULT_ISOLATION_HEADER, VLLM_LOCAL_PORT

WORKLOAD = Workload(tenants=3, sessions=24, doc_share=0.0, system_tokens=1500, turns=(3, 5))
ENGINE = EngineConfig.gpu_like(1.0, num_gpu_blocks=4096, max_num_seqs=16)
RATE_RPS = 8.0


def _tenant_header(tenant: int) -> tuple[dict[str, Any], dict[str, str]]:
    """Tenants name their isolation key; the front derives each one's cache_salt."""
    return {}, {DEFAULT_ISOLATION_HEADER: f"tenant-{tenant}"}


class _StatusWatch:
    """Prints the resource's `kubectl get pcd` row whenever its hit ratio changes."""

    def __init__(self, cluster: Any, name: str, namespace: str, say: Callable[[str], None]) -> None:
        self.cluster, self.name, self.namespace, self.say = cluster, name, namespace, say
        self.last: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _row(self) -> tuple[str, dict[str, Any]]:
        out = self.cluster.kubectl("get", "pcd", self.name, "-n", self.namespace, check=False)
        status = self.cluster.kubectl(
            "get",
            "pcd",
            self.name,
            "-n",
            self.namespace,
            "-o",
            "jsonpath={.status.prefixCache}",
            check=False,
        )
        lines = out.stdout.strip().splitlines()
        try:
            cache = json.loads(status.stdout or "{}")
        except ValueError:
            cache = {}
        return (lines[-1] if lines else ""), cache

    def _run(self) -> None:
        while not self._stop.is_set():
            row, cache = self._row()
            key = json.dumps(cache, sort_keys=True)
            if key != self.last:
                self.last = key
                self.say(f"  kubectl get pcd: {row}    (scrapedPods {cache.get('scrapedPods', 0)})")
            self._stop.wait(1.0)

    def __enter__(self) -> _StatusWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _salt_key(cluster: Any, rendered: Rendered) -> bytes | None:
    for obj in rendered.objects:
        if obj.get("kind") != "Deployment":
            continue
        for vol in obj["spec"]["template"]["spec"].get("volumes", []):
            secret = vol.get("secret", {}).get("secretName")
            if secret:
                data = cluster.get_json("secret", secret, "-n", rendered.namespace)["data"]
                return base64.b64decode(data[vol["secret"]["items"][0]["key"]])
    return None


def _bind_pods(pool: PoolOnCluster, cluster: Any, workdir: Path, model: str) -> list[Target]:
    rendered = pool.rendered
    key = _salt_key(cluster, rendered)
    if key is not None:  # the operator's Secret, as the fronts and the policy step mount it
        pool.salt_key_file.write_bytes(key)
    for pod in pool.wait_pods():
        name, ip = pod["metadata"]["name"], pod["status"]["podIP"]
        server = FakePod(
            name,
            ip,
            VLLM_LOCAL_PORT,
            VllmMetrics(model_name=model, block_size=16, num_gpu_blocks=ENGINE.num_gpu_blocks),
            config=ENGINE,
        ).start()
        front_dir = workdir / f"front-{name}"
        front = FrontProcess(
            listen=(ip, rendered.target_port),
            upstream=f"http://{ip}:{VLLM_LOCAL_PORT}",
            env=pool.front_env(),
            workdir=front_dir,
            salt_key_file=pool.salt_key_file,
        )
        pool.pods.append(PodHandle(name, ip, server, front.start()))
    for handle in pool.pods:
        assert handle.front is not None
        handle.front.wait_ready()
    return [Target(h.name, f"http://{h.endpoint}", h.endpoint, h.server) for h in pool.pods]


def _gateway_path(shim: ShimProcess | None, epp: EppProcess) -> str:
    picker = f"picker {'TLS' if epp.secure else 'plain gRPC'} on 127.0.0.1:{epp.ports.grpc}"
    if shim is None:
        return f"ext_proc -> {picker} (alone on its port, as rendered)"
    return (
        f"ext_proc -> gateway policy step on {shim.target} (tenant salt) -> {picker} (as rendered)"
    )


def _run(pick: Pick, targets: list[Target], seed: int) -> Stats:
    trace = schedule(WORKLOAD.build(seed), RATE_RPS, WORKLOAD, seed + 1)

    async def go() -> Stats:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(32))
        return await run_trace(
            pick, targets, trace, WORKLOAD, seed, tenant_fields=_tenant_header, model="demo"
        )

    return asyncio.run(go())


def _line(label: str, s: Stats) -> str:
    return (
        f"{label:30} cached {s.cached_fraction:6.1%} of {s.prompt_tokens} prompt tokens, "
        f"TTFT p50 {s.ttft(0.5) * 1e3:5.0f} ms p99 {s.ttft(0.99) * 1e3:5.0f} ms, "
        f"busiest pod {s.busiest:.0%} of {len(s.ttft_s)} requests"
    )


def show_cache_working(
    kubeconfig: Path, example: Path, workdir: Path, say: Callable[[str], None]
) -> None:
    """Bind stand-ins and fronts on the example's pods, route the workload twice, report."""
    t0 = time.monotonic()
    cluster = pytest_cluster.Cluster(kubeconfig=kubeconfig, pod_cidr=None, mode="existing")
    # The picker this machine can build (the resource as applied targets llm-d-router,
    # whose binary the module proxy here refuses): the same pods, the GIE-rendered config.
    resource = load_example(example, None, {"gateway": {"picker": "gie-v1.5"}})
    name, namespace = resource["metadata"]["name"], resource["metadata"].get("namespace", "default")
    rendered = Rendered(render_resource(resource))
    workdir.mkdir(parents=True, exist_ok=True)
    pool = PoolOnCluster(cluster, rendered, workdir)
    try:
        say("binding a stand-in vLLM and the real cache front on each model-server pod")
        targets = _bind_pods(pool, cluster, workdir, resource["spec"]["model"]["name"])
        try:
            say(f"Endpoint Picker: {use_gie_picker()}")
            picker = True
        except SystemExit as e:
            say(f"no Endpoint Picker binary ({e}): routing at random instead")
            picker = False
        runs: list[tuple[str, Stats]] = []
        plan = [("load-only routing", LOAD_ONLY), ("prefix-aware (generated config)", None)]
        for label, config in plan:
            for t in targets:
                t.pod.reset()
            client = None
            if picker:
                text = config if config is not None else for_gie(rendered.epp_config_text)[0]
                # The picker with its rendered args and, when the pod renders one, the
                # gateway policy step in front (the tenant's salt goes into the body the
                # picker hashes); the client dials what a gateway would dial.
                epp = pool.start_epp(config_text=text)
                client = pool.client()
                pick = picker_router(client, targets)
                if not runs:
                    say(f"gateway path: {_gateway_path(pool.shim, epp)}")
            else:
                pick = random_router(targets, 1)
            say(
                f"{label}: {WORKLOAD.sessions} chats of {WORKLOAD.tenants} tenants, "
                f"{RATE_RPS:g} req/s"
            )
            try:
                with _StatusWatch(cluster, name, namespace, say):
                    stats = _run(pick, targets, seed=11)
                    time.sleep(4)  # one more operator resync after the last answer
            finally:
                if client is not None:
                    client.close()
                if pool.shim is not None:
                    pool.shim.stop()
                    pool.shim = None
                if pool.epp is not None:
                    pool.epp.stop()
                    pool.epp = None
            runs.append((label, stats))
        print()
        for label, s in runs:
            print(_line(label, s))
        (_, lo), (_, pa) = runs
        lo_prefill = lo.prompt_tokens - lo.cached_tokens
        pa_prefill = pa.prompt_tokens - pa.cached_tokens
        print(
            f"prefix-aware vs load-only on the same workload: cached share "
            f"{pa.cached_fraction:.1%} vs {lo.cached_fraction:.1%}; prefilled tokens "
            f"{lo_prefill} -> {pa_prefill} ({1 - pa_prefill / max(1, lo_prefill):.0%} less GPU "
            f"prefill); TTFT p50 {pa.ttft(0.5) / lo.ttft(0.5):.2f}x, "
            f"p99 {pa.ttft(0.99) / lo.ttft(0.99):.2f}x load-only's"
        )
        say(f"traffic part took {time.monotonic() - t0:.0f} s")
    finally:
        pool.close()


def main(argv: list[str] | None = None) -> int:
    """`python -m e2e.demo_traffic`: what `e2e/demo` runs once the resource is Ready."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--example", type=Path, required=True, help="the applied resource")
    parser.add_argument("--workdir", type=Path, required=True, help="logs and pod state")
    args = parser.parse_args(argv)

    def say(msg: str) -> None:
        print(f"[demo] {msg}", file=sys.stderr, flush=True)

    show_cache_working(args.kubeconfig, args.example, args.workdir, say)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

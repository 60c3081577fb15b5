"""The demo's second half: real vLLM pods, traffic through the gateway path, the cache working.

The demo applies a resource for the local tiny model (`demo_resource`: built like the
real-engine tests' `harness/engine/pods.engine_resource`, two replicas, block size 32) whose
pod template asks for pods that really run. The operator renders it; kwok schedules the
model-server pods and gives them loopback IPs but leaves their readiness alone; the
harness runs each pod's containers as processes (`harness/engine/cluster_pods.run_on_cluster`:
the real cache front in front of a real `vllm serve`, vLLM's CPU build, with the args,
env, Secrets and probes the API server holds) and writes Ready from the rendered probes.
Each engine's KV cache is small (`KV_CACHE_BYTES`) so that the workload does not fit in
one pod: where a request lands decides what is cached.

The real Endpoint Picker, the default (promptcache's own build, which derives the
tenant's salt itself and hashes it with the prompt), runs with the rendered config and
args as the rendered ServiceAccount, alone on its port with its rendered TLS, and picks a
pod for every request over ext_proc, asked on the port the gateway would dial.

The same multi-tenant, multi-turn chat workload runs twice: once with load-only routing
(queue + KV-cache scorers), once with the generated prefix-aware config, each with
isolation keys of its own so that the second run finds nothing of the first in the
engines' caches. Cached tokens are the engines' own (`usage.prompt_tokens_details`); TTFT
is the client's time to the first streamed token. While it runs the operator scrapes the
pods' `/metrics` (the engines' prefix-cache counters) into `status.prefixCache`, so
`kubectl get pcd` shows the hit ratio rising.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from harness import pytest_cluster
from harness.engine.cluster_pods import (
    PROCESS_POD_TEMPLATE,
    run_on_cluster,
    salt_key_of,
    stop_on_cluster,
)
from harness.engine.pods import SERVED_NAME, engine_resource
from harness.epp.pool import PoolOnCluster
from harness.epp.process import EppProcess
from harness.epp.rendered import Rendered, render_resource
from harness.epp.shim import GatewayPolicyProcess
from harness.epp.traffic import (
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
from harness.operator import ladder_section
from harness.pod import ProcessPod
from harness.vllm import tiny_model
from harness.waiting import NotMet, wait_until
from promptcache.contract import DEFAULT_ISOLATION_HEADER

NAME = "tiny-demo"
NAMESPACE = "default"
REPLICAS = 2
KV_CACHE_BYTES = 12 << 20
"""12 MiB per engine: 12k tokens of the tiny model (1 KiB of KV per token), 384 blocks of
32; the workload has more distinct prompt tokens than that (19k prefilled at the least),
so what a pod holds depends on which conversations keep to it (the engine needs room for one
8192-token sequence, the model's context, so it cannot be much smaller)."""
WORKLOAD = Workload(
    tenants=3,
    sessions=16,
    doc_share=0.0,
    system_tokens=300,
    user_tokens=(20, 80),
    turns=(3, 5),
)
"""Token counts are the stand-in's (4 bytes a token); the tiny model's tokenizer makes
about 4 times as many of these synthetic words: a system prompt of about 1200 tokens
per tenant, questions of 80-320, prompts up to about 2500."""
RATE_RPS = 4.0


def demo_resource(model: Path) -> dict[str, Any]:
    """The resource the demo applies: the real-engine tests' resource for the local tiny
    model (its folder is this machine's, so it is made here), two replicas, pods that
    really run, and the default picker (promptcache's own build, which `e2e/cluster build`
    builds: it derives the tenant's salt itself, no policy step in front)."""
    resource = engine_resource(model, name=NAME)
    resource["metadata"]["namespace"] = NAMESPACE
    resource["spec"]["model"]["replicas"] = REPLICAS
    resource["spec"]["model"]["podTemplate"] = PROCESS_POD_TEMPLATE
    return resource


def _tenant_header(run: str) -> Callable[[int], tuple[dict[str, Any], dict[str, str]]]:
    """Tenants name their isolation key; the front derives each one's cache_salt. Each run
    has keys of its own, so it starts with nothing of its own in the engines' caches."""

    def fields(tenant: int) -> tuple[dict[str, Any], dict[str, str]]:
        return {}, {DEFAULT_ISOLATION_HEADER: f"{run}-tenant-{tenant}"}

    return fields


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


def _scheduled_pods(cluster: Any, rendered: Rendered, timeout_s: float = 120) -> list[str]:
    """The model-server pods once kwok has made them Running with an IP (not Ready: that
    is for their probes to say)."""
    selector = rendered.label_selector
    deadline = time.monotonic() + timeout_s
    names: list[str] = []
    while time.monotonic() < deadline:
        items = cluster.get_json("pods", "-n", rendered.namespace, "-l", selector)["items"]
        names = sorted(
            p["metadata"]["name"]
            for p in items
            if p["status"].get("podIP") and not p["metadata"].get("deletionTimestamp")
        )
        if len(names) == rendered.replicas:
            return names
        time.sleep(0.5)
    raise TimeoutError(f"{len(names)}/{rendered.replicas} model-server pods have an IP")


def _run_pods(
    pool: PoolOnCluster, cluster: Any, workdir: Path, say: Callable[[str], None]
) -> list[ProcessPod]:
    """Each model-server pod as it is on the API server: cache front + real vLLM."""
    rendered = pool.rendered
    key = salt_key_of(cluster, rendered)
    if key is not None:  # the operator's Secret, as the policy step mounts it
        pool.salt_key_file.write_bytes(key)
    pods: list[ProcessPod] = []
    for name in _scheduled_pods(cluster, rendered):
        pods.append(
            run_on_cluster(
                cluster,
                rendered.namespace,
                name,
                workdir / f"pod-{name}",
                kv_cache_bytes=KV_CACHE_BYTES,
            )
        )
    t0 = time.monotonic()
    say(
        f"started {len(pods)} pods (the real cache front + `vllm serve`, {KV_CACHE_BYTES >> 20}"
        f" MiB of KV cache each) on {', '.join(p.ip for p in pods)}; waiting for their "
        "probes (an engine takes 30-70 s to start on 2 cores)"
    )
    for pod in pods:
        pod.wait_ready(timeout_s=900)
    say(f"both pods Ready by their probes after {time.monotonic() - t0:.0f} s")
    return pods


def _warm_up(targets: list[Target]) -> None:
    """One short request per pod, under a key no run uses: the engines' first requests
    are slower, and neither run should pay for that."""
    for t in targets:
        body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "hello"}]}
        request = urllib.request.Request(
            t.url + "/v1/chat/completions",
            data=json.dumps({**body, "max_tokens": 4}).encode(),
            headers={"content-type": "application/json", DEFAULT_ISOLATION_HEADER: "warm-up"},
        )
        with urllib.request.urlopen(request, timeout=300) as resp:
            resp.read()


def _load_only(rendered_config: str) -> str:
    """The load-only baseline for the rendered picker: `LOAD_ONLY`'s scorers, with the
    rendered request parser (promptcache's tenant salt) kept, so only routing differs."""
    rendered, baseline = yaml.safe_load(rendered_config), yaml.safe_load(LOAD_ONLY)
    if "parser" in rendered:
        (ref,) = [rendered["parser"]["pluginRef"]]
        baseline["plugins"] += [p for p in rendered["plugins"] if p.get("name", p["type"]) == ref]
        baseline["parser"] = rendered["parser"]
    return str(yaml.safe_dump(baseline, sort_keys=False))


def _gateway_path(shim: GatewayPolicyProcess | None, epp: EppProcess) -> str:
    picker = f"picker {'TLS' if epp.secure else 'plain gRPC'} on 127.0.0.1:{epp.ports.grpc}"
    if shim is None:
        return f"ext_proc -> {picker} (alone on its port, as rendered)"
    return (
        f"ext_proc -> gateway policy step on {shim.target} (tenant salt) -> {picker} (as rendered)"
    )


def _run(pick: Pick, targets: list[Target], seed: int, run: str) -> Stats:
    trace = schedule(WORKLOAD.build(seed), RATE_RPS, WORKLOAD, seed + 1)

    async def go() -> Stats:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(32))
        return await run_trace(
            pick,
            targets,
            trace,
            WORKLOAD,
            seed,
            tenant_fields=_tenant_header(run),
            model=SERVED_NAME,
        )

    return asyncio.run(go())


def _line(label: str, s: Stats) -> str:
    return (
        f"{label:32} cached {s.cached_fraction:6.1%} of {s.prompt_tokens} prompt tokens, "
        f"TTFT p50 {s.ttft(0.5) * 1e3:5.0f} ms p99 {s.ttft(0.99) * 1e3:5.0f} ms, "
        f"busiest pod {s.busiest:.0%} of {len(s.ttft_s)} requests"
        + (f", {s.errors} errors" if s.errors else "")
    )


def _apply(
    cluster: Any, resource: dict[str, Any], workdir: Path, say: Callable[[str], None]
) -> None:
    path = workdir / "resource.yaml"
    path.write_text(yaml.safe_dump(resource, sort_keys=False))
    say(
        f"applying {NAME} (the local tiny model, {REPLICAS} replicas, pods that really run): {path}"
    )
    cluster.kubectl("apply", "-f", str(path))


def show_cache_working(kubeconfig: Path, workdir: Path, say: Callable[[str], None]) -> None:
    """Apply the demo resource, run its pods on real engines, route the workload twice."""
    t0 = time.monotonic()
    cluster = pytest_cluster.Cluster(kubeconfig=kubeconfig, pod_cidr=None, mode="existing")
    workdir.mkdir(parents=True, exist_ok=True)
    say("making (or reusing) the local tiny model")
    resource = demo_resource(tiny_model())
    _apply(cluster, resource, workdir, say)
    rendered = Rendered(render_resource(resource))
    pool = PoolOnCluster(cluster, rendered, workdir)
    pods: list[ProcessPod] = []
    try:
        pods = _run_pods(pool, cluster, workdir, say)
        cluster.kubectl(
            "wait", "--for=condition=Ready", "--timeout=180s", f"pcd/{NAME}", "-n", NAMESPACE
        )
        print(cluster.kubectl("get", "pcd", NAME, "-n", NAMESPACE).stdout, flush=True)
        targets = [Target(p.name, p.url(), f"{p.ip}:{rendered.target_port}", p) for p in pods]
        _warm_up(targets)
        try:
            say(f"Endpoint Picker: {use_gie_picker()}")
            picker = True
        except SystemExit as e:
            say(f"no Endpoint Picker binary ({e}): routing at random instead")
            picker = False
        runs: list[tuple[str, Stats]] = []
        plan = [
            ("load-only", "load-only routing", LOAD_ONLY),
            ("prefix-aware", "prefix-aware (generated config)", None),
        ]
        for run, label, config in plan:
            client = None
            if picker:
                salted = rendered.epp_config_text_with_salt_key(pool.salt_key_file)
                text = _load_only(salted) if config is not None else for_gie(salted)[0]
                # The picker with its rendered args and, when the pod renders one, the
                # gateway policy step in front (promptcache's picker, the default, has none:
                # it salts itself); the client dials what a gateway would dial.
                epp = pool.start_epp(config_text=text, wait_scraped=False)
                epp.wait_scraped({p.name: 0.0 for p in pods}, timeout_s=60)
                client = pool.client()
                pick = picker_router(client, targets, forward=True)
                if not runs:
                    say(f"gateway path: {_gateway_path(pool.shim, epp)}")
            else:
                pick = random_router(targets, 1)
            say(
                f"{label}: {WORKLOAD.sessions} chats of {WORKLOAD.tenants} tenants, "
                f"{RATE_RPS:g} req/s, streamed"
            )
            try:
                with _StatusWatch(cluster, NAME, NAMESPACE, say):
                    stats = _run(pick, targets, seed=11, run=run)
                    time.sleep(4)  # one more operator resync after the last answer
            finally:
                if client is not None:
                    client.close()
                pool.stop_picker()
            runs.append((label, stats))
        print()
        print(
            f"{REPLICAS} real vLLM pods (vLLM's CPU build, the tiny model); cached tokens are "
            "the engines' own:"
        )
        for label, s in runs:
            print(_line(label, s))
        (_, lo), (_, pa) = runs
        lo_prefill = lo.prompt_tokens - lo.cached_tokens
        pa_prefill = pa.prompt_tokens - pa.cached_tokens
        print(
            f"prefix-aware vs load-only on the same workload: cached share "
            f"{pa.cached_fraction:.1%} vs {lo.cached_fraction:.1%}; prefilled tokens "
            f"{lo_prefill} -> {pa_prefill} ({1 - pa_prefill / max(1, lo_prefill):.0%} less "
            f"prefill); TTFT p50 {pa.ttft(0.5) * 1e3:.0f} vs {lo.ttft(0.5) * 1e3:.0f} ms "
            f"({pa.ttft(0.5) / lo.ttft(0.5):.2f}x), p99 {pa.ttft(0.99) * 1e3:.0f} vs "
            f"{lo.ttft(0.99) * 1e3:.0f} ms ({pa.ttft(0.99) / lo.ttft(0.99):.2f}x)",
            flush=True,
        )
        if picker:
            _print_ladder(cluster, say)
        say(f"traffic part took {time.monotonic() - t0:.0f} s")
    finally:
        pool.close()
        for pod in pods:
            stop_on_cluster(cluster, NAMESPACE, pod)


def _print_ladder(cluster: Any, say: Callable[[str], None], timeout_s: float = 30) -> None:
    """Why the hit ratio is what it is: the ladder `kubectl describe pcd` prints, over the
    operator's status window (the prefix-aware run's requests; the load-only run's picker
    predicts nothing, so the fronts account none of its requests)."""
    try:
        section = wait_until(
            lambda: ladder_section(
                cluster.kubectl("describe", "pcd", NAME, "-n", NAMESPACE, check=False).stdout
            ),
            "the hit-ratio ladder in the status",
            within_s=timeout_s,
            interval_s=2,
        )
    except NotMet:
        say("no hit-ratio ladder in the status (too few predicted prompt tokens to judge)")
        return
    print(f"\nkubectl describe pcd {NAME} (the hit-ratio ladder):\n{section}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m e2e.demo_traffic`: what `e2e/demo` runs once the operator is up."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, required=True, help="logs and pod state")
    args = parser.parse_args(argv)

    def say(msg: str) -> None:
        print(f"[demo] {msg}", file=sys.stderr, flush=True)

    show_cache_working(args.kubeconfig, args.workdir, say)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

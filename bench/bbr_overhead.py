#!/usr/bin/env python3
"""What the body-based hop adds to a request: latency and the router's CPU, against the
single-model path in the same run.

A resource that routes by model costs each request one more ext_proc exchange before the
Gateway picks a route: GIE's `bbr` v1.5.0 (the real binary, with the chart's arguments and
plugins, plaintext as `bodyBasedRouter.secureServing: false` serves it) reads the whole
body, parses it as JSON and answers with the model headers. Everything after it is the
single-model path: the rendered gateway policy step and the real GIE v1.5 picker choose a
pod, and the request goes to it.

* **Arms** (same pool, same pods, same bodies, alternated round by round so the machine's
  load falls on both alike): `single` = policy step + picker + the pod; `multi` = the
  router first, the rendered HTTPRoute matched on its header, then the same.
* **Pods**: two stand-in pods that answer at once (`harness.standin`, zero latency), so the
  figures are the routing path's own cost, not an engine's: on a real engine the same
  milliseconds are added to a request that takes tens of milliseconds or more.
* **Bodies**: a 1 KiB chat request and a 64 KiB one (the router parses every byte).
* **Reported**: per arm p50/p99 of the whole request at concurrency 1 and 8, the added
  p50/p99 (multi - single) and their ratio; the router's exchange alone; the router's CPU
  per request (its process's utime+stime over the multi arm's requests) beside the policy
  step's and picker's over the same requests.
* **Caveat**: the harness plays Envoy in Python (one persistent gRPC channel per worker and
  processor, as Envoy keeps one), so the client's own cost of one more stream is in the
  added latency: an upper bound for what Envoy adds. The router's CPU is its own.

Needs the local control plane (`bbr` reads its mapping ConfigMaps from an API server), the
GIE picker and `bbr` (`e2e/cluster build --only epp bbr`). Run: `python -m bench.bbr_overhead`
(about 3 minutes; `--quick` for a smoke run). Quote figures from a run on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import pytest_cluster
from harness.epp.bbr import BbrProcess, chart_router_args, route
from harness.epp.extproc import DESTINATION_HEADER, ExtProcClient
from harness.epp.pool import PoolOnCluster
from harness.epp.rendered import Rendered, render_resource
from promptcache.contract import DEFAULT_ISOLATION_HEADER
from promptcache.contract.router import BASE_MODEL_HEADER
from tools import install_assets

ARMS = ("single", "multi")
NAMES = ("base-a", "sql-lora", "chat-lora")


@dataclass(frozen=True)
class Plan:
    requests: int
    rounds: int
    concurrency: tuple[int, ...]
    body_kib: tuple[int, ...]
    out: Path | None = None
    """Where the PNG goes (None: no plot)."""


def parse_args(argv: list[str] | None = None) -> Plan:
    p = argparse.ArgumentParser(prog="python -m bench.bbr_overhead", description=__doc__)
    p.add_argument("--requests", type=int, default=600, help="per arm, body size and level")
    p.add_argument("--rounds", type=int, default=6, help="alternations of the two arms")
    p.add_argument("--quick", action="store_true", help="60 requests, 2 rounds, no plot")
    p.add_argument("--out", default="docs/img", help="folder of the PNG ('' for none)")
    args = p.parse_args(argv)
    if args.quick:
        return Plan(60, 2, (1, 8), (1, 64))
    return Plan(args.requests, args.rounds, (1, 8), (1, 64), Path(args.out) if args.out else None)


def resource(namespace: str) -> dict[str, Any]:
    """One resource routing by model with two adapters, on two stand-in pods."""
    return {
        "apiVersion": "serving.promptcache.io/v1alpha1",
        "kind": "PromptCacheDeployment",
        "metadata": {"name": "bench-a", "namespace": namespace},
        "spec": {
            "model": {
                "name": "org/base-a",
                "servedModelName": "base-a",
                "replicas": 2,
                "adapters": [
                    {"name": "sql-lora", "path": "/model-cache/sql"},
                    {"name": "chat-lora", "path": "/model-cache/chat"},
                ],
            },
            "gateway": {
                "picker": "gie-v1.5",
                "route": {"parentRefs": [{"name": "shared"}], "routeByModel": True},
            },
        },
    }


def body_of(kib: int, i: int) -> bytes:
    """A chat request of about `kib` KiB naming one of the resource's names."""
    filler = " ".join(f"word{(i * 7 + j) % 997}" for j in range(kib * 128))[: kib * 1024 - 200]
    return json.dumps(
        {
            "model": NAMES[i % len(NAMES)],
            "messages": [{"role": "user", "content": filler}],
            "max_tokens": 1,
        }
    ).encode()


def cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Worker:
    """One Gateway worker: persistent channels to each processor and connections to pods."""

    bbr: BbrProcess
    pool: PoolOnCluster
    routes: list[dict[str, Any]]
    router: ExtProcClient = field(init=False)
    picker: ExtProcClient = field(init=False)
    conns: dict[str, http.client.HTTPConnection] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.router = self.bbr.client()
        self.picker = self.pool.client()

    def close(self) -> None:
        self.router.close()
        self.picker.close()
        for c in self.conns.values():
            c.close()

    def one(self, arm: str, raw: bytes, key: str) -> tuple[float, float]:
        """(whole request, router exchange) in seconds."""
        headers = {"content-type": "application/json", DEFAULT_ISOLATION_HEADER: key}
        started = time.perf_counter()
        hop = 0.0
        if arm == "multi":
            routed = self.router.pick(raw, headers=headers, path="/v1/chat/completions")
            hop = time.perf_counter() - started
            headers.update(routed.set_headers)
            raw = routed.body or raw
            rule = route(self.routes, "POST", "/v1/chat/completions", headers)
            assert rule is not None, headers
            assert rule.backend == self.pool.rendered.pool_name, rule
        picked = self.picker.pick(raw, headers=headers, path="/v1/chat/completions")
        assert picked.endpoint is not None, picked
        sent = {k: v for k, v in {**headers, **picked.set_headers}.items()
                if not k.startswith((":", "content-length", DESTINATION_HEADER))}  # fmt: skip
        conn = self.conns.get(picked.endpoint)
        if conn is None:
            host, port = picked.endpoint.rsplit(":", 1)
            conn = self.conns[picked.endpoint] = http.client.HTTPConnection(host, int(port))
        conn.request("POST", "/v1/chat/completions", body=picked.body or raw, headers=sent)
        resp = conn.getresponse()
        answer = resp.read()
        assert resp.status == 200, (resp.status, answer[:300])
        return time.perf_counter() - started, hop


@dataclass
class Samples:
    whole: list[float] = field(default_factory=list)
    hop: list[float] = field(default_factory=list)
    requests: int = 0
    bbr_cpu: float = 0.0
    picker_cpu: float = 0.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def run_round(
    workers: list[Worker], arm: str, bodies: list[bytes], concurrency: int, samples: Samples,
    pids: dict[str, int],
) -> None:  # fmt: skip
    lock = threading.Lock()
    before = {k: cpu_s(p) for k, p in pids.items()}

    def task(i: int) -> None:
        whole, hop = workers[i % concurrency].one(arm, bodies[i], f"tenant-{i % 4}")
        with lock:
            samples.whole.append(whole)
            samples.hop.append(hop)

    # One lane per worker: lane w sends requests w, w + c, w + 2c, ... on worker w.
    def lane(w: int) -> None:
        for i in range(w, len(bodies), concurrency):
            task(i)

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lane, range(concurrency)))
    samples.requests += len(bodies)
    samples.bbr_cpu += cpu_s(pids["bbr"]) - before["bbr"]
    samples.picker_cpu += sum(cpu_s(pids[k]) - before[k] for k in ("picker", "step"))


@contextlib.contextmanager
def setup(workdir: Path) -> Iterator[tuple[BbrProcess, PoolOnCluster]]:
    cluster = pytest_cluster.start_local_cluster(gateway_crds=True)
    try:
        ns = cluster.create_namespace("bbr-bench")
        pool = PoolOnCluster(cluster, Rendered(render_resource(resource(ns))), workdir / "pool")
        try:
            pool.apply()  # the model Deployment's kwok pods and the router's mapping ConfigMap
            pool.start_pods()
            pool.start_epp()
            args = [
                *chart_router_args(install_assets.helm_template),
                "--secure-serving=false",
            ]
            with BbrProcess(
                pytest_cluster.built_binary("bbr"),
                workdir / "bbr",
                cluster.kubeconfig,
                args,
                namespace=None,  # its own control plane: every namespace, the chart's default
            ) as bbr:
                bbr.wait_ready()
                probe = body_of(1, 1)
                deadline = time.monotonic() + 60
                while True:  # until the router has read the mapping ConfigMap
                    with bbr.client() as c:
                        got = c.pick(probe, path="/v1/chat/completions").set_headers
                    if got.get(BASE_MODEL_HEADER.lower()) == "base-a":
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"bbr never mapped sql-lora: {got}")
                    time.sleep(0.3)
                yield bbr, pool
        finally:
            pool.close()
    finally:
        pytest_cluster.stop_cluster(cluster)


def main(argv: list[str] | None = None) -> int:
    plan = parse_args(argv)
    print(f"load average at start: {os.getloadavg()}")
    results: dict[tuple[int, int, str], Samples] = {}
    with tempfile.TemporaryDirectory(prefix="bbr-bench-") as tmp, setup(Path(tmp)) as (bbr, pool):
        assert pool.epp is not None
        assert pool.shim is not None
        pids = {"bbr": bbr.pid, "picker": pool.epp.pid, "step": pool.shim.pid}
        routes = list(pool.rendered.of_kind("HTTPRoute"))
        for kib in plan.body_kib:
            bodies = [body_of(kib, i) for i in range(plan.requests)]
            for c in plan.concurrency:
                workers = [Worker(bbr, pool, routes) for _ in range(c)]
                try:
                    for w in workers:  # warm every channel and connection
                        for arm in ARMS:
                            w.one(arm, bodies[0], "warm")
                    per_round = plan.requests // plan.rounds
                    for r in range(plan.rounds):
                        order = ARMS if r % 2 == 0 else ARMS[::-1]
                        chunk = bodies[r * per_round : (r + 1) * per_round]
                        for arm in order:
                            samples = results.setdefault((kib, c, arm), Samples())
                            run_round(workers, arm, chunk, c, samples, pids)
                finally:
                    for w in workers:
                        w.close()
                report_one(kib, c, results)
    print(f"load average at end: {os.getloadavg()}")
    if plan.out is not None:
        print(f"plot: {plot(plan, results, plan.out)}")
    return 0


def plot(plan: Plan, results: dict[tuple[int, int, str], Samples], out: Path) -> Path:
    """p50 and p99 per arm, per body size and concurrency, side by side."""
    import matplotlib  # noqa: PLC0415 - only the bench draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    levels = [(kib, c) for kib in plan.body_kib for c in plan.concurrency]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, q in zip(axes, (0.5, 0.99), strict=True):
        for k, (arm, colour) in enumerate((("single", "#4c72b0"), ("multi", "#dd8452"))):
            xs = [i + (k - 0.5) * 0.38 for i in range(len(levels))]
            ys = [pct(results[(kib, c, arm)].whole, q) for kib, c in levels]
            label = "single-model path" if arm == "single" else "with the body-based router"
            ax.bar(xs, ys, width=0.36, color=colour, label=label)
        ax.set_xticks(range(len(levels)), [f"{kib} KiB, c={c}" for kib, c in levels])
        ax.set_ylabel(f"request p{int(q * 100)} (ms)")
        ax.set_title(f"p{int(q * 100)} per request, same run")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "bbr-overhead.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def report_one(kib: int, c: int, results: dict[tuple[int, int, str], Samples]) -> None:
    single, multi = results[(kib, c, "single")], results[(kib, c, "multi")]
    s50, s99 = pct(single.whole, 0.5), pct(single.whole, 0.99)
    m50, m99 = pct(multi.whole, 0.5), pct(multi.whole, 0.99)
    print(
        f"\n{kib} KiB bodies, concurrency {c}, {multi.requests} requests per arm\n"
        f"  single-model path  p50 {s50:6.2f} ms  p99 {s99:6.2f} ms\n"
        f"  with the router    p50 {m50:6.2f} ms  p99 {m99:6.2f} ms\n"
        f"  added              p50 {m50 - s50:+6.2f} ms  p99 {m99 - s99:+6.2f} ms"
        f"  (multi/single p50 {m50 / s50:.2f}x, p99 {m99 / s99:.2f}x)\n"
        f"  router exchange    p50 {pct(multi.hop, 0.5):6.2f} ms"
        f"  p99 {pct(multi.hop, 0.99):6.2f} ms\n"
        f"  router CPU / request      {1000 * multi.bbr_cpu / multi.requests:6.3f} ms"
        f"  (policy step + picker: {1000 * multi.picker_cpu / multi.requests:6.3f} ms;"
        f" single arm {1000 * single.picker_cpu / single.requests:6.3f} ms)"
    )
    print(f"  mean               single {statistics.fmean(single.whole) * 1000:.2f} ms,"
          f" multi {statistics.fmean(multi.whole) * 1000:.2f} ms")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())

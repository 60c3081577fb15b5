"""How the operator scales: N PromptCacheDeployments on the local control plane, against a
bare server-side-apply loop over the same manifests, measured in the same run.

Each side gets a fresh control plane of its own (kwok nodes, every Deployment's pods
played by kwok), so neither pays for the other's objects and garbage collection:

- **the baseline**: a process that server-side-applies the rendered children of every
  resource (owner references and hash as the operator writes them) with the operator's
  concurrency and client code, and nothing else: no reads, no status, no checks. Three
  passes: create; the same after a spec change of every resource; and the unchanged
  manifests again (a bare loop's restart has no memory: it applies everything).
- **the operator**: `promptcache run` as a process. Created resources are timed until
  every status shows `observedGeneration == generation` and `Degraded=False`; then, once
  the pods are ready and the operator idle, a steady-state window of two resync periods
  (API requests per resource per minute, counted by the API server's own
  `apiserver_request_total` and by the operator's client; writes; CPU; pod scrapes from a
  stand-in engine that serves every model-server pod's loopback IP); then a spec change
  of every resource (timed as creation); then a restart (SIGTERM, a new process, timed
  until it has reconciled every resource). Peak RSS is VmHWM of each operator process.

    python -m bench.operator_scale --resources 200     # one size; appends to the results
    python -m bench.operator_scale --plot              # the figures against the count

Results accumulate in `docs/img/operator-scale.json` (one record per size, the newest
wins) and the plot is `docs/img/operator-scale.png`.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import math
import os
import resource as rlimit
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from harness.net import free_port
from harness.operator import (
    CHILD_RESOURCES,
    OperatorProcess,
    apiserver_writes,
    install_crd,
    metric_sum,
    parse_prometheus,
    resource,
)
from harness.pytest_cluster import Cluster, start_local_cluster, stop_cluster
from promptcache.api import parse_resource
from promptcache.controller.cache import Informer
from promptcache.controller.children import owned
from promptcache.controller.errors import ApiUnreachableError
from promptcache.controller.kube import Kube, by_kind, load_config
from promptcache.controller.reconcile import DEFAULT_MAX_CONCURRENT
from promptcache.render import render

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "img" / "operator-scale.json"
PLOT = ROOT / "docs" / "img" / "operator-scale.png"
PCD = by_kind("PromptCacheDeployment")
POD = by_kind("Pod")
PODS_PER_NODE = 240
"""A node's /24 podCIDR holds 254 pods; each resource runs two (model server, picker)."""
NODE_CPUS = 256
"""CPU a fake node offers: each resource's pods request ~1.1 CPU (front and picker), so
64-CPU nodes would mean dozens of nodes (and their heartbeats) at 2,000 resources."""
READ_VERBS = ("GET", "LIST")
COUNTED = (*CHILD_RESOURCES, "pods", "nodes", "gateways")
"""What the operator reads (watches left out: one long request each)."""


def spec_of(i: int, ns: str, round_: int) -> dict[str, Any]:
    """Resource i: one model-server replica (a kwok pod the stand-in answers for); the
    spec change of round 2 is an engine env var, which rolls the model server out."""
    env = [{"name": "BENCH_ROUND", "value": str(round_)}] if round_ > 1 else []
    return resource(f"r{i:04d}", ns, model={"replicas": 1, "resources": {"gpus": 0}},
                    engine={"env": env})  # fmt: skip


# ---------------------------------------------------------------------------- the baseline


def manifests(ns: str, n: int, round_: int, every: int = 1) -> list[dict[str, Any]]:
    owner = {"metadata": {"name": "none", "uid": "00000000-0000-0000-0000-000000000000"}}
    out = []
    for i in range(0, n, every):
        for m in render(parse_resource(spec_of(i, ns, round_))):
            child = owned(m, owner)
            child["metadata"].pop("ownerReferences")  # no owner exists: GC would delete them
            out.append(child)
    return out


async def patiently(call: Callable[[], Awaitable[Any]]) -> None:
    """`call()`, again after a request timeout (the operator retries those too): on a busy
    machine the API server can take longer than the client's 15 s."""
    for _ in range(5):
        try:
            await call()
            return
        except ApiUnreachableError:
            await asyncio.sleep(1)
    await call()


async def in_parallel(
    docs: Iterable[dict[str, Any]],
    send: Callable[[dict[str, Any]], Awaitable[Any]],
    concurrency: int,
) -> float:
    """`send` every document with `concurrency` workers; the seconds it took."""
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for doc in docs:
        queue.put_nowait(doc)

    async def worker() -> None:
        while not queue.empty():
            await patiently(partial(send, queue.get_nowait()))

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.monotonic() - started


async def _baseline(ns: str, n: int, concurrency: int, every: int) -> dict[str, Any]:
    """Three passes over every `every`-th resource, times scaled by `every`: on this
    machine the API server creates ~30 objects a second with the fleet's pods churning, so
    full passes at 2,000 resources take most of an hour. The per-resource cost measured on
    a smaller fleet is if anything lower, which makes the ratio conservative."""
    kube = Kube(load_config())
    first, second = manifests(ns, n, 1, every), manifests(ns, n, 2, every)
    out = {
        "create_s": every * await in_parallel(first, kube.apply, concurrency),
        "change_s": every * await in_parallel(second, kube.apply, concurrency),
        "restart_s": every * await in_parallel(second, kube.apply, concurrency),
        "sampled_every": every,
        "client_writes": every * kube.counter.writes,
    }
    await kube.close()
    return out


def baseline_child(ns: str, n: int, concurrency: int, every: int) -> None:
    result = asyncio.run(_baseline(ns, n, concurrency, every))
    result["peak_rss_mib"] = rlimit.getrusage(rlimit.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


# ---------------------------------------------------------------------------- measurements


def apiserver_requests(cluster: Cluster) -> dict[str, float]:
    """Reads of everything the operator reads, and writes of what it writes (its children,
    Secrets, resources and their status: `apiserver_writes`), as the API server counts
    them. Pods' and children's status writes (kwok, the controller-manager) and Events
    are left out: the server's counter cannot tell clients apart."""
    samples = parse_prometheus(cluster.kubectl("get", "--raw", "/metrics").stdout)
    reads = metric_sum(samples, "apiserver_request_total", verb=READ_VERBS, resource=COUNTED)
    return {"reads": reads, "writes": apiserver_writes(cluster.kubectl)}


def proc_stat(pid: int) -> tuple[float, float]:
    """(CPU seconds used, peak RSS MiB) of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    hwm = next(
        int(line.split()[1]) / 1024
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmHWM:")
    )
    return cpu, hwm


class Fleet:
    """The bench's own view of the resources: a watch, so waiting costs the API server
    nothing per poll (a `kubectl get` of 2,000 resources every half second would)."""

    def __init__(self, kube: Kube, ns: str) -> None:
        self.changes = 0
        self.informer = Informer(kube, PCD, (ns,), on_change=self._changed)
        self.task = asyncio.create_task(self.informer.run())

    def _changed(self, _: str, __: Any) -> None:
        self.changes += 1

    def count(self, ok: Callable[[dict[str, Any]], bool]) -> int:
        return sum(1 for item in self.informer.items() if ok(item))

    async def wait(self, ok: Callable[[dict[str, Any]], bool], n: int, what: str,
                   limit_s: float, op: OperatorProcess) -> float:  # fmt: skip
        started, seen = time.monotonic(), -1
        while True:
            # Decoding 2,000 bodies costs ~60 ms of the CPU the operator is measured on:
            # count again only after a change, at most twice a second.
            if seen != self.changes:
                seen = self.changes
                if self.count(ok) >= n:
                    break
            if op.exited():
                raise SystemExit(f"operator exited while waiting for {what}:\n{op.log_tail()}")
            if time.monotonic() - started > limit_s:
                raise SystemExit(f"{what}: {self.count(ok)}/{n} after {limit_s}s\n{op.log_tail()}")
            await asyncio.sleep(0.5)
        return time.monotonic() - started

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


def _condition(item: dict[str, Any], type_: str) -> str | None:
    for cond in (item.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return str(cond.get("status"))
    return None


def _delta(
    before: dict[tuple[str, frozenset[tuple[str, str]]], float],
    after: dict[tuple[str, frozenset[tuple[str, str]]], float],
) -> dict[str, float]:
    """Reconciles by trigger and writes by resource between two scrapes of the operator."""
    out: dict[str, float] = {}
    for (name, labels), value in after.items():
        label = dict(labels)
        if name == "promptcache_reconciles_total":
            key = f"reconciles/{label['trigger']}/{label['result']}"
        elif name == "promptcache_api_writes_total":
            key = f"writes/{label['resource']}"
        else:
            continue
        out[key] = out.get(key, 0.0) + value - before.get((name, labels), 0.0)
    return {k: v for k, v in out.items() if v}


def reconciled(item: dict[str, Any]) -> bool:
    st = item.get("status") or {}
    return (st.get("observedGeneration") == item["metadata"]["generation"]
            and _condition(item, "Degraded") == "False")  # fmt: skip


def ready(item: dict[str, Any]) -> bool:
    return reconciled(item) and _condition(item, "Ready") == "True"


async def settle(op: OperatorProcess, period_s: float, limit_s: float) -> None:
    """Until the operator has written nothing for one resync period and a second."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        before = op.writes()
        await asyncio.sleep(period_s + 1)
        if op.writes() == before:
            return
    raise SystemExit(f"the operator never settled:\n{op.log_tail()}")


@dataclass
class Steady:
    window_s: float
    resyncs: float
    apiserver_reads: float
    apiserver_writes: float
    client_requests: float
    client_writes: float
    cpu_s: float
    scrapes: float
    scrape_seconds: float
    failed_scrapes: float


async def steady_window(
    cluster: Cluster, op: OperatorProcess, window_s: float
) -> Steady:  # fmt: skip
    assert op.proc is not None
    server0, cpu0 = apiserver_requests(cluster), proc_stat(op.proc.pid)[0]
    m0 = op.metrics()
    started = time.monotonic()
    await asyncio.sleep(window_s)
    elapsed = time.monotonic() - started
    server1, cpu1 = apiserver_requests(cluster), proc_stat(op.proc.pid)[0]
    m1 = op.metrics()

    def delta(name: str, **match: str | Iterable[str]) -> float:
        return metric_sum(m1, name, **match) - metric_sum(m0, name, **match)

    return Steady(
        window_s=elapsed,
        resyncs=delta("promptcache_reconciles_total", trigger="resync"),
        apiserver_reads=server1["reads"] - server0["reads"],
        apiserver_writes=server1["writes"] - server0["writes"],
        client_requests=delta("promptcache_api_requests_total"),
        client_writes=delta("promptcache_api_requests_total", verb=("POST", "PUT", "PATCH",
                                                                       "DELETE")),
        cpu_s=cpu1 - cpu0,
        scrapes=delta("promptcache_pod_scrapes_total", result="ok"),
        scrape_seconds=delta("promptcache_scrape_duration_seconds_sum"),
        failed_scrapes=delta("promptcache_pod_scrapes_total", result="failed"),
    )  # fmt: skip


@dataclass
class Record:
    resources: int
    resync_s: float
    concurrency: int
    baseline: dict[str, Any]
    create_s: float = 0.0
    change_s: float = 0.0
    restart_s: float = 0.0
    change_sent_s: float = 0.0
    """How long the bench took to send the n spec changes (part of change_s)."""
    change_counts: dict[str, float] = field(default_factory=dict)
    """What the operator did during the change: reconciles by trigger, writes by resource."""
    create_writes: float = 0.0
    create_writes_by_resource: dict[str, float] = field(default_factory=dict)
    """The operator's own count (its client), by plural[/subresource]."""
    restart_writes: float = 0.0
    ready_s: float = 0.0
    steady: dict[str, Any] = field(default_factory=dict)
    peak_rss_mib: float = 0.0
    restart_peak_rss_mib: float = 0.0
    cache_bytes: float = 0.0
    load: list[float] = field(default_factory=list)
    when: str = ""


def operator_args(ns: str, resync_s: float, scrape_port: int) -> list[str]:
    return ["-n", ns, "--no-leader-election", "--resync-seconds", str(resync_s),
            "--scrape-port", str(scrape_port), "--log-level", "WARNING"]  # fmt: skip


async def measure_operator(cluster: Cluster, rec: Record, scrape_port: int) -> None:
    n, ns = rec.resources, cluster.create_namespace("op")
    log = Path(cluster.dir or ".") / "bench-operator.log"
    op = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=log,
                         args=operator_args(ns, rec.resync_s, scrape_port)).start()  # fmt: skip
    assert op.proc is not None
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    kube = Kube(load_config())
    fleet = Fleet(kube, ns)
    try:
        print(f"  creating {n} resources ...", flush=True)
        server0 = apiserver_requests(cluster)
        started = time.monotonic()
        await in_parallel((spec_of(i, ns, 1) for i in range(n)), kube.create, rec.concurrency)
        await fleet.wait(reconciled, n, "resources reconciled", 3600, op)
        rec.create_s = time.monotonic() - started
        rec.create_writes = apiserver_requests(cluster)["writes"] - server0["writes"] - n
        rec.create_writes_by_resource = {
            dict(labels)["resource"]: value
            for (name, labels), value in op.metrics().items()
            if name == "promptcache_api_writes_total"
        }
        print(f"  reconciled in {rec.create_s:.1f}s; waiting for ready pods", flush=True)
        rec.ready_s = rec.create_s + await fleet.wait(ready, n, "pods ready", 3600, op)
        await settle(op, rec.resync_s, 1800)

        print(f"  steady state for {2 * rec.resync_s + 5:.0f}s ...", flush=True)
        steady = await steady_window(cluster, op, 2 * rec.resync_s + 5)
        rec.steady = asdict(steady)
        samples = op.metrics()
        rec.cache_bytes = metric_sum(samples, "promptcache_cache_bytes")

        print("  changing every resource ...", flush=True)
        before = op.metrics()
        started = time.monotonic()
        await in_parallel(
            (spec_of(i, ns, 2) for i in range(n)),
            partial(kube.apply, manager="bench"),
            rec.concurrency,
        )
        rec.change_sent_s = time.monotonic() - started
        await fleet.wait(
            lambda i: reconciled(i) and i["metadata"]["generation"] >= 2, n, "changes", 3600, op
        )
        rec.change_s = time.monotonic() - started
        rec.change_counts = _delta(before, op.metrics())
        await fleet.wait(ready, n, "pods ready after the change", 3600, op)
        await settle(op, rec.resync_s, 1800)
        rec.peak_rss_mib = proc_stat(op.proc.pid)[1]
        op.stop()

        print("  restarting the operator ...", flush=True)
        server0 = apiserver_requests(cluster)
        started = time.monotonic()
        op = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=log,
                             args=operator_args(ns, rec.resync_s, scrape_port)).start()  # fmt: skip
        assert op.proc is not None
        while op.counter("promptcache_reconciles_total") < n:
            if op.exited() or time.monotonic() - started > 1800:
                raise SystemExit(f"restart never reconciled {n}:\n{op.log_tail()}")
            await asyncio.sleep(0.2)
        rec.restart_s = time.monotonic() - started
        rec.restart_writes = apiserver_requests(cluster)["writes"] - server0["writes"]
        rec.restart_peak_rss_mib = proc_stat(op.proc.pid)[1]
    finally:
        op.stop()
        await fleet.close()
        await kube.close()


def start_standin(port: int) -> subprocess.Popen[bytes]:
    """One stand-in engine on every loopback address: kwok gives pods 127.x IPs, and all of
    127/8 reaches a socket bound to 0.0.0.0, so it answers every pod's scrape."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.standin", str(port), "--host", "0.0.0.0"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.readline()  # its URL: it is listening
    return proc


def _cpu(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def pod_needs(round_: int = 1) -> tuple[float, int]:
    """(CPU requested, pods) per resource, a rollout's surge pod included: the fake nodes
    must schedule them all."""
    cpu, pods = 0.0, 0
    for m in render(parse_resource(spec_of(0, "ns", round_))):
        if m["kind"] != "Deployment":
            continue
        spec = m["spec"]["template"]["spec"]
        per_pod = sum(_cpu(str(((c.get("resources") or {}).get("requests") or {}).get("cpu", "0")))
                      for c in spec["containers"])  # fmt: skip
        count = int(m["spec"].get("replicas", 1)) + 1  # + the surge pod of a rollout
        cpu, pods = cpu + per_pod * count, pods + count
    return cpu, pods


def cluster_for(n: int, label: str) -> Cluster:
    cpu, pods = pod_needs()
    nodes = max(2, math.ceil(n * cpu / NODE_CPUS), math.ceil(n * pods / PODS_PER_NODE))
    return start_local_cluster(gateway_crds=True, name=f"bench-{label}-{int(time.time())}",
                               nodes=nodes, pods_per_node=PODS_PER_NODE,
                               cpus_per_node=NODE_CPUS)  # fmt: skip


NO_BASELINE = {k: math.nan for k in ("create_s", "change_s", "restart_s", "client_writes",
                                      "peak_rss_mib")}  # fmt: skip
"""--no-baseline: the operator alone (a functional run, never stored)."""


def measure_baseline(n: int, concurrency: int, every: int) -> dict[str, Any]:
    print(f"baseline: a local control plane for {n} resources ...", flush=True)
    cluster = cluster_for(n // every, "base")
    try:
        install_crd(cluster.kubectl)
        ns = cluster.create_namespace("base")
        proc = subprocess.run(
            [sys.executable, "-m", "bench.operator_scale", "--baseline-child", ns, str(n),
             str(concurrency), str(every)],
            capture_output=True, text=True, check=False, env=cluster.env, cwd=ROOT,
        )  # fmt: skip
        if proc.returncode != 0:
            raise SystemExit(f"baseline failed:\n{proc.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"  {result}", flush=True)
        return result
    finally:
        stop_cluster(cluster)


def run(n: int, resync_s: float, concurrency: int, every: int, baseline: bool = True) -> Record:
    when = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())
    rec = Record(resources=n, resync_s=resync_s, concurrency=concurrency, baseline={},
                 load=list(os.getloadavg()), when=when)  # fmt: skip
    rec.baseline = measure_baseline(n, concurrency, every) if baseline else dict(NO_BASELINE)
    print(f"operator: a local control plane for {n} resources ...", flush=True)
    cluster = cluster_for(n, "op")
    port = free_port()
    standin = start_standin(port)
    try:
        install_crd(cluster.kubectl)
        asyncio.run(measure_operator(cluster, rec, port))
    finally:
        standin.terminate()
        standin.wait(timeout=10)
        stop_cluster(cluster)
    rec.load += list(os.getloadavg())
    return rec


# ---------------------------------------------------------------------------- report, plot


def per_resource_minute(rec: dict[str, Any], key: str) -> float:
    st = rec["steady"]
    return float(st[key]) / float(rec["resources"]) / (float(st["window_s"]) / 60)


def report(rec: dict[str, Any]) -> None:
    n, base, st = rec["resources"], rec["baseline"], rec["steady"]
    print(f"\nresources: {n} (resync every {rec['resync_s']:g}s, concurrency {rec['concurrency']})")
    print(f"{'':34}{'operator':>10}{'baseline':>10}{'ratio':>8}")
    for label, key in (("converge after creation (s)", "create"),
                       ("converge after a spec change (s)", "change"),
                       ("converge after a restart (s)", "restart")):  # fmt: skip
        op, b = rec[f"{key}_s"], base[f"{key}_s"]
        print(f"{label:34}{op:10.1f}{b:10.1f}{op / b:8.2f}")
    print(f"{'peak RSS (MiB)':34}{max(rec['peak_rss_mib'], rec['restart_peak_rss_mib']):10.1f}"
          f"{base['peak_rss_mib']:10.1f}")  # fmt: skip
    print(
        f"writes per resource on creation: {rec['create_writes'] / n:.1f} (baseline "
        f"{base['client_writes'] / 3 / n:.1f}); on restart: {rec['restart_writes'] / n:.2f}"
    )
    print(
        f"  the change: sent in {rec.get('change_sent_s', 0):.1f}s;",
        ", ".join(f"{k} {v:.0f}" for k, v in sorted((rec.get("change_counts") or {}).items())),
    )
    by = rec.get("create_writes_by_resource") or {}
    ranked = sorted(by.items(), key=lambda kv: -kv[1])
    print("  the operator's own, by resource:", ", ".join(f"{k} {v / n:.1f}" for k, v in ranked))
    print(f"steady state over {st['window_s']:.0f}s ({st['resyncs']:.0f} resyncs): "
          f"API requests/resource/min {per_resource_minute(rec, 'apiserver_reads'):.3f} reads + "
          f"{per_resource_minute(rec, 'apiserver_writes'):.3f} writes at the API server; "
          f"{per_resource_minute(rec, 'client_requests'):.3f} from the operator's client "
          f"({st['client_writes']:.0f} writes)")  # fmt: skip
    scrapes = st["scrapes"] or 1
    print(f"scrapes/resource/min {per_resource_minute(rec, 'scrapes'):.2f} "
          f"({st['failed_scrapes']:.0f} failed), {1000 * st['scrape_seconds'] / scrapes:.2f} ms "
          f"each; operator CPU {1000 * per_resource_minute(rec, 'cpu_s'):.2f} ms/resource/min; "
          f"informers hold {rec['cache_bytes'] / 2**20:.1f} MiB")  # fmt: skip
    every = int(base.get("sampled_every") or 1)
    if every > 1:
        print(f"(the bare loop ran over every {every}th resource, its times x{every})")
    print(f"load average before / after: {rec['load']}")


def markdown(results: list[dict[str, Any]]) -> str:
    """The docs' table (docs/operator.md#at-scale), from the stored results."""
    rows = [
        "| resources | converge after creation, op / loop | after a spec change | after a "
        "restart | API requests / resource / min (server; client) | idle writes | peak RSS "
        "op / loop | scrapes / resource / min, ms each | operator CPU ms / resource / min "
        "| load before → after |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        b, st = r["baseline"], r["steady"]
        every = int(b.get("sampled_every") or 1)
        cells = [f"{r['resources']:,}" + (f" (loop on 1 in {every})" if every > 1 else "")]
        for key in ("create", "change", "restart"):
            cells.append(f"{r[f'{key}_s']:.0f} s / {b[f'{key}_s']:.0f} s = "
                         f"**{r[f'{key}_s'] / b[f'{key}_s']:.2f}**")  # fmt: skip
        server = per_resource_minute(r, "apiserver_reads") + per_resource_minute(
            r, "apiserver_writes"
        )
        cells.append(f"{server:.3f}; {per_resource_minute(r, 'client_requests'):.3f}")
        cells.append(f"{st['apiserver_writes']:.0f} / {st['client_writes']:.0f}")
        rss = max(r["peak_rss_mib"], r["restart_peak_rss_mib"])
        cells.append(f"{rss:.0f} / {b['peak_rss_mib']:.0f} MiB")
        each = 1000 * st["scrape_seconds"] / max(1.0, st["scrapes"])
        cells.append(f"{per_resource_minute(r, 'scrapes'):.2f}, {each:.1f} ms")
        cells.append(f"{1000 * per_resource_minute(r, 'cpu_s'):.1f}")
        load = r["load"]
        cells.append(f"{load[0]:.1f} → {load[3]:.1f}" if len(load) > 3 else "")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def load_results() -> list[dict[str, Any]]:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else []


def save(rec: Record) -> None:
    results = [r for r in load_results() if r["resources"] != rec.resources]
    results.append(asdict(rec))
    results.sort(key=lambda r: r["resources"])
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")


def rebaseline(n: int, concurrency: int, every: int) -> None:
    """Measure the bare loop again and put it in the stored record of `n` resources.

    A sampled loop (`--sample-baseline K`) runs on a cluster that holds a K-th of the
    objects, so its API server, scheduler and controllers have a K-th of the work: its
    times, scaled by K, flatter the loop. This replaces it with a full one, in a run of its
    own, without running the operator again."""
    results = load_results()
    stored = [r for r in results if r["resources"] == n]
    if not stored:
        raise SystemExit(f"no stored record for {n} resources in {RESULTS}: run it first")
    stored[0]["baseline"] = measure_baseline(n, concurrency, every)
    stored[0]["baseline_load"] = list(os.getloadavg())
    stored[0]["baseline_when"] = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")


def plot(results: list[dict[str, Any]]) -> Path:
    import matplotlib  # noqa: PLC0415 - only for --plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    ns = [r["resources"] for r in results]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    ax = axes[0][0]
    for key, style in (("create", "o-"), ("change", "s-"), ("restart", "^-")):
        ax.plot(ns, [r[f"{key}_s"] / r["baseline"][f"{key}_s"] for r in results], style,
                label=f"after {key}")  # fmt: skip
    ax.axhline(2, color="red", ls="--", label="goal ≤ 2")
    ax.set(title="time to converge / bare SSA loop", xlabel="resources", ylabel="ratio")
    ax.legend()
    ax = axes[0][1]
    for (key, style), color in zip(
        (("create", "o-"), ("change", "s-"), ("restart", "^-")), ("C0", "C1", "C2"), strict=True
    ):
        ax.plot(ns, [r[f"{key}_s"] for r in results], style, color=color,
                label=f"operator, {key}")  # fmt: skip
        ax.plot(ns, [r["baseline"][f"{key}_s"] for r in results], style.replace("-", "--"),
                color=color, alpha=0.5, label=f"bare loop, {key}")  # fmt: skip
    ax.set(title="time to converge", xlabel="resources", ylabel="seconds")
    ax.legend(fontsize=7)
    ax = axes[0][2]
    ax.plot(ns, [per_resource_minute(r, "apiserver_reads") + per_resource_minute(
        r, "apiserver_writes") for r in results], "o-", label="at the API server")  # fmt: skip
    ax.plot(ns, [per_resource_minute(r, "client_requests") for r in results], "s--",
            label="from the operator's client")  # fmt: skip
    ax.set(title="steady-state API requests", xlabel="resources",
           ylabel="requests / resource / minute")  # fmt: skip
    ax.set_ylim(bottom=0)
    ax.legend()
    ax = axes[1][0]
    ax.plot(ns, [r["steady"]["apiserver_writes"] for r in results], "o-", label="API server")
    ax.plot(ns, [r["steady"]["client_writes"] for r in results], "s--", label="client")
    ax.set(title="writes on idle resyncs (goal 0)", xlabel="resources", ylabel="writes")
    top = max(r["steady"]["apiserver_writes"] for r in results)
    ax.set_ylim(-0.5, max(1.0, top) + 0.5)
    ax.legend()
    ax = axes[1][1]
    ax.plot(ns, [max(r["peak_rss_mib"], r["restart_peak_rss_mib"]) for r in results], "o-",
            label="operator")  # fmt: skip
    ax.plot(ns, [r["baseline"]["peak_rss_mib"] for r in results], "s--", label="bare loop")
    ax.axhline(1024, color="red", ls="--", label="goal < 1 GiB")
    ax.set(title="peak RSS", xlabel="resources", ylabel="MiB")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax = axes[1][2]
    ax.plot(ns, [1000 * per_resource_minute(r, "cpu_s") for r in results], "o-",
            label="operator CPU, ms / resource / min")  # fmt: skip
    ax.plot(ns, [1000 * r["steady"]["scrape_seconds"] / max(1, r["steady"]["scrapes"])
                 for r in results], "s--", label="one resource's scrape, ms wall")  # fmt: skip
    ax.plot(ns, [per_resource_minute(r, "scrapes") for r in results], "^:",
            label="scrapes / resource / min")  # fmt: skip
    ax.set(title="status: scraping the pods' metrics", xlabel="resources")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.suptitle("promptcache operator at scale: local control plane (kwok pods), 2 cores")
    fig.tight_layout()
    fig.savefig(PLOT, dpi=90)
    return PLOT


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resources", type=int, default=30)
    parser.add_argument("--resync-seconds", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=DEFAULT_MAX_CONCURRENT)
    parser.add_argument("--plot", action="store_true", help="plot the stored results, run nothing")
    parser.add_argument("--no-save", action="store_true", help="do not store the results")
    parser.add_argument("--no-baseline", action="store_true",
                        help="the operator alone (implies --no-save)")  # fmt: skip
    parser.add_argument(
        "--sample-baseline", type=int, default=1, metavar="K",
        help="the bare loop over every K-th resource, its times and writes scaled by K",
    )  # fmt: skip
    parser.add_argument(
        "--baseline-only", action="store_true",
        help="measure the bare loop again for --resources and store it in that size's record "
        "(a full loop where the stored one was sampled)",
    )  # fmt: skip
    parser.add_argument("--baseline-child", nargs=4, metavar=("NS", "N", "C", "K"),
                        help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: where it waits
    if args.baseline_child:
        ns, n, c, k = args.baseline_child
        baseline_child(ns, int(n), int(c), int(k))
        return 0
    if args.baseline_only:
        rebaseline(args.resources, args.concurrency, args.sample_baseline)
    elif not args.plot:
        rec = run(args.resources, args.resync_seconds, args.concurrency, args.sample_baseline,
                  baseline=not args.no_baseline)  # fmt: skip
        report(asdict(rec))
        if args.no_save or args.no_baseline:
            return 0
        save(rec)
    results = load_results()
    for r in results if args.plot else []:
        report(r)
    if args.plot and results:
        print(markdown(results))
    if results:
        print(f"plot: {plot(results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

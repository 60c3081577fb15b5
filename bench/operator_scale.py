"""How the operator scales: N PromptCacheDeployments on a fresh local control plane.

Measures, for the operator and for a baseline measured in the same run:
- wall time until every resource is reconciled (children applied and status written
  with observedGeneration == generation; the baseline: every rendered child applied);
- API write requests per resource (counted by the API server, apiserver_request_total);
- peak RSS of the process doing the work;
- and for the operator, writes during an idle resync window (the goal is zero).

The baseline is a tight loop in its own process that server-side-applies the very same
rendered children (owner references and hash included) one after another, with the same
client code, and nothing else: no status, no checks, no reads.

    python -m bench.operator_scale            # 30 resources (about a minute and a half)
    python -m bench.operator_scale --full     # 200 resources, the issue's size
Model replicas are 0 so kwok does not have to play hundreds of pods on a 2-core box;
every Endpoint Picker Deployment still gets its pod.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource as rlimit
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from harness.operator import (
    CHILD_RESOURCES,
    OperatorProcess,
    apiserver_writes,
    install_crd,
    resource,
    wait_for,
)
from harness.pytest_cluster import start_local_cluster, stop_cluster
from promptcache.api import parse_resource
from promptcache.controller.children import owned
from promptcache.controller.kube import Kube, load_config
from promptcache.render import render

ROOT = Path(__file__).resolve().parents[1]

# The operator's kinds, as the tests count them (events left out: the scheduler and kwok
# post them for every pod).
WRITE_RESOURCES = CHILD_RESOURCES


def spec_of(i: int, ns: str) -> dict[str, Any]:
    return resource(f"r{i:04d}", ns, model={"replicas": 0, "resources": {"gpus": 0}})


async def _baseline(ns: str, n: int) -> dict[str, Any]:
    kube = Kube(load_config())
    owner = {"metadata": {"name": "none", "uid": "00000000-0000-0000-0000-000000000000"}}
    manifests = []
    for i in range(n):
        for m in render(parse_resource(spec_of(i, ns))):
            child = owned(m, owner)
            child["metadata"].pop("ownerReferences")  # no owner exists: GC would delete them
            manifests.append(child)
    started = time.monotonic()
    for manifest in manifests:
        await kube.apply(manifest)
    elapsed = time.monotonic() - started
    await kube.close()
    return {"seconds": elapsed, "client_writes": kube.counter.writes}


def baseline_child(ns: str, n: int) -> None:
    result = asyncio.run(_baseline(ns, n))
    result["peak_rss_mib"] = rlimit.getrusage(rlimit.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resources", type=int, default=30)
    parser.add_argument(
        "--full", action="store_true",
        help="200 resources (the issue's size)",
    )  # fmt: skip
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="resync period")
    parser.add_argument("--baseline-child", nargs=2, metavar=("NS", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline_child:
        baseline_child(args.baseline_child[0], int(args.baseline_child[1]))
        return 0
    n = 200 if args.full else args.resources
    print(f"starting a local control plane for {n} resources ...", flush=True)
    cluster = start_local_cluster(gateway_crds=True, name=f"bench-{int(time.time())}")
    try:
        install_crd(cluster.kubectl)
        base_ns, op_ns = cluster.create_namespace("base"), cluster.create_namespace("op")

        before = apiserver_writes(cluster.kubectl, WRITE_RESOURCES)
        proc = subprocess.run(
            [sys.executable, "-m", "bench.operator_scale", "--baseline-child", base_ns, str(n)],
            capture_output=True, text=True, check=False, env=cluster.env, cwd=ROOT,
        )  # fmt: skip
        if proc.returncode != 0:
            raise SystemExit(f"baseline failed:\n{proc.stderr[-3000:]}")
        base = json.loads(proc.stdout.strip().splitlines()[-1])
        base["writes"] = apiserver_writes(cluster.kubectl, WRITE_RESOURCES) - before
        # Free the baseline's Service IPs: the local control plane's service range is a /24.
        cluster.kubectl("delete", "namespace", base_ns, "--wait=true", "--timeout=600s",
                        timeout=660)  # fmt: skip

        log = Path(cluster.dir or ".") / "bench-operator.log"
        op = OperatorProcess(
            kubeconfig=cluster.kubeconfig, log_path=log,
            args=["-n", op_ns, "--no-leader-election",
                  "--resync-seconds", str(args.idle_seconds), "--log-level", "WARNING"],
        ).start()  # fmt: skip
        assert op.proc is not None
        before = apiserver_writes(cluster.kubectl, WRITE_RESOURCES)
        docs = {"apiVersion": "v1", "kind": "List", "items": [spec_of(i, op_ns) for i in range(n)]}
        started = time.monotonic()
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(docs), timeout=600)

        def reconciled() -> bool:
            items = json.loads(cluster.kubectl("get", "pcd", "-n", op_ns, "-o", "json").stdout)
            done = 0
            for item in items["items"]:
                st = item.get("status") or {}
                degraded = [c for c in st.get("conditions") or [] if c["type"] == "Degraded"]
                if (st.get("observedGeneration") == item["metadata"]["generation"]
                        and degraded and degraded[0]["status"] == "False"):  # fmt: skip
                    done += 1
            return done == n

        wait_for(reconciled, f"{n} resources reconciled\n{op.log_tail()}", timeout=1800, every=0.5)
        op_seconds = time.monotonic() - started
        # Writes caused by the operator: everything minus the bench's own n creates.
        op_writes = apiserver_writes(cluster.kubectl, WRITE_RESOURCES) - before - n

        # Idle: once pods are ready and the operator has written nothing for a full resync
        # period (the rollout has settled), two more periods must write nothing.
        def settled() -> bool:
            before = op.writes()
            time.sleep(args.idle_seconds + 1)  # one resync period: the observation itself
            return op.writes() == before

        wait_for(settled, "the rollout to settle", timeout=900, every=0)
        idle_before = apiserver_writes(cluster.kubectl, WRITE_RESOURCES)
        client_before = op.writes()
        writes_before = {
            dict(labels)["resource"]: value
            for (name, labels), value in op.metrics().items()
            if name == "promptcache_api_writes_total"
        }
        resyncs = op.counter("promptcache_reconciles_total", trigger="resync")
        time.sleep(2 * args.idle_seconds + 2)
        idle_resyncs = op.counter("promptcache_reconciles_total", trigger="resync") - resyncs
        idle_client = op.writes() - client_before
        idle_by_resource = {
            dict(labels)["resource"]: value
            for (name, labels), value in op.metrics().items()
            if name == "promptcache_api_writes_total"
        }
        idle_server = apiserver_writes(cluster.kubectl, WRITE_RESOURCES) - idle_before
        rss = peak_rss_mib(op.proc.pid)
        op.stop()
    finally:
        stop_cluster(cluster)

    print(f"\nresources: {n}")
    print(f"{'':28}{'operator':>12}{'baseline':>12}{'ratio':>8}")
    print(
        f"{'time to reconciled (s)':28}{op_seconds:12.1f}{base['seconds']:12.1f}"
        f"{op_seconds / base['seconds']:8.2f}"
    )
    print(
        f"{'API writes per resource':28}{op_writes / n:12.1f}{base['writes'] / n:12.1f}"
        f"{(op_writes / n) / (base['writes'] / n):8.2f}"
    )
    print(
        f"{'peak RSS (MiB)':28}{rss:12.1f}{base['peak_rss_mib']:12.1f}"
        f"{rss / base['peak_rss_mib']:8.2f}"
    )
    print(
        f"idle window: {idle_resyncs:.0f} resyncs, {idle_server:.0f} writes at the API server, "
        f"{idle_client:.0f} from the operator's client",
        {k: v - writes_before.get(k, 0) for k, v in idle_by_resource.items()
         if v != writes_before.get(k, 0)},
    )  # fmt: skip
    print("goals: time ratio <= 2, zero idle writes, RSS < 200 MiB:",
          "met" if op_seconds <= 2 * base["seconds"] and idle_server == 0 and rss < 200
          else "NOT met")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a poller's read of the API server costs: a kubectl each time, or the in-process client.

The tests' pollers read the API server several times a second: the harness's kubelet lists
its pods every 0.5 s for a module's whole life, and waits read a resource's status. They
did it with a `kubectl get -o json` each time; they now use `Cluster.pods_json` and
`Cluster.pcd_json` (one kept-alive connection of the official Python client). This bench
makes the same two reads both ways against a real local control plane (the one
`e2e/cluster` builds) and prints, per read, the wall time and the CPU it cost the machine:
the reading process with its children (each kubectl) and the API server (each kubectl is
a new TLS handshake there).

The arms take turns, in rotated order each round; the ratio is the in-process read's
against kubectl's in the same run, so a busy machine shifts both.

    python -m bench.cluster_reads [--reads 40] [--rounds 3]

Needs the control plane's binaries (`python e2e/cluster build`, which `scripts/test` runs).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.cpu import tree_cpu_seconds
from harness.operator import apply_yaml, get_json, install_crd
from harness.operator import resource as pcd_resource
from harness.pytest_cluster import Cluster, start_local_cluster, stop_cluster

SELECTOR = "app=bench-reads"
NAME = "reads"


def _apiserver_pid(cluster: Cluster) -> int:
    """The kube-apiserver of this cluster: the one whose command line names its directory."""
    assert cluster.dir is not None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            argv
            and argv[0].endswith(b"kube-apiserver")
            and str(cluster.dir).encode() in b"".join(argv)
        ):
            return int(entry.name)
    raise RuntimeError(f"no kube-apiserver of {cluster.dir} found")


def _own_cpu_s() -> float:
    """CPU seconds of this process and of the children it has waited for (each kubectl)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@dataclass
class Arm:
    name: str
    read: Callable[[], Any]
    wall_s: list[float] = field(default_factory=list)
    client_cpu_s: list[float] = field(default_factory=list)
    server_cpu_s: list[float] = field(default_factory=list)

    def measure(self, reads: int, apiserver: int) -> None:
        wall0, cpu0, srv0 = time.monotonic(), _own_cpu_s(), tree_cpu_seconds(apiserver)
        for _ in range(reads):
            assert self.read() is not None, f"{self.name}: a read failed"
        self.wall_s.append((time.monotonic() - wall0) / reads)
        self.client_cpu_s.append((_own_cpu_s() - cpu0) / reads)
        self.server_cpu_s.append((tree_cpu_seconds(apiserver) - srv0) / reads)


def _arms(cluster: Cluster, ns: str) -> list[Arm]:
    kubectl = cluster.kubectl
    return [
        Arm("kubectl: pods -l", lambda: get_json(kubectl, "pods", "-n", ns, "-l", SELECTOR)),
        Arm("in-process: pods_json", lambda: cluster.pods_json(ns, SELECTOR)),
        Arm("kubectl: pcd", lambda: get_json(kubectl, "pcd", NAME, "-n", ns)),
        Arm("in-process: pcd_json", lambda: cluster.pcd_json(ns, NAME)),
    ]


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:7.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=40, help="reads per arm and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("starting a local control plane ...", flush=True)
    cluster = start_local_cluster(gateway_crds=False, name=f"bench-reads-{int(time.time())}")
    try:
        install_crd(cluster.kubectl)
        ns = cluster.create_namespace("reads")
        apply_yaml(cluster.kubectl, pcd_resource(NAME, ns))
        apiserver = _apiserver_pid(cluster)
        arms = _arms(cluster, ns)
        for arm in arms:  # a first read of each: discovery cached, the connection open
            arm.read()
        for r in range(args.rounds):
            for arm in arms[r % len(arms) :] + arms[: r % len(arms)]:
                arm.measure(args.reads, apiserver)
            print(f"round {r + 1}/{args.rounds} done", flush=True)
    finally:
        stop_cluster(cluster)
    print(f"\n{args.reads} reads per arm and round, {args.rounds} rounds; medians per read (ms)")
    print(f"{'arm':24} {'wall':>7} {'client CPU':>10} {'server CPU':>10} {'wall':>6} {'CPU':>6}")
    for kubectl_arm, client_arm in (arms[0:2], arms[2:4]):
        base_wall, base_cpu = _totals(kubectl_arm)
        for arm in (kubectl_arm, client_arm):
            wall, cpu = _totals(arm)
            print(
                f"{arm.name:24} {_ms(arm.wall_s)} {_ms(arm.client_cpu_s):>10}"
                f" {_ms(arm.server_cpu_s):>10} {wall / base_wall:>5.2f}x {cpu / base_cpu:>5.2f}x"
            )
    print("(the last two columns: each arm's wall time and CPU against kubectl's, same read)")


def _totals(arm: Arm) -> tuple[float, float]:
    """Median wall time and median CPU (reader with children, plus the API server) per read."""
    cpu = statistics.median(arm.client_cpu_s) + statistics.median(arm.server_cpu_s)
    return statistics.median(arm.wall_s), cpu


if __name__ == "__main__":
    main()

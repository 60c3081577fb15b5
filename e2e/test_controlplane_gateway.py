"""Gateway API and InferencePool CRDs are installed (or not, on request), and the
`e2e/cluster` lifecycle is clean: side-by-side clusters, nothing left after `down`."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.pytest_cluster import CLUSTER_CLI, Cluster, start_local_cluster, stop_cluster

pytestmark = pytest.mark.cluster

CRDS = ("httproutes.gateway.networking.k8s.io", "inferencepools.inference.networking.k8s.io")


def inference_pool(name: str, **spec_overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "vllm"}},
        "targetPorts": [{"number": 8000}],
        "endpointPickerRef": {"name": f"{name}-epp", "port": {"number": 9002}},
    }
    spec.update(spec_overrides)
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": name},
        "spec": spec,
    }


def http_route(name: str, pool: str) -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": name},
        "spec": {
            "parentRefs": [{"name": "inference-gateway"}],
            "rules": [
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                    "backendRefs": [
                        {
                            "group": "inference.networking.k8s.io",
                            "kind": "InferencePool",
                            "name": pool,
                        }
                    ],
                }
            ],
        },
    }


def test_gateway_and_inferencepool_crds_accept_and_validate(
    cluster: Cluster, namespace: str
) -> None:
    for crd in CRDS:
        obj = cluster.get_json("crd", crd)
        established = [c for c in obj["status"]["conditions"] if c["type"] == "Established"]
        assert [c["status"] for c in established] == ["True"]

    docs = [inference_pool("pool"), http_route("route", "pool")]
    for doc in docs:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
    pool = cluster.get_json("inferencepool", "pool", "-n", namespace)
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    route = cluster.get_json("httproute", "route", "-n", namespace)
    assert route["spec"]["rules"][0]["backendRefs"][0]["kind"] == "InferencePool"

    # The CRD schema is enforced by the API server: targetPorts needs 1..8 items.
    bad = cluster.kubectl(
        "apply", "-n", namespace, "-f", "-",
        input=json.dumps(inference_pool("bad", targetPorts=[])), check=False,
    )  # fmt: skip
    assert bad.returncode != 0
    assert (
        "spec.targetPorts: Invalid value: 0: spec.targetPorts in body should have at least 1 items"
        in bad.stderr
    )


def cluster_pids(c: Cluster) -> dict[str, int]:
    state = json.loads((Path(str(c.dir)) / "cluster.json").read_text())
    return {k: int(v) for k, v in state["pids"].items()}


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


@pytest.mark.timeout(1200)  # starts a control plane of its own (up: 240 s at most)
def test_cluster_without_gateway_crds_side_by_side_and_down_leaves_nothing(
    cluster: Cluster,
) -> None:
    if cluster.mode != "local":
        pytest.skip("needs the local control plane")
    other = start_local_cluster(gateway_crds=False)
    try:
        pids = cluster_pids(other)
        assert {
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
        } <= set(pids)
        assert all(alive(p) for p in pids.values())
        # Independent of the session cluster: its own API server, pod range and CRD set.
        assert other.kubeconfig != cluster.kubeconfig
        assert other.pod_cidr
        assert cluster.pod_cidr
        assert not ipaddress.ip_network(other.pod_cidr).overlaps(
            ipaddress.ip_network(cluster.pod_cidr)
        )
        assert other.gateway_crds is False
        for crd in CRDS:
            missing = other.kubectl("get", "crd", crd, check=False)
            assert missing.returncode != 0
            assert "NotFound" in missing.stderr
            cluster.kubectl("get", "crd", crd)  # still there in the session cluster
        listed = other.kubectl("api-resources", "--api-group=inference.networking.k8s.io")
        assert "inferencepools" not in listed.stdout
        env = subprocess.run(
            [sys.executable, str(CLUSTER_CLI), "env", "--dir", str(other.dir)],
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        assert f"export KUBECONFIG={other.kubeconfig}" in env.stdout
        assert f"export PROMPTCACHE_POD_CIDR={other.pod_cidr}" in env.stdout
    finally:
        stop_cluster(other)
    leftover = [f"{name} (pid {pid})" for name, pid in pids.items() if alive(pid)]
    assert leftover == [], f"processes left after down: {leftover}"
    assert not Path(str(other.dir)).exists()
    assert os.path.exists(cluster.kubeconfig)  # the session cluster is untouched

"""The local control plane is a real one: controllers, scheduler and garbage collector act.

Each test drives a behaviour that only the real component produces (a mock would have to
hard-code it): the ReplicaSet controller creating pods, the scheduler placing them by
extended resource, kwok giving them loopback IPs, the garbage collector removing dependents.
"""

from __future__ import annotations

import ipaddress
import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from harness.pytest_cluster import Cluster

pytestmark = pytest.mark.cluster


def gpu_deployment(name: str, replicas: int, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {
                            "name": "model",
                            "image": "registry.invalid/model:1",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ]
                },
            },
        },
    }


def running_pods(cluster: Cluster, namespace: str, app: str) -> list[dict[str, Any]]:
    pods = cluster.get_json("pods", "-n", namespace, "-l", f"app={app}")["items"]
    return [p for p in pods if p["status"].get("phase") == "Running" and p["status"].get("podIP")]


def node_gpus(cluster: Cluster) -> dict[str, int]:
    nodes = cluster.get_json("nodes")["items"]
    return {
        n["metadata"]["name"]: int(n["status"].get("allocatable", {}).get("nvidia.com/gpu", "0"))
        for n in nodes
    }


def test_deployment_gets_running_pods_on_fake_gpu_nodes(cluster: Cluster, namespace: str) -> None:
    gpu_nodes = {name for name, gpus in node_gpus(cluster).items() if gpus > 0}
    assert gpu_nodes, "the cluster must offer nodes with allocatable nvidia.com/gpu"
    dep = gpu_deployment("gpu-app", replicas=3, gpus=2)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(dep))

    cluster.wait_for(
        lambda: len(running_pods(cluster, namespace, "gpu-app")) == 3, "3 Running gpu-app pods"
    )
    pods = running_pods(cluster, namespace, "gpu-app")
    # Deployment -> ReplicaSet -> Pod, each link made by a real controller.
    rs_names = {p["metadata"]["ownerReferences"][0]["name"] for p in pods}
    assert len(rs_names) == 1
    rs = cluster.get_json("replicaset", "-n", namespace, rs_names.pop())
    assert rs["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
    assert rs["metadata"]["ownerReferences"][0]["name"] == "gpu-app"
    for p in pods:
        assert p["spec"]["nodeName"] in gpu_nodes
        assert p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert len({p["status"]["podIP"] for p in pods}) == 3, "pod IPs must be distinct"
    cluster.wait_for(
        lambda: (
            cluster.get_json("deployment", "-n", namespace, "gpu-app")["status"].get(
                "readyReplicas"
            )
            == 3
        ),
        "deployment readyReplicas == 3",
    )


def test_pod_ips_are_loopback_and_bindable(cluster: Cluster, namespace: str) -> None:
    """Fake pods get IPs in the cluster's 127.x/16, so a test can serve on a pod's IP."""
    if not cluster.loopback_pod_ips:
        pytest.skip("this cluster's pod IPs are not loopback (existing or kind cluster)")
    assert cluster.pod_cidr is not None
    cidr = ipaddress.ip_network(cluster.pod_cidr)
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(gpu_deployment("ip", 2, 1))
    )
    cluster.wait_for(lambda: len(running_pods(cluster, namespace, "ip")) == 2, "2 Running pods")
    ips = [p["status"]["podIP"] for p in running_pods(cluster, namespace, "ip")]
    for ip in ips:
        assert ipaddress.ip_address(ip) in cidr, f"{ip} outside {cidr}"

    class Hello(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = f"pod {self.server.server_address[0]}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    servers = [ThreadingHTTPServer((ip, 0), Hello) for ip in ips]
    try:
        for s in servers:
            threading.Thread(target=s.serve_forever, daemon=True).start()
        for ip, s in zip(ips, servers, strict=True):
            url = f"http://{ip}:{s.server_address[1]}/"
            with urllib.request.urlopen(url, timeout=10) as resp:
                assert resp.read().decode() == f"pod {ip}"
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


def test_pod_wanting_more_gpus_than_any_node_stays_pending(
    cluster: Cluster, namespace: str
) -> None:
    most = max(node_gpus(cluster).values())
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "too-big"},
        "spec": {
            "containers": [
                {
                    "name": "model",
                    "image": "registry.invalid/model:1",
                    "resources": {"limits": {"nvidia.com/gpu": str(most + 1)}},
                }
            ]
        },
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))

    def unschedulable() -> dict[str, Any] | None:
        p = cluster.get_json("pod", "-n", namespace, "too-big")
        for c in p["status"].get("conditions", []):
            if c["type"] == "PodScheduled" and c["status"] == "False":
                return dict(c)
        return None

    cluster.wait_for(lambda: unschedulable() is not None, "PodScheduled=False on too-big")
    cond = unschedulable()
    assert cond is not None
    assert cond["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in cond["message"]
    p = cluster.get_json("pod", "-n", namespace, "too-big")
    assert p["status"]["phase"] == "Pending"
    assert not p["spec"].get("nodeName")
    events = cluster.get_json(
        "events", "-n", namespace, "--field-selector", "involvedObject.name=too-big"
    )["items"]
    assert any(
        e["reason"] == "FailedScheduling" and "Insufficient nvidia.com/gpu" in e["message"]
        for e in events
    ), events


def test_deleting_an_owner_garbage_collects_dependents(cluster: Cluster, namespace: str) -> None:
    # An ownerReference set by hand: only the garbage collector can act on it.
    cluster.kubectl("create", "configmap", "owner", "-n", namespace, "--from-literal=k=v")
    owner_uid = cluster.get_json("configmap", "-n", namespace, "owner")["metadata"]["uid"]
    dependent = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "dependent",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner_uid}
            ],
        },
        "data": {"k": "v"},
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(dependent))
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(gpu_deployment("gc", 2, 1))
    )
    cluster.wait_for(lambda: len(running_pods(cluster, namespace, "gc")) == 2, "2 gc pods")

    cluster.kubectl("delete", "configmap", "owner", "-n", namespace)
    cluster.kubectl("delete", "deployment", "gc", "-n", namespace, "--cascade=background")

    def gone(*args: str) -> bool:
        out = cluster.kubectl("get", *args, "-n", namespace, "-o", "name", check=False)
        return out.returncode != 0 or not out.stdout.strip()

    cluster.wait_for(lambda: gone("configmap", "dependent"), "dependent ConfigMap collected")
    cluster.wait_for(lambda: gone("replicasets", "-l", "app=gc"), "ReplicaSet collected")
    cluster.wait_for(lambda: gone("pods", "-l", "app=gc"), "pods collected")

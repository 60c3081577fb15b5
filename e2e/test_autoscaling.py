"""spec.autoscaling for real: the HPA controller in kube-controller-manager scales a
PromptCacheDeployment up and back down on its model servers' waiting queue.

Everything between the pods and the HPA is the production chain, built from Go modules:
Prometheus scrapes the stand-in model servers (one `FakePod` per kwok pod, bound to the pod's
loopback IP), prometheus-adapter serves `custom.metrics.k8s.io` from Prometheus with the rules
of docs/autoscaling/prometheus-adapter-values.yaml, registered as an APIService behind the API
server's aggregation layer. The operator renders the HPA and turns the replicas the HPA writes
through the scale subresource into pods.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.net import answers_ok, free_port
from harness.operator import (
    OperatorProcess,
    apply_yaml,
    get_json,
    install_crd,
    resource,
    wait_for,
)
from harness.pytest_cluster import Cluster, built_binary
from harness.standin import FakePod

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[1]
ADAPTER_VALUES = ROOT / "docs" / "autoscaling" / "prometheus-adapter-values.yaml"
METRICS_API = "v1beta2.custom.metrics.k8s.io"
POD_PORT = 8000
TIMEOUT_S = 240


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def _tail(path: Path, n: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else ""


class StandInPods:
    """Keeps one stand-in model server per live pod of a Deployment and tells Prometheus
    (file_sd, with the `namespace` and `pod` labels the adapter rules need) where they are."""

    def __init__(self, cluster: Cluster, namespace: str, selector: str, targets: Path) -> None:
        self.cluster, self.namespace, self.selector, self.targets = (
            cluster, namespace, selector, targets)  # fmt: skip
        self.pods: dict[str, FakePod] = {}
        self.waiting = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._lock = threading.Lock()
        self.targets.write_text("[]")

    def start(self) -> StandInPods:
        self._thread.start()
        return self

    def set_waiting(self, value: int) -> None:
        with self._lock:
            self.waiting = value
            for pod in self.pods.values():
                pod.set(waiting=value)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.sync()

    def sync(self) -> None:
        listing = get_json(self.cluster.kubectl, "pods", "-n", self.namespace, "-l", self.selector)
        live = {
            p["metadata"]["name"]: p["status"]["podIP"]
            for p in (listing or {}).get("items", [])
            if p.get("status", {}).get("podIP") and not p["metadata"].get("deletionTimestamp")
        }
        with self._lock:
            for name in set(self.pods) - set(live):
                self.pods.pop(name).stop()
            for name, ip in live.items():
                if name not in self.pods:
                    pod = FakePod(name, ip, POD_PORT).start()
                    pod.set(waiting=self.waiting)
                    self.pods[name] = pod
            groups = [
                {"targets": [p.address], "labels": {"namespace": self.namespace, "pod": name}}
                for name, p in sorted(self.pods.items())
            ]
        tmp = self.targets.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.replace(self.targets)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for pod in self.pods.values():
            pod.stop()


@pytest.fixture(scope="module")
def metrics_pipeline(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """Prometheus + prometheus-adapter, the adapter registered as the custom metrics API."""
    work = tmp_path_factory.mktemp("autoscaling")
    targets = work / "targets.json"
    prom_port, adapter_port = free_port(), free_port()
    (work / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{
            "job_name": "model-servers",
            "scrape_timeout": "900ms",
            "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
        }],
    }))  # fmt: skip
    values = yaml.safe_load(ADAPTER_VALUES.read_text())
    (work / "adapter.yaml").write_text(yaml.safe_dump({"rules": values["rules"]["custom"]}))
    # Everything started is registered for teardown the moment it exists, so a setup step
    # that fails (a binary that cannot be built, a refused apply) leaves no process behind.
    with contextlib.ExitStack() as teardown:
        prometheus = _start([
            str(built_binary("prometheus")), f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}",
        ], work / "prometheus.log")  # fmt: skip
        teardown.callback(_stop, prometheus)
        adapter = _start([
            str(built_binary("prometheus-adapter")),
            "--bind-address=127.0.0.1", f"--secure-port={adapter_port}",
            f"--cert-dir={work / 'adapter-certs'}",
            f"--lister-kubeconfig={cluster.kubeconfig}",
            f"--authentication-kubeconfig={cluster.kubeconfig}",
            f"--authorization-kubeconfig={cluster.kubeconfig}",
            f"--prometheus-url=http://127.0.0.1:{prom_port}/",
            "--metrics-relist-interval=3s", f"--config={work / 'adapter.yaml'}", "--v=2",
        ], work / "adapter.log")  # fmt: skip
        teardown.callback(_stop, adapter)
        ns = cluster.create_namespace("metrics")
        teardown.callback(cluster.kubectl, "delete", "namespace", ns, "--wait=false", check=False)
        teardown.callback(
            cluster.kubectl, "delete", "apiservice", METRICS_API, "--wait=false", check=False
        )
        # The aggregator dials an ExternalName Service's name: the adapter on this host.
        apply_yaml(
            cluster.kubectl,
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": "custom-metrics", "namespace": ns},
             "spec": {"type": "ExternalName", "externalName": "localhost",
                      "ports": [{"port": adapter_port, "protocol": "TCP"}]}},
            {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
             "metadata": {"name": METRICS_API},
             "spec": {"group": "custom.metrics.k8s.io", "version": "v1beta2",
                      "service": {"name": "custom-metrics", "namespace": ns, "port": adapter_port},
                      "insecureSkipTLSVerify": True,
                      "groupPriorityMinimum": 100, "versionPriority": 100}},
        )  # fmt: skip
        wait_for(
            lambda: answers_ok(f"http://127.0.0.1:{prom_port}/-/ready"),
            f"Prometheus ready\n{_tail(work / 'prometheus.log')}", timeout=60,
        )  # fmt: skip
        cluster.wait_for(
            lambda: cluster.kubectl(
                "wait", "--for=condition=Available", f"apiservice/{METRICS_API}",
                "--timeout=5s", check=False).returncode == 0,
            f"APIService {METRICS_API} Available\n{_tail(work / 'adapter.log')}", timeout=120,
        )  # fmt: skip
        yield {"work": work, "targets": targets, "prom_port": prom_port}


def _installed(cluster: Cluster) -> bool:
    """install_crd, retried: `kubectl wait` right after the apply can find no conditions yet."""
    try:
        install_crd(cluster.kubectl)
    except AssertionError:
        return False
    return True


# Its own waits add up to 20 minutes at most (four of TIMEOUT_S, the pipeline's start).
@pytest.mark.timeout(1500)
def test_the_hpa_controller_scales_a_resource_up_and_down_on_the_waiting_queue(
    cluster: Cluster, metrics_pipeline: dict[str, Any], tmp_path: Path
) -> None:
    wait_for(lambda: _installed(cluster), "the CRD Established", timeout=60)
    ns = cluster.create_namespace("hpa")
    op = OperatorProcess(
        kubeconfig=cluster.kubeconfig, log_path=tmp_path / "operator.log",
        args=["-n", ns, "--no-leader-election", "--resync-seconds", "2"],
    ).start()  # fmt: skip
    selector = "app.kubernetes.io/instance=llm,app.kubernetes.io/component=model-server"
    pods = StandInPods(cluster, ns, selector, metrics_pipeline["targets"]).start()
    try:
        doc = resource("llm", ns, autoscaling={
            "enabled": True, "minReplicas": 1, "maxReplicas": 3,
            "metric": "WaitingRequests", "target": 2, "scaleDownStabilizationSeconds": 0,
        })  # fmt: skip
        apply_yaml(cluster.kubectl, doc)
        hpa = wait_for(lambda: get_json(cluster.kubectl, "hpa", "llm", "-n", ns),
                       f"the HPA rendered\n{op.log_tail()}")  # fmt: skip
        assert hpa["spec"]["scaleTargetRef"]["kind"] == "PromptCacheDeployment"

        def replicas() -> tuple[int, int]:
            obj = cluster.pcd_json(ns, "llm") or {}
            return (obj.get("spec", {}).get("model", {}).get("replicas", -1),
                    len(pods.pods))  # fmt: skip

        def metric_seen() -> bool:
            url = (f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/*/"
                   "vllm_num_requests_waiting")  # fmt: skip
            out = cluster.kubectl("get", "--raw", url, check=False)
            return out.returncode == 0 and bool(json.loads(out.stdout).get("items"))

        wait_for(lambda: replicas() == (1, 1), f"one pod\n{op.log_tail()}", timeout=TIMEOUT_S)
        adapter_log = metrics_pipeline["work"] / "adapter.log"
        wait_for(metric_seen, f"the queue in the custom metrics API\n{_tail(adapter_log)}",
                 timeout=TIMEOUT_S)  # fmt: skip

        pods.set_waiting(10)  # 10 waiting per pod against a target of 2: up to the max
        t0 = time.monotonic()
        wait_for(lambda: replicas() == (3, 3), "scale up to 3", timeout=TIMEOUT_S)
        up_s = time.monotonic() - t0
        status = get_json(cluster.kubectl, "hpa", "llm", "-n", ns)["status"]
        assert status["desiredReplicas"] == 3

        pods.set_waiting(0)
        t0 = time.monotonic()
        wait_for(lambda: replicas() == (1, 1), "scale down to 1", timeout=TIMEOUT_S)
        down_s = time.monotonic() - t0
        print(f"scaled 1 -> 3 in {up_s:.0f}s and 3 -> 1 in {down_s:.0f}s")

        # Switching autoscaling off removes the HPA: nothing keeps rewriting replicas.
        doc["spec"]["autoscaling"] = {"enabled": False}
        apply_yaml(cluster.kubectl, doc)
        wait_for(lambda: get_json(cluster.kubectl, "hpa", "llm", "-n", ns) is None,
                 f"the HPA removed\n{op.log_tail()}")  # fmt: skip
    finally:
        pods.stop()
        op.stop()
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)

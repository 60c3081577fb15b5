"""The hit-ratio ladder on a real control plane: what `kubectl describe pcd` says (issue 39).

The operator scrapes the model-server pods as in a cluster; "each pod" answers with the
cache front's own exposition (`front.metrics.FrontMetrics`, the code the front serves),
whose ladder counters grow as a front's do when it serves requests the picker predicted.
Two pools, two diagnoses: one whose engines deliver what the picker predicted (no loss
named, CacheDelivering True), one whose engines deliver far less (delivery named, with what
to change; CacheDelivering False). Fake (kwok) pods have loopback IPs, so a test server can
answer "from a pod".
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from harness.net import free_port
from harness.operator import (
    OperatorProcess,
    apply_yaml,
    condition,
    get_json,
    install_crd,
    ladder_section,
    resource,
    wait_for,
)
from harness.pytest_cluster import Cluster
from promptcache.embeds.cache import PromptEmbedsCache
from promptcache.front.hits import ScopeClass, Tally
from promptcache.front.metrics import FrontMetrics
from promptcache.tenancy.prediction import Prediction

pytestmark = pytest.mark.cluster

RESYNC_S = 2.0
TIMEOUT_S = 180


@pytest.fixture(scope="module")
def env(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if not cluster.loopback_pod_ips:
        pytest.skip("pod IPs are not loopback addresses on this cluster")
    install_crd(cluster.kubectl)
    ns = cluster.create_namespace("ladder")
    scrape_port = free_port()
    op = OperatorProcess(
        kubeconfig=cluster.kubeconfig,
        log_path=tmp_path_factory.mktemp("op") / "operator.log",
        args=["-n", ns, "--no-leader-election", "--resync-seconds", str(RESYNC_S),
              "--scrape-port", str(scrape_port), "--scrape-timeout", "1"],
    ).start()  # fmt: skip
    try:
        yield {"ns": ns, "op": op, "scrape_port": scrape_port}
    finally:
        op.stop()
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def front_pod(prediction: Prediction, cached: int) -> type[BaseHTTPRequestHandler]:
    """A pod's front: every scrape, 20 more answered requests of 128 prompt tokens that the
    picker predicted as `prediction`, of which the engine served `cached` from cache."""
    metrics = FrontMetrics(PromptEmbedsCache(0).stats)
    lock = threading.Lock()

    class Pod(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with lock:
                for _ in range(20):
                    metrics.observe_usage(128, cached, Tally(ScopeClass.KEYED, prediction))
                body = metrics.render()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    return Pod


def described(cluster: Cluster, ns: str, name: str) -> str:
    out = cluster.kubectl("describe", "pcd", name, "-n", ns).stdout
    return re.sub(r"\s+", " ", out)


def serve_pool(
    cluster: Cluster, env: dict[str, Any], name: str, handler: type[BaseHTTPRequestHandler]
) -> list[ThreadingHTTPServer]:
    ns = env["ns"]
    apply_yaml(cluster.kubectl, resource(name, ns, model={"replicas": 1}))
    selector = f"app.kubernetes.io/instance={name},app.kubernetes.io/component=model-server"

    def running() -> Any:
        items = get_json(cluster.kubectl, "pods", "-n", ns, "-l", selector)["items"]
        ips = [p.get("status", {}).get("podIP") for p in items]
        return ips if len(ips) == 1 and all(ips) else None

    servers = []
    for ip in wait_for(running, f"{name}'s pod has an IP", timeout=TIMEOUT_S):
        server = ThreadingHTTPServer((ip, env["scrape_port"]), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    return servers


def ladder_of(cluster: Cluster, env: dict[str, Any], name: str) -> dict[str, Any]:
    op: OperatorProcess = env["op"]

    def ready() -> Any:
        st = cluster.pcd_json(env["ns"], name).get("status") or {}
        return st.get("cache")

    return dict(wait_for(ready, f"{name} status.cache\n{op.log_tail()}", timeout=TIMEOUT_S))


def test_describe_names_the_largest_loss_and_the_condition_follows(
    cluster: Cluster, env: dict[str, Any]
) -> None:
    ns = env["ns"]
    # 8 blocks of 16 tokens: the whole prompt seen, held, predicted
    flat = front_pod(Prediction(8, 8, 16, 8, 8), cached=120)
    lost = front_pod(Prediction(8, 8, 16, 8, 8), cached=16)
    servers = serve_pool(cluster, env, "flat", flat) + serve_pool(cluster, env, "lost", lost)
    try:
        st = ladder_of(cluster, env, "flat")
        assert (st["workload"], st["capacity"], st["routing"]) == (1.0, 1.0, 1.0)
        assert st["delivered"] == pytest.approx(120 / 128, abs=1e-3)
        assert st["largestLoss"] == "None"
        cond = condition(cluster.pcd_json(ns, "flat"), "CacheDelivering")
        assert (cond["status"], cond["reason"]) == ("True", "AsPredicted")
        assert "no step loses more than 10 points" in described(cluster, ns, "flat")
        # what the demo prints at its end: the Cache section, message and rungs
        section = ladder_section(cluster.kubectl("describe", "pcd", "flat", "-n", ns).stdout)
        assert section.lstrip().startswith("Cache:"), section
        assert "Largest Loss:" in section, section
        assert "no step loses more than" in section, section

        st = ladder_of(cluster, env, "lost")
        assert st["largestLoss"] == "Delivery"
        text = described(cluster, ns, "lost")
        assert "the largest loss is delivery (88 points)" in text, text
        assert "prefixCache.autoTune" in text
        cond = condition(cluster.pcd_json(ns, "lost"), "CacheDelivering")
        assert (cond["status"], cond["reason"]) == ("False", "DeliveredBelowPredicted")
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()

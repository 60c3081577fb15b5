"""The operator on a real control plane: children, status, idle resync, drift, scale, GC.

One operator subprocess per module (resync every 2 s so drift and idle windows are
short), watching one namespace. Fake (kwok) pods become Ready without running
anything; their loopback IPs let the metrics test serve Prometheus text "from a pod".
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from harness.net import free_port
from harness.operator import (
    CHILD_KINDS,
    OperatorProcess,
    apiserver_writes,
    apply_yaml,
    condition,
    get_json,
    install_crd,
    resource,
    wait_for,
)
from harness.pytest_cluster import Cluster
from promptcache.contract import GATEWAY_POLICY_METRICS_PORT

pytestmark = pytest.mark.cluster

RESYNC_S = 2.0
TIMEOUT_S = 180


@pytest.fixture(scope="module")
def env(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    install_crd(cluster.kubectl)
    ns = cluster.create_namespace("op")
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


def pcd(cluster: Cluster, ns: str, name: str) -> Any:
    return cluster.pcd_json(ns, name)


def wait_ready(cluster: Cluster, ns: str, name: str, op: OperatorProcess) -> dict[str, Any]:
    def ready() -> Any:
        obj = pcd(cluster, ns, name)
        cond = condition(obj, "Ready")
        gen = (obj or {}).get("metadata", {}).get("generation")
        ok = cond and cond["status"] == "True" and obj["status"].get("observedGeneration") == gen
        return obj if ok else None

    return dict(wait_for(ready, f"{name} Ready\n{op.log_tail()}", timeout=TIMEOUT_S))


def test_children_are_owned_named_and_status_is_complete(
    cluster: Cluster, env: dict[str, Any]
) -> None:
    ns, op = env["ns"], env["op"]
    apply_yaml(cluster.kubectl, resource("alpha", ns, model={"replicas": 2},
                                         promptEmbeds={"enabled": True, "cacheGiB": 2},
                                         engine={"apiServerCount": 2}))  # fmt: skip
    obj = wait_ready(cluster, ns, "alpha", op)
    uid = obj["metadata"]["uid"]
    for kind in (*CHILD_KINDS, "secrets"):
        items = get_json(cluster.kubectl, kind, "-n", ns, "-l", "app.kubernetes.io/instance=alpha")
        assert items["items"], f"no {kind} for alpha"
        for item in items["items"]:
            refs = item["metadata"].get("ownerReferences") or []
            assert [(r["uid"], r["controller"], r["blockOwnerDeletion"]) for r in refs] == [
                (uid, True, True)
            ], f"{kind}/{item['metadata']['name']}"
            assert "generateName" not in item["metadata"]
    status = obj["status"]
    assert status["replicas"] == 2
    assert status["readyReplicas"] == 2
    assert status["selector"] == (
        "app.kubernetes.io/component=model-server,app.kubernetes.io/instance=alpha,"
        "app.kubernetes.io/name=promptcache"
    )
    assert status["promptEmbeds"] == {
        "perPodBytes": 4 * 2**30, "totalBytes": 8 * 2**30, "perPod": "4Gi",
    }  # fmt: skip
    types = {c["type"]: c for c in status["conditions"]}
    assert set(types) == {"Ready", "Progressing", "Degraded", "GatewayReady"}
    for cond in types.values():
        assert set(cond) >= {"type", "status", "reason", "message", "lastTransitionTime"}
    assert types["Degraded"]["status"] == "False"
    assert types["GatewayReady"]["reason"] in ("NoRoute", "ReplicasNotReady")
    secret = get_json(cluster.kubectl, "secret", "alpha-salt", "-n", ns)
    key = base64.b64decode(secret["data"]["salt-key"]).decode()
    assert len(key) == 64
    assert int(key, 16) >= 0
    assert key not in op.log_text(), "the salt key must never be logged"
    events = get_json(cluster.kubectl, "events", "-n", ns,
                      "--field-selector", "involvedObject.name=alpha")  # fmt: skip
    assert any(e["reason"] == "Available" for e in events["items"]), "no Ready transition Event"


def test_idle_resync_writes_nothing(cluster: Cluster, env: dict[str, Any]) -> None:
    ns, op = env["ns"], env["op"]
    apply_yaml(cluster.kubectl, resource("idle", ns))
    wait_ready(cluster, ns, "idle", op)
    # Let the rollout settle: two resyncs in a row without a write from the operator, and
    # none at the API server either (the Deployment controller still writes its revision
    # annotation after a rollout, and the server's counter cannot tell clients apart).
    wait_for(
        lambda: _quiet_across_resyncs(cluster, op, 2),
        "the operator and the API server to go quiet for two resyncs",
        timeout=180,
        every=0.1,
    )
    server_before, client_before = apiserver_writes(cluster.kubectl), op.writes()
    reads_before = op.counter("promptcache_api_requests_total", verb="GET")
    resyncs_before = op.counter("promptcache_reconciles_total", trigger="resync")
    wait_for(lambda: op.counter("promptcache_reconciles_total", trigger="resync")
             >= resyncs_before + 6, "six resyncs", timeout=120)  # fmt: skip
    assert op.writes() - client_before == 0
    assert apiserver_writes(cluster.kubectl) - server_before == 0
    # Nor a read: children, pods and resources come from the watch-fed caches (a GET per
    # child and a pod LIST per resource, ~16 a resync, made the traffic grow with the
    # fleet). At most the discovery re-checks of InferencePool and HTTPRoute (every 5 min)
    # can fall into the window.
    assert op.counter("promptcache_api_requests_total", verb="GET") - reads_before <= 2


def _quiet_across_resyncs(cluster: Cluster, op: OperatorProcess, resyncs: int) -> bool:
    """Whether neither the operator nor the API server wrote while the operator resynced
    `resyncs` times. Counted in resyncs, not seconds: on a busy machine a window of seconds
    may hold fewer resyncs than it was sized for, and prove less than it says."""
    server_before, client_before = apiserver_writes(cluster.kubectl), op.writes()
    start = op.counter("promptcache_reconciles_total", trigger="resync")
    wait_for(
        lambda: op.counter("promptcache_reconciles_total", trigger="resync") >= start + resyncs,
        f"{resyncs} resyncs (from {start:g})",
        timeout=60,
        every=0.1,
        operator=op,
    )
    return op.writes() == client_before and apiserver_writes(cluster.kubectl) == server_before


def test_drift_on_owned_fields_is_reverted_foreign_changes_stay(
    cluster: Cluster, env: dict[str, Any]
) -> None:
    ns, op = env["ns"], env["op"]
    apply_yaml(
        cluster.kubectl, resource("drift", ns, promptEmbeds={"enabled": True, "cacheGiB": 3})
    )
    wait_ready(cluster, ns, "drift", op)
    cluster.kubectl("-n", ns, "set", "image", "deployment/drift", "vllm=evil/vllm:latest")
    cluster.kubectl("-n", ns, "set", "env", "deployment/drift", "-c", "cache-front",
                    "SG_PROMPT_EMBEDS_CACHE_GIB=99")  # fmt: skip
    cluster.kubectl("-n", ns, "annotate", "deployment/drift", "team.example.com/owner=me")

    def restored() -> bool:
        dep = get_json(cluster.kubectl, "deployment", "drift", "-n", ns)
        containers = {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}
        env_vars = {e["name"]: e.get("value") for e in containers["cache-front"]["env"]}
        return (
            containers["vllm"]["image"] != "evil/vllm:latest"
            and env_vars.get("SG_PROMPT_EMBEDS_CACHE_GIB") == "3"
        )

    wait_for(restored, f"drift reverted\n{op.log_tail()}", timeout=TIMEOUT_S)
    dep = get_json(cluster.kubectl, "deployment", "drift", "-n", ns)
    assert dep["metadata"]["annotations"]["team.example.com/owner"] == "me"


def test_scale_subresource(cluster: Cluster, env: dict[str, Any]) -> None:
    ns, op = env["ns"], env["op"]
    apply_yaml(cluster.kubectl, resource("scaled", ns))
    wait_ready(cluster, ns, "scaled", op)
    cluster.kubectl("-n", ns, "scale", "pcd/scaled", "--replicas", "3")
    wait_for(lambda: (pcd(cluster, ns, "scaled")["status"].get("readyReplicas") == 3),
             f"3 ready replicas\n{op.log_tail()}", timeout=TIMEOUT_S)  # fmt: skip
    scale = json.loads(cluster.kubectl(
        "get", "--raw",
        f"/apis/serving.promptcache.io/v1alpha1/namespaces/{ns}/promptcachedeployments/scaled/scale",
    ).stdout)  # fmt: skip
    assert scale["spec"]["replicas"] == 3
    assert scale["status"]["replicas"] == 3
    pods = get_json(cluster.kubectl, "pods", "-n", ns, "-l", scale["status"]["selector"])
    assert len(pods["items"]) == 3
    assert all(p["metadata"]["labels"]["app.kubernetes.io/instance"] == "scaled"
               for p in pods["items"])  # fmt: skip


class _Metrics(BaseHTTPRequestHandler):
    """vLLM's prefix-cache metrics "from a pod"; once `growing`, every scrape sees 40 more
    queries and 30 more hits (traffic with a 0.75 hit ratio)."""

    blocks = 0
    hits = 0
    queries = 400
    growing = False

    def do_GET(self) -> None:
        cls = type(self)
        if cls.growing:
            cls.hits += 30
            cls.queries += 40
        body = VLLM_METRICS % (cls.blocks, cls.queries, cls.hits)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


VLLM_METRICS = """\
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="%d",cache_dtype="auto"} 1.0
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{model_name="m",engine="0"} %d.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{model_name="m",engine="0"} %d.0
"""


def test_prefix_cache_settings_come_from_the_pods_metrics(
    cluster: Cluster, env: dict[str, Any]
) -> None:
    if not cluster.loopback_pod_ips:
        pytest.skip("pod IPs are not loopback addresses on this cluster")
    ns, op = env["ns"], env["op"]
    apply_yaml(cluster.kubectl, resource("scraped", ns, model={"replicas": 2}))
    wait_ready(cluster, ns, "scraped", op)
    pods = get_json(
        cluster.kubectl,
        "pods",
        "-n",
        ns,
        "-l",
        "app.kubernetes.io/instance=scraped,app.kubernetes.io/component=model-server",
    )
    servers = []
    handlers: list[type[_Metrics]] = []
    for i, pod in enumerate(pods["items"]):
        handler = type(f"M{i}", (_Metrics,), {"blocks": 2048 - i, "hits": 100 * (i + 1)})
        handlers.append(handler)
        server = ThreadingHTTPServer((pod["status"]["podIP"], env["scrape_port"]), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    try:

        def scraped() -> Any:
            st = pcd(cluster, ns, "scraped")["status"].get("prefixCache") or {}
            return st if st.get("scrapedPods") == 2 else None

        st = wait_for(scraped, f"prefixCache scraped\n{op.log_tail()}", timeout=TIMEOUT_S)
        # No traffic yet: the lifetime ratio, and no recent one (no query in the window).
        # The default picker (promptcache's, GIE's underneath) uses the pods' 16-token
        # blocks as they are (llm-d-router would raise them to 64).
        assert st == {"scrapedPods": 2, "blockSize": 16, "effectiveBlockSizeTokens": 16,
                      "numGpuBlocks": 2047, "indexCapacityPerPod": 2047,
                      "hitRatio": 0.375}  # fmt: skip
        for handler in handlers:
            handler.growing = True

        def recent() -> Any:
            st = pcd(cluster, ns, "scraped")["status"].get("prefixCache") or {}
            return st if "recentHitRatio" in st else None

        st = wait_for(recent, f"recentHitRatio\n{op.log_tail()}", timeout=TIMEOUT_S)
        # The window sees only the new traffic (0.75); the lifetime ratio still carries the past.
        assert st["recentHitRatio"] == 0.75
        assert 0.375 < st["hitRatio"] < 0.75
        assert 0 < st["recentWindowSeconds"] <= 300 + RESYNC_S + 1
        table = cluster.kubectl("get", "pcd", "scraped", "-n", ns).stdout
        assert "HIT-RATIO" in table
        assert "0.75" in table.splitlines()[1].split()
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


@pytest.fixture
def gie_env(cluster: Cluster, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A second operator whose operator-wide default picker is GIE v1.5 (`--picker`)."""
    install_crd(cluster.kubectl)
    ns = cluster.create_namespace("gie")
    scrape_port = free_port()
    op = OperatorProcess(
        kubeconfig=cluster.kubeconfig,
        log_path=tmp_path / "operator.log",
        args=["-n", ns, "--no-leader-election", "--resync-seconds", str(RESYNC_S),
              "--scrape-port", str(scrape_port), "--scrape-timeout", "1",
              "--picker", "gie-v1.5"],
    ).start()  # fmt: skip
    try:
        yield {"ns": ns, "op": op, "scrape_port": scrape_port}
    finally:
        op.stop()
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_status_describes_the_operator_default_picker(
    cluster: Cluster, gie_env: dict[str, Any]
) -> None:
    """With `--picker gie-v1.5` and no `spec.gateway.picker`, the status reports what the GIE
    picker uses (the pods' 16-token blocks, no 64-token floor), as the rendered config does."""
    if not cluster.loopback_pod_ips:
        pytest.skip("pod IPs are not loopback addresses on this cluster")
    ns, op = gie_env["ns"], gie_env["op"]
    apply_yaml(cluster.kubectl, resource("gie", ns))
    wait_ready(cluster, ns, "gie", op)
    config = get_json(cluster.kubectl, "configmap", "gie-epp", "-n", ns)
    assert "Endpoint Picker: gie-v1.5" in next(iter(config["data"].values()))
    pods = get_json(
        cluster.kubectl,
        "pods",
        "-n",
        ns,
        "-l",
        "app.kubernetes.io/instance=gie,app.kubernetes.io/component=model-server",
    )
    handler = type("Gie", (_Metrics,), {"blocks": 1000})
    ip = pods["items"][0]["status"]["podIP"]
    server = ThreadingHTTPServer((ip, gie_env["scrape_port"]), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:

        def scraped() -> Any:
            st = pcd(cluster, ns, "gie")["status"].get("prefixCache") or {}
            return st if st.get("scrapedPods") == 1 else None

        st = wait_for(scraped, f"prefixCache scraped\n{op.log_tail()}", timeout=TIMEOUT_S)
        assert st["blockSize"] == 16
        assert st["effectiveBlockSizeTokens"] == 16, "GIE v1.5 has no 64-token floor"
        assert st["indexCapacityPerPod"] == 1000
    finally:
        server.shutdown()
        server.server_close()


def test_salt_secret_survives_an_operator_restart(
    cluster: Cluster, env: dict[str, Any], tmp_path: Path
) -> None:
    ns, op = env["ns"], env["op"]
    apply_yaml(cluster.kubectl, resource("salty", ns))
    wait_ready(cluster, ns, "salty", op)
    before = get_json(cluster.kubectl, "secret", "salty-salt", "-n", ns)
    op.stop()
    op.start()
    resumed = op.counter("promptcache_reconciles_total", trigger="resume")
    wait_for(lambda: op.counter("promptcache_reconciles_total", trigger="resume") >= 1,
             f"resume after restart\n{op.log_tail()}", timeout=TIMEOUT_S)  # fmt: skip
    assert resumed >= 0
    after = get_json(cluster.kubectl, "secret", "salty-salt", "-n", ns)
    assert after["data"] == before["data"]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_deleting_the_resource_leaves_nothing(cluster: Cluster, env: dict[str, Any]) -> None:
    ns, op = env["ns"], env["op"]
    apply_yaml(cluster.kubectl, resource("doomed", ns))
    wait_ready(cluster, ns, "doomed", op)

    def managed_is(count: int) -> bool:
        return op.counter("promptcache_resources") == count

    served = len(get_json(cluster.kubectl, "pcd", "-n", ns)["items"])
    wait_for(lambda: managed_is(served), f"promptcache_resources == {served}", timeout=30)
    cluster.kubectl("-n", ns, "delete", "pcd", "doomed", "--wait=true", "--timeout=60s")
    wait_for(lambda: managed_is(served - 1), "promptcache_resources to drop", timeout=30)

    def gone() -> bool:
        for kind in (*CHILD_KINDS, "secrets", "pods", "replicasets"):
            items = get_json(
                cluster.kubectl, kind, "-n", ns, "-l", "app.kubernetes.io/instance=doomed"
            )
            if items["items"]:
                return False
        return True

    wait_for(gone, "garbage collection of every child", timeout=TIMEOUT_S)
    assert op.alive()


def test_a_changed_picker_config_rolls_the_picker(cluster: Cluster, env: dict[str, Any]) -> None:
    """The picker reads its config once: changing a weight must give a new picker pod whose
    template carries the new config's hash (the ConfigMap it mounts then holds that config)."""
    ns, op = env["ns"], env["op"]
    name = "rolls"
    apply_yaml(cluster.kubectl, resource(name, ns, isolation={"mode": "Shared"}))
    wait_ready(cluster, ns, name, op)
    annotation = "serving.promptcache.io/epp-config-sha256"

    def picker_pods() -> list[dict[str, Any]]:
        pods = get_json(
            cluster.kubectl, "pods", "-n", ns,
            "-l", f"app.kubernetes.io/instance={name},app.kubernetes.io/component=endpoint-picker",
        )["items"]  # fmt: skip
        return [p for p in pods if not p["metadata"].get("deletionTimestamp")]

    def config_hash() -> str:
        cm = get_json(cluster.kubectl, "configmap", f"{name}-epp", "-n", ns)
        return hashlib.sha256(cm["data"]["config.yaml"].encode()).hexdigest()

    def one_pod_with(digest: str) -> Any:
        pods = picker_pods()
        hashes = [p["metadata"].get("annotations", {}).get(annotation) for p in pods]
        return pods[0] if hashes == [digest] else None

    before = config_hash()
    old = wait_for(
        lambda: one_pod_with(before), f"a picker pod on the first config\n{op.log_tail()}"
    )
    cluster.kubectl(
        "patch", "pcd", name, "-n", ns, "--type=merge",
        "-p", json.dumps({"spec": {"prefixCache": {"weights": {"queue": 2.5}}}}),
    )  # fmt: skip
    after = wait_for(
        lambda: (h := config_hash()) != before and h, f"the new config\n{op.log_tail()}"
    )
    assert (
        "weight: 2.5"
        in get_json(cluster.kubectl, "configmap", f"{name}-epp", "-n", ns)["data"]["config.yaml"]
    )
    new = wait_for(lambda: one_pod_with(after), f"a picker pod on the new config\n{op.log_tail()}")
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    cluster.kubectl("delete", "pcd", name, "-n", ns, "--wait=false")


def test_the_picker_network_policy_follows_the_policy_step(
    cluster: Cluster, env: dict[str, Any]
) -> None:
    """Behind the policy step the picker pod gets a NetworkPolicy that leaves its inner port
    out; when the step is no longer rendered (Shared isolation, no sessions), or the user
    turns it off, the operator deletes it."""
    ns, op = env["ns"], env["op"]
    name = "fenced"
    # PerKey: the step fronts llm-d-router (promptcache's picker, the default, has none:
    # e2e/test_operator_upgrade.py checks its policy)
    apply_yaml(cluster.kubectl, resource(name, ns, gateway={"picker": "llm-d-router"}))
    wait_ready(cluster, ns, name, op)

    def policy() -> Any:
        found = get_json(
            cluster.kubectl, "networkpolicies", "-n", ns,
            "-l", f"app.kubernetes.io/instance={name}",
        )["items"]  # fmt: skip
        return found[0] if found else None

    live = wait_for(policy, f"the picker's NetworkPolicy\n{op.log_tail()}")
    assert live["metadata"]["name"] == f"{name}-epp"
    ports = {p["port"] for rule in live["spec"]["ingress"] for p in rule["ports"]}
    assert ports == {9002, 9003, 9090, GATEWAY_POLICY_METRICS_PORT}  # the step's metrics too

    def patch(spec: dict[str, Any]) -> None:
        cluster.kubectl(
            "patch", "pcd", name, "-n", ns, "--type=merge", "-p", json.dumps({"spec": spec})
        )  # fmt: skip

    patch({"isolation": {"mode": "Shared"}})
    wait_for(lambda: policy() is None, f"pruned without the step\n{op.log_tail()}")
    patch({"isolation": {"mode": "PerKey"}})
    wait_for(policy, f"back with the step\n{op.log_tail()}")
    patch({"gateway": {"networkPolicy": False}})
    wait_for(lambda: policy() is None, f"pruned when turned off\n{op.log_tail()}")
    assert op.alive()

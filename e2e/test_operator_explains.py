"""A status that explains, on a real control plane: what `kubectl describe pcd` tells a user.

Each not-ready state is produced the way a cluster produces it: the real scheduler marks
pods Unschedulable; for the kubelet's states (an image that cannot be pulled, a crashing
container, vLLM still loading weights) the test writes the pod's status as a kubelet
would (kwok plays the kubelet and leaves a pod alone once it is past `Pending`). For the
gateway, the test writes the HTTPRoute's, the InferencePool's and the Gateway's status as
a Gateway controller would. Each assertion is on the exact text `kubectl describe` shows,
and on the Event the transition posted.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from harness.localcluster.crds import MONITORING_CRD_NAMES, monitoring_crd_files
from harness.operator import (
    OperatorProcess,
    apply_yaml,
    condition,
    get_json,
    namespaced_operator,
    resource,
    wait_established,
    wait_for,
)
from harness.pytest_cluster import Cluster

pytestmark = pytest.mark.cluster

TIMEOUT_S = 120
CONTROLLER = "example.com/gateway-controller"


@pytest.fixture(scope="module")
def env(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with namespaced_operator(cluster, "explain", tmp_path_factory.mktemp("explain")) as env:
        yield env


def now_rfc3339(delta_s: float = 0) -> str:
    at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=delta_s)
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def wait_condition(
    cluster: Cluster,
    ns: str,
    name: str,
    type_: str,
    status: str,
    reason: str,
    op: OperatorProcess,
) -> dict[str, Any]:
    def check() -> Any:
        cond = condition(cluster.pcd_json(ns, name), type_)
        if cond and (cond["status"], cond["reason"]) == (status, reason):
            return cond
        return None

    return dict(
        wait_for(check, f"{name} {type_}={status}/{reason}\n{op.log_tail()}", timeout=TIMEOUT_S)
    )


def described(cluster: Cluster, ns: str, name: str) -> str:
    """`kubectl describe pcd` with runs of whitespace collapsed (it wraps nothing, but aligns)."""
    out = cluster.kubectl("describe", "pcd", name, "-n", ns).stdout
    return re.sub(r"\s+", " ", out)


def shown(cluster: Cluster, ns: str, name: str, message: str) -> None:
    text = described(cluster, ns, name)
    assert f"Message: {message}" in text, text


def event(cluster: Cluster, ns: str, name: str, reason: str) -> dict[str, Any]:
    def find() -> Any:
        items = get_json(
            cluster.kubectl, "events", "-n", ns, "--field-selector", f"involvedObject.name={name}"
        )["items"]
        return next((e for e in items if e["reason"] == reason), None)

    return dict(wait_for(find, f"Event {reason} on {name}", timeout=30))


def model_pod(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    selector = f"app.kubernetes.io/instance={name},app.kubernetes.io/component=model-server"

    def one() -> Any:
        items = get_json(cluster.kubectl, "pods", "-n", ns, "-l", selector)["items"]
        return items[0] if len(items) == 1 else None

    return dict(wait_for(one, f"one model-server pod of {name}", timeout=TIMEOUT_S))


def as_kubelet(cluster: Cluster, pod: dict[str, Any], vllm: dict[str, Any]) -> None:
    """Write the pod's status the way a kubelet reports a not-ready vLLM container."""
    images = {c["name"]: c["image"] for c in pod["spec"]["containers"]}
    statuses = []
    for cname, image in images.items():
        if cname == "vllm":
            statuses.append(
                {
                    "name": cname,
                    "image": image,
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    **vllm,
                }
            )
        else:
            statuses.append(
                {
                    "name": cname,
                    "image": image,
                    "imageID": "",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now_rfc3339(-60)}},
                }
            )
    t = now_rfc3339()
    status = {
        # Running, not Pending: kwok's pod-ready stage only acts on Pending pods.
        "phase": "Running",
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": t},
            {"type": "Initialized", "status": "True", "lastTransitionTime": t},
            {
                "type": "ContainersReady",
                "status": "False",
                "lastTransitionTime": t,
                "reason": "ContainersNotReady",
            },
            {
                "type": "Ready",
                "status": "False",
                "lastTransitionTime": t,
                "reason": "ContainersNotReady",
            },
        ],
        "containerStatuses": statuses,
    }
    meta = pod["metadata"]
    cluster.kubectl(
        "patch",
        "pod",
        meta["name"],
        "-n",
        meta["namespace"],
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )


def broken_ready_pod(
    cluster: Cluster, ns: str, name: str, op: OperatorProcess, vllm: dict[str, Any], **spec: Any
) -> dict[str, Any]:
    apply_yaml(cluster.kubectl, resource(name, ns, **spec))
    wait_condition(cluster, ns, name, "Ready", "True", "Available", op)
    pod = model_pod(cluster, ns, name)
    as_kubelet(cluster, pod, vllm)
    return pod


def test_image_pull_back_off_names_the_image_and_the_field(
    cluster: Cluster, env: dict[str, Any]
) -> None:
    ns, op = env["ns"], env["op"]
    image = "vllm/vllm-openai:v0.0.0-does-not-exist"
    kubelet = f'Back-off pulling image "{image}"'
    pod = broken_ready_pod(
        cluster,
        ns,
        "pull",
        op,
        {"state": {"waiting": {"reason": "ImagePullBackOff", "message": kubelet}}},
        model={"image": image},
    )
    name = pod["metadata"]["name"]
    cond = wait_condition(cluster, ns, "pull", "Ready", "False", "ImagePullBackOff", op)
    expected = (
        f"0/1 model-server pods ready: pod {name} container vllm: image "
        f"'{image}' cannot be pulled (ImagePullBackOff: {kubelet}); "
        "check spec.model.image and the registry credentials (imagePullSecrets)"
    )
    assert cond["message"] == expected
    shown(cluster, ns, "pull", expected)
    degraded = wait_condition(cluster, ns, "pull", "Degraded", "True", "ImagePullBackOff", op)
    assert degraded["message"] == expected.removeprefix("0/1 model-server pods ready: ")
    assert event(cluster, ns, "pull", "ImagePullBackOff")["type"] == "Warning"
    # The gauges the availability alerts read (docs/monitoring.md).
    labels = {"namespace": ns, "promptcache_deployment": "pull"}
    assert op.counter("promptcache_model_server_replicas_desired", **labels) == 1
    assert op.counter("promptcache_model_server_replicas_ready", **labels) == 0
    # The kubelet pulls it after all: the status says so, and the transition is an Event.
    as_kubelet(
        cluster,
        pod,
        {"ready": True, "started": True, "state": {"running": {"startedAt": now_rfc3339()}}},
    )
    cluster.kubectl(
        "patch",
        "pod",
        name,
        "-n",
        ns,
        "--subresource=status",
        "--type=json",
        "-p",
        json.dumps([{"op": "replace", "path": "/status/conditions/3/status", "value": "True"}]),
    )
    wait_condition(cluster, ns, "pull", "Ready", "True", "Available", op)
    wait_condition(cluster, ns, "pull", "Degraded", "False", "AsExpected", op)
    assert event(cluster, ns, "pull", "Available")["type"] == "Normal"


def test_crash_loop_names_the_container_and_the_last_exit(
    cluster: Cluster, env: dict[str, Any]
) -> None:
    ns, op = env["ns"], env["op"]
    pod = broken_ready_pod(
        cluster,
        ns,
        "crash",
        op,
        {
            "restartCount": 5,
            "state": {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": "back-off 2m40s restarting failed container",
                }
            },
            "lastState": {
                "terminated": {
                    "exitCode": 1,
                    "reason": "Error",
                    "startedAt": now_rfc3339(-30),
                    "finishedAt": now_rfc3339(-20),
                }
            },
        },
    )
    name = pod["metadata"]["name"]
    cond = wait_condition(cluster, ns, "crash", "Ready", "False", "CrashLoopBackOff", op)
    expected = (
        f"0/1 model-server pods ready: pod {name} container vllm is crash-looping (5 restarts, "
        f"last exit code 1 (Error)); see kubectl logs -n {ns} {name} -c vllm --previous"
    )
    assert cond["message"] == expected
    shown(cluster, ns, "crash", expected)
    wait_condition(cluster, ns, "crash", "Degraded", "True", "CrashLoopBackOff", op)
    assert event(cluster, ns, "crash", "CrashLoopBackOff")["type"] == "Warning"


def test_loading_weights_is_a_wait_not_a_failure(cluster: Cluster, env: dict[str, Any]) -> None:
    ns, op = env["ns"], env["op"]
    pod = broken_ready_pod(
        cluster,
        ns,
        "loading",
        op,
        {
            "started": False,
            "state": {"running": {"startedAt": now_rfc3339(-600)}},
        },
    )
    name = pod["metadata"]["name"]
    cond = wait_condition(cluster, ns, "loading", "Ready", "False", "LoadingWeights", op)
    expected = (
        f"0/1 model-server pods ready: pod {name}: vLLM is loading the model for 10m (startup "
        "probe not passed yet; it may take up to 30m)"
    )
    assert cond["message"] == expected
    shown(cluster, ns, "loading", expected)
    degraded = condition(cluster.pcd_json(ns, "loading"), "Degraded")
    assert degraded is not None
    assert (degraded["status"], degraded["reason"]) == ("False", "AsExpected")
    assert event(cluster, ns, "loading", "LoadingWeights")["type"] == "Normal"


def scheduler_message(cluster: Cluster, ns: str, name: str) -> str:
    def said() -> Any:
        pod = model_pod(cluster, ns, name)
        for c in pod["status"].get("conditions") or []:
            if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable":
                return c["message"]
        return None

    return str(wait_for(said, f"scheduler marks {name}'s pod Unschedulable", timeout=TIMEOUT_S))


def test_unschedulable_quotes_the_scheduler(cluster: Cluster, env: dict[str, Any]) -> None:
    ns, op = env["ns"], env["op"]
    apply_yaml(
        cluster.kubectl,
        resource(
            "nowhere", ns, model={"nodeSelector": {"promptcache.test/pool": "does-not-exist"}}
        ),
    )
    said = scheduler_message(cluster, ns, "nowhere").rstrip(".")
    assert "didn't match Pod's node affinity/selector" in said
    name = model_pod(cluster, ns, "nowhere")["metadata"]["name"]
    cond = wait_condition(cluster, ns, "nowhere", "Ready", "False", "Unschedulable", op)
    expected = (
        f"0/1 model-server pods ready: pod {name} cannot be scheduled: {said}. Check "
        "spec.model.nodeSelector, spec.model.tolerations and spec.model.resources"
    )
    assert cond["message"] == expected
    shown(cluster, ns, "nowhere", expected)
    wait_condition(cluster, ns, "nowhere", "Degraded", "True", "Unschedulable", op)
    assert event(cluster, ns, "nowhere", "Unschedulable")["type"] == "Warning"


def test_gpu_pool_scaled_to_zero_is_a_warning_not_a_failure(
    cluster: Cluster, env: dict[str, Any]
) -> None:
    ns, op = env["ns"], env["op"]
    apply_yaml(
        cluster.kubectl,
        resource(
            "scale-from-zero",
            ns,
            model={
                "resources": {"gpus": 1},
                "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
            },
        ),
    )
    said = scheduler_message(cluster, ns, "scale-from-zero").rstrip(".")
    name = model_pod(cluster, ns, "scale-from-zero")["metadata"]["name"]
    cond = wait_condition(cluster, ns, "scale-from-zero", "Ready", "False", "Unschedulable", op)
    expected = (
        f"0/1 model-server pods ready: pod {name} cannot be scheduled yet: {said}. Waiting for a "
        "GPU node: a node pool that scales from zero adds one when its autoscaler sees this pod; "
        "otherwise add GPU nodes or check spec.model.nodeSelector, spec.model.tolerations and "
        "spec.model.resources.gpus"
    )
    assert cond["message"] == expected
    shown(cluster, ns, "scale-from-zero", expected)
    degraded = condition(cluster.pcd_json(ns, "scale-from-zero"), "Degraded")
    assert degraded is not None
    assert (degraded["status"], degraded["reason"]) == ("False", "AsExpected")
    assert event(cluster, ns, "scale-from-zero", "Unschedulable")["type"] == "Warning"


# --------------------------------------------------------------------------- gateway


def parent_status(ns: str, conditions: dict[str, tuple[str, str, str]]) -> Any:
    entry: dict[str, Any] = {
        "parentRef": {
            "group": "gateway.networking.k8s.io",
            "kind": "Gateway",
            "name": "gw",
            "namespace": ns,
        },
        "conditions": [
            {
                "type": t,
                "status": s,
                "reason": r,
                "message": m,
                "lastTransitionTime": now_rfc3339(),
                "observedGeneration": 1,
            }
            for t, (s, r, m) in conditions.items()
        ],
        "controllerName": CONTROLLER,
    }
    return {"status": {"parents": [entry]}}


def write_status(cluster: Cluster, kind: str, ns: str, name: str, body: Any) -> None:
    cluster.kubectl(
        "patch",
        kind,
        name,
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(body),
    )


OK = {"Accepted": ("True", "Accepted", ""), "ResolvedRefs": ("True", "ResolvedRefs", "")}


def test_gateway_ready_follows_the_gateway_controllers_verdict(
    cluster: Cluster, env: dict[str, Any]
) -> None:
    ns, op = env["ns"], env["op"]
    apply_yaml(
        cluster.kubectl, resource("routed", ns, gateway={"route": {"parentRefs": [{"name": "gw"}]}})
    )
    cond = wait_condition(cluster, ns, "routed", "GatewayReady", "False", "RoutePending", op)
    route = get_json(
        cluster.kubectl, "httproute", "-n", ns, "-l", "app.kubernetes.io/instance=routed"
    )["items"][0]["metadata"]["name"]
    pool = get_json(
        cluster.kubectl, "inferencepool", "-n", ns, "-l", "app.kubernetes.io/instance=routed"
    )["items"][0]["metadata"]["name"]
    assert cond["message"] == (
        f"HTTPRoute {route}: no status from Gateway {ns}/gw yet; check that the Gateway "
        "exists and its controller is running"
    )
    shown(cluster, ns, "routed", cond["message"])
    # The Gateway refuses the route: its own words reach the user.
    refused = {"Accepted": ("False", "NotAllowedByListeners", "no listener admits this namespace")}
    write_status(cluster, "httproute", ns, route, parent_status(ns, refused))
    cond = wait_condition(cluster, ns, "routed", "GatewayReady", "False", "RouteNotAccepted", op)
    expected = (
        f"HTTPRoute {route}: Gateway {ns}/gw says NotAllowedByListeners: no listener admits this "
        "namespace"
    )
    assert cond["message"] == expected
    shown(cluster, ns, "routed", expected)
    assert event(cluster, ns, "routed", "RouteNotAccepted")["type"] == "Warning"

    # Route accepted; the pool's Endpoint Picker reference does not resolve.
    write_status(cluster, "httproute", ns, route, parent_status(ns, OK))
    bad = {**OK, "ResolvedRefs": ("False", "InvalidExtensionRef", "Service routed-epp not found")}
    write_status(cluster, "inferencepool", ns, pool, parent_status(ns, bad))
    cond = wait_condition(cluster, ns, "routed", "GatewayReady", "False", "PoolRefsNotResolved", op)
    expected = (
        f"InferencePool {pool}: Gateway {ns}/gw cannot resolve its references: "
        "InvalidExtensionRef: Service routed-epp not found"
    )
    assert cond["message"] == expected
    shown(cluster, ns, "routed", expected)

    # All accepted, and the Gateway reports its address: that is what clients use.
    gateway = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "gw", "namespace": ns},
        "spec": {
            "gatewayClassName": "example",
            "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}],
        },
    }
    apply_yaml(cluster.kubectl, gateway)
    write_status(
        cluster,
        "gateway",
        ns,
        "gw",
        {"status": {"addresses": [{"type": "IPAddress", "value": "203.0.113.7"}]}},
    )
    write_status(cluster, "inferencepool", ns, pool, parent_status(ns, OK))
    cond = wait_condition(cluster, ns, "routed", "GatewayReady", "True", "Accepted", op)
    expected = (
        f"HTTPRoute {route} and InferencePool {pool} accepted by Gateway {ns}/gw; clients use "
        "203.0.113.7"
    )
    assert cond["message"] == expected
    shown(cluster, ns, "routed", expected)
    status = cluster.pcd_json(ns, "routed")["status"]
    assert status["gateway"] == {"addresses": ["203.0.113.7"]}
    assert event(cluster, ns, "routed", "Accepted")["type"] == "Normal"


# --------------------------------------------------------------------------- monitoring


def test_monitoring_says_when_the_prometheus_operator_is_missing_then_applies(
    cluster: Cluster, env: dict[str, Any]
) -> None:
    ns, op = env["ns"], env["op"]
    crds = monitoring_crd_files()  # downloads the pinned module if needed
    apply_yaml(cluster.kubectl, resource("watched", ns, monitoring={"enabled": True}))
    cond = wait_condition(
        cluster, ns, "watched", "MonitoringReady", "False", "PrometheusOperatorNotInstalled", op
    )
    assert cond["message"] == (
        "spec.monitoring.enabled, but monitoring.coreos.com/v1 PodMonitor is not served: "
        "install the Prometheus Operator CRDs (or scrape the pods yourself, "
        "docs/monitoring.md); everything else is managed as usual"
    )
    shown(cluster, ns, "watched", cond["message"])
    wait_condition(cluster, ns, "watched", "Ready", "True", "Available", op)
    try:
        for path in crds:
            cluster.kubectl("apply", "--server-side", "-f", str(path))
        wait_established(cluster.kubectl, *MONITORING_CRD_NAMES)
        cond = wait_condition(
            cluster, ns, "watched", "MonitoringReady", "True", "PodMonitorsApplied", op
        )
        uid = cluster.pcd_json(ns, "watched")["metadata"]["uid"]
        monitors = get_json(
            cluster.kubectl, "podmonitors", "-n", ns, "-l", "app.kubernetes.io/instance=watched"
        )["items"]
        assert sorted(m["metadata"]["name"] for m in monitors) == ["watched", "watched-epp"]
        for m in monitors:
            assert [r["uid"] for r in m["metadata"]["ownerReferences"]] == [uid]
        # Turned off: the PodMonitors go, and so does the condition.
        cluster.kubectl(
            "patch",
            "pcd",
            "watched",
            "-n",
            ns,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"monitoring": {"enabled": False}}}),
        )

        def gone() -> Any:
            left = get_json(
                cluster.kubectl, "podmonitors", "-n", ns, "-l", "app.kubernetes.io/instance=watched"
            )["items"]
            obj = cluster.pcd_json(ns, "watched")
            return not left and condition(obj, "MonitoringReady") is None

        wait_for(
            gone, f"PodMonitors and MonitoringReady removed\n{op.log_tail()}", timeout=TIMEOUT_S
        )
    finally:
        for path in crds:
            cluster.kubectl("delete", "-f", str(path), "--wait=false", check=False)

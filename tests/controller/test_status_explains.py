"""The pure parts of a status that explains: pod diagnosis, gateway verdicts, windowed ratio.

The same states are driven on the real control plane in e2e/test_operator_explains.py;
these pin the decision rules (which explanation wins, which is a failure) cheaply.
"""

from __future__ import annotations

import datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from promptcache.controller.diagnose import diagnose
from promptcache.controller.gateway_status import gateway_view
from promptcache.controller.status import Observation, compute_status
from promptcache.controller.window import HitWindow

NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)


def pod(
    name: str,
    *,
    ready: bool = False,
    scheduled: dict[str, Any] | None = None,
    containers: list[dict[str, Any]] | None = None,
    gpus: int = 0,
) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if scheduled is not None:
        conditions.append({"type": "PodScheduled", **scheduled})
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {
            "containers": [
                {"name": "vllm", "image": "vllm/vllm-openai:v9", "resources": {"limits": limits}},
                {"name": "cache-front", "image": "front:1"},
            ]
        },
        "status": {"phase": "Pending", "conditions": conditions, "containerStatuses": containers},
    }


def waiting(name: str, reason: str, message: str = "", **extra: Any) -> dict[str, Any]:
    return {"name": name, "ready": False, "state": {"waiting": {"reason": reason,
            "message": message}}, **extra}  # fmt: skip


def test_image_pull_names_the_image_the_field_and_the_kubelet_message() -> None:
    d = diagnose([pod("p-1", containers=[waiting("vllm", "ImagePullBackOff", "Back-off pulling")])])
    assert d is not None
    assert d.reason == "ImagePullBackOff"
    assert d.failure
    assert d.message == (
        "pod p-1 container vllm: image 'vllm/vllm-openai:v9' cannot be pulled (ImagePullBackOff: "
        "Back-off pulling); check spec.model.image and the registry credentials "
        "(imagePullSecrets)"
    )


def test_front_image_points_at_the_front_field() -> None:
    d = diagnose([pod("p-1", containers=[waiting("cache-front", "ErrImagePull")])])
    assert d is not None
    assert d.reason == "ImagePullBackOff"
    assert "image 'front:1'" in d.message
    assert "spec.front.image" in d.message


def test_crash_loop_names_the_container_and_the_last_exit() -> None:
    cs = waiting("vllm", "CrashLoopBackOff", restartCount=4,
                 lastState={"terminated": {"exitCode": 1, "reason": "Error"}})  # fmt: skip
    d = diagnose([pod("p-1", containers=[cs])])
    assert d is not None
    assert d.reason == "CrashLoopBackOff"
    assert d.message == (
        "pod p-1 container vllm is crash-looping (4 restarts, last exit code 1 (Error)); "
        "see kubectl logs -n ns p-1 -c vllm --previous"
    )


def test_unschedulable_quotes_the_scheduler() -> None:
    said = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
    d = diagnose([pod("p-1", scheduled={"status": "False", "reason": "Unschedulable",
                                        "message": said})])  # fmt: skip
    assert d is not None
    assert (d.reason, d.failure) == ("Unschedulable", True)
    assert said in d.message


def test_gpu_shortage_is_a_warning_not_a_failure() -> None:
    said = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    d = diagnose([pod("p-1", gpus=8, scheduled={"status": "False", "reason": "Unschedulable",
                                                 "message": said})])  # fmt: skip
    assert d is not None
    assert (d.reason, d.failure) == ("Unschedulable", False)
    assert d.message == (
        "pod p-1 cannot be scheduled yet: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu. "
        "Waiting for a GPU node: a node pool that scales from zero adds one when its autoscaler "
        "sees this pod; otherwise add GPU nodes or check spec.model.nodeSelector, "
        "spec.model.tolerations and spec.model.resources.gpus"
    )


def test_loading_weights_says_for_how_long() -> None:
    started = (NOW - datetime.timedelta(minutes=7)).strftime("%Y-%m-%dT%H:%M:%SZ")
    cs = {"name": "vllm", "ready": False, "started": False,
          "state": {"running": {"startedAt": started}}}  # fmt: skip
    d = diagnose([pod("p-1", containers=[cs])], now=NOW)
    assert d is not None
    assert (d.reason, d.failure) == ("LoadingWeights", False)
    assert d.message == (
        "pod p-1: vLLM is loading the model for 7m (startup probe not passed yet; it may take "
        "up to 30m)"
    )


def test_the_most_actionable_pod_wins_and_the_rest_are_counted() -> None:
    pull = waiting("vllm", "ImagePullBackOff")
    loading = {"name": "vllm", "started": False, "state": {"running": {}}}
    pods = [pod("a", containers=[loading]), pod("b", containers=[pull]),
            pod("c", containers=[pull]), pod("d", ready=True)]  # fmt: skip
    d = diagnose(pods)
    assert d is not None
    assert d.reason == "ImagePullBackOff"
    assert d.message.startswith("pod b container vllm")
    assert d.message.endswith("; 1 more pod(s) likewise")
    assert diagnose([pod("d", ready=True)]) is None


def test_ready_and_degraded_conditions_carry_the_diagnosis() -> None:
    d = diagnose([pod("p-1", containers=[waiting("vllm", "ImagePullBackOff")])])
    obs = Observation(generation=1, desired_replicas=1, pods=d)
    status = compute_status(obs, None, now="2026-01-01T00:00:00Z")
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["Ready"]["reason"] == "ImagePullBackOff"
    assert by_type["Ready"]["message"].startswith("0/1 model-server pods ready: pod p-1 ")
    assert (by_type["Degraded"]["status"], by_type["Degraded"]["reason"]) == (
        "True",
        "ImagePullBackOff",
    )
    gpu = diagnose([pod("p-1", gpus=1, scheduled={"status": "False", "reason": "Unschedulable",
                                                   "message": "1 Insufficient nvidia.com/gpu"})])  # fmt: skip
    status = compute_status(Observation(generation=1, desired_replicas=1, pods=gpu), None,
                            now="2026-01-01T00:00:00Z")  # fmt: skip
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["Ready"]["reason"] == "Unschedulable"
    assert by_type["Degraded"]["status"] == "False"


# --------------------------------------------------------------------------- gateway


def parents(*entries: tuple[str, dict[str, tuple[str, str, str]]]) -> dict[str, Any]:
    return {
        "parents": [
            {
                "parentRef": {
                    "group": "gateway.networking.k8s.io",
                    "kind": "Gateway",
                    "name": gw,
                    "namespace": "infra",
                },
                "conditions": [
                    {"type": t, "status": s, "reason": r, "message": m}
                    for t, (s, r, m) in conds.items()
                ],
            }
            for gw, conds in entries
        ]
    }


ROUTE_SPEC = {"parentRefs": [{"name": "gw", "namespace": "infra"}]}
OK = {"Accepted": ("True", "Accepted", ""), "ResolvedRefs": ("True", "ResolvedRefs", "")}


def view(route_status: dict[str, Any] | None, pool_status: dict[str, Any] | None,
         gateways: list[dict[str, Any]] | None = None, route: bool = True) -> Any:  # fmt: skip
    return gateway_view(
        namespace="ns",
        pool_name="m-pool",
        pool={"status": pool_status or {}},
        route_name="m-route",
        route={"spec": ROUTE_SPEC, "status": route_status or {}} if route else None,
        gateways=gateways or [],
    )


def test_gateway_waits_for_the_route_verdict() -> None:
    v = view(None, None)
    assert (v.condition.status, v.condition.reason) == ("False", "RoutePending")
    assert v.condition.message == (
        "HTTPRoute m-route: no status from Gateway infra/gw yet; check that the Gateway exists "
        "and its controller is running"
    )


def test_gateway_quotes_a_refused_route() -> None:
    refused = {"Accepted": ("False", "NotAllowedByListeners", "no listener allows ns")}
    v = view(parents(("gw", refused)), None)
    assert (v.condition.status, v.condition.reason) == ("False", "RouteNotAccepted")
    assert v.condition.message == (
        "HTTPRoute m-route: Gateway infra/gw says NotAllowedByListeners: no listener allows ns"
    )


def test_gateway_quotes_unresolved_pool_refs() -> None:
    bad = {**OK, "ResolvedRefs": ("False", "InvalidExtensionRef", "Service m-epp not found")}
    v = view(parents(("gw", OK)), parents(("gw", bad)))
    assert (v.condition.status, v.condition.reason) == ("False", "PoolRefsNotResolved")
    assert v.condition.message == (
        "InferencePool m-pool: Gateway infra/gw cannot resolve its references: "
        "InvalidExtensionRef: Service m-epp not found"
    )


def test_gateway_ready_with_the_address_clients_use() -> None:
    gw = {"status": {"addresses": [{"type": "IPAddress", "value": "203.0.113.7"}]}}
    v = view(parents(("gw", OK)), parents(("gw", OK)), [gw])
    assert (v.condition.status, v.condition.reason) == ("True", "Accepted")
    assert v.addresses == ["203.0.113.7"]
    assert v.condition.message == (
        "HTTPRoute m-route and InferencePool m-pool accepted by Gateway infra/gw; clients use "
        "203.0.113.7"
    )


def test_no_route_and_no_parent_is_not_ready() -> None:
    v = view(None, None, route=False)
    assert (v.condition.status, v.condition.reason) == ("False", "NoRoute")
    v = view(None, parents(("gw", OK)), route=False)
    assert (v.condition.status, v.condition.reason) == ("True", "Accepted")


# --------------------------------------------------------------------------- window


def test_window_reports_recent_traffic_not_lifetime() -> None:
    w = HitWindow(window_s=300)
    # A long warm past: 900/1000 lifetime, then the cache collapses.
    assert w.add(0, {"a": (900, 1000)}).ratio is None
    r = w.add(60, {"a": (910, 1100)})
    assert r.ratio == 0.1
    assert r.span_s == 60
    # Five minutes later the baseline is the scrape at or before t-300.
    w.add(200, {"a": (910, 1200)})
    r = w.add(420, {"a": (910, 1300)})
    assert (r.ratio, r.span_s) == (0.0, 360)  # baseline t=60: 0/200


def test_window_counts_a_restarted_pod_from_zero() -> None:
    w = HitWindow()
    w.add(0, {"a": (50, 100), "b": (0, 0)})
    r = w.add(30, {"a": (5, 10), "b": (10, 10)})  # a restarted; b is new traffic
    assert r.ratio == 0.75  # (5 + 10) / (10 + 10)


def test_a_pod_first_scraped_late_adds_only_what_it_counts_afterwards() -> None:
    """Its counters since it started cannot be placed in the window (its earlier scrapes
    failed, or it is new): like increase(), count from its first sample in the window."""
    w = HitWindow()
    w.add(0, {})  # every scrape failed
    assert w.add(10, {"a": (300, 800), "b": (0, 0)}).ratio is None
    assert w.add(20, {"a": (330, 840), "b": (0, 0)}).ratio == 0.75


def test_window_without_queries_has_no_ratio() -> None:
    w = HitWindow()
    w.add(0, {"a": (5, 10)})
    assert w.add(30, {"a": (5, 10)}).ratio is None


counters = st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)).map(
    lambda t: (float(min(t)), float(max(t)))
)


@given(st.lists(st.tuples(st.floats(0, 100), st.dictionaries(st.sampled_from("abc"), counters)),
                min_size=1, max_size=20))  # fmt: skip
def test_window_ratio_is_a_ratio_and_span_is_bounded(
    scrapes: list[tuple[float, dict[str, tuple[float, float]]]],
) -> None:
    w = HitWindow(window_s=120)
    at = 0.0
    for step, snap in scrapes:
        at += step
        r = w.add(at, snap)
        assert r.ratio is None or 0.0 <= r.ratio <= 1.0
        assert r.span_s >= 0.0
        assert r.span_s <= 120 + 100  # at most the window plus one scrape interval

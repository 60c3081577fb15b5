"""Events: which transitions are news, and the Event object the operator posts."""

from __future__ import annotations

from promptcache.controller.conditions import transitions
from promptcache.controller.events import event_manifest

PCD = {
    "apiVersion": "serving.promptcache.io/v1alpha1",
    "kind": "PromptCacheDeployment",
    "metadata": {"name": "demo", "namespace": "ns", "uid": "u-1"},
}


def _c(type_: str, status: str, reason: str) -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason}


def test_first_not_yet_conditions_are_not_news() -> None:
    new = [
        _c("Ready", "False", "ReplicasNotReady"),
        _c("Degraded", "False", "AsExpected"),
        _c("GatewayReady", "False", "ReplicasNotReady"),
        _c("Progressing", "True", "RollingOut"),
    ]
    assert [c["type"] for c in transitions([], new)] == ["Progressing"]


def test_first_degraded_is_news_and_so_is_every_later_flip() -> None:
    assert transitions([], [_c("Degraded", "True", "SecretNotFound")]) == [
        _c("Degraded", "True", "SecretNotFound")
    ]
    old = [_c("Ready", "False", "ReplicasNotReady")]
    assert transitions(old, [_c("Ready", "True", "Available")]) == [
        _c("Ready", "True", "Available")
    ]


def test_event_is_named_never_generated_and_points_at_the_resource() -> None:
    event = event_manifest(PCD, type_="Normal", reason="Available", message="m", instance="op-1")
    assert "generateName" not in event["metadata"]
    assert event["metadata"]["name"].startswith("demo.")
    assert event["metadata"]["namespace"] == "ns"
    assert event["involvedObject"] == {
        "apiVersion": "serving.promptcache.io/v1alpha1",
        "kind": "PromptCacheDeployment",
        "name": "demo",
        "namespace": "ns",
        "uid": "u-1",
    }
    long = event_manifest(PCD, type_="Warning", reason="X", message="x" * 5000, instance="i")
    assert len(long["message"]) == 1024


def test_a_first_not_ready_that_names_a_pod_problem_is_news() -> None:
    new = [_c("Ready", "False", "Unschedulable"), _c("Ready2", "False", "ReplicasNotReady")]
    assert [c["reason"] for c in transitions([], new)] == ["Unschedulable"]

"""Conditions move lastTransitionTime only on a real transition; status is written only on change."""

from __future__ import annotations

from promptcache.api import prompt_embeds_ceiling
from promptcache.controller.conditions import Desired, set_condition, transitions
from promptcache.controller.status import (
    Observation,
    Problem,
    compute_status,
    format_bytes,
    status_differs,
)

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def test_new_condition_gets_the_current_time() -> None:
    conds, changed = set_condition([], Desired("Ready", "False", "X", "m"), generation=3, now=T0)
    assert changed
    assert conds == [
        {
            "type": "Ready",
            "status": "False",
            "reason": "X",
            "message": "m",
            "lastTransitionTime": T0,
            "observedGeneration": 3,
        }
    ]


def test_same_status_new_reason_keeps_the_transition_time() -> None:
    conds, _ = set_condition([], Desired("Ready", "False", "A"), generation=1, now=T0)
    conds, transitioned = set_condition(conds, Desired("Ready", "False", "B"), generation=2, now=T1)
    assert not transitioned
    assert conds[0]["lastTransitionTime"] == T0
    assert conds[0]["reason"] == "B"


def test_status_flip_moves_the_transition_time() -> None:
    conds, _ = set_condition([], Desired("Ready", "False", "A"), generation=1, now=T0)
    conds, transitioned = set_condition(conds, Desired("Ready", "True", "A"), generation=1, now=T1)
    assert transitioned
    assert conds[0]["lastTransitionTime"] == T1


def test_transitions_lists_changed_status_or_reason_only() -> None:
    old = [{"type": "Ready", "status": "True", "reason": "Available"}]
    same = [{"type": "Ready", "status": "True", "reason": "Available", "message": "other"}]
    assert transitions(old, same) == []
    flipped = [{"type": "Ready", "status": "False", "reason": "ReplicasNotReady"}]
    assert transitions(old, flipped) == flipped


def _obs(ready: int, **kw: object) -> Observation:
    deployment = {
        "metadata": {"generation": 1},
        "status": {
            "observedGeneration": 1,
            "replicas": 2,
            "updatedReplicas": 2,
            "readyReplicas": ready,
        },
    }
    obs = Observation(
        generation=4,
        desired_replicas=2,
        model_server=deployment,
        selector="a=b",
        ceiling=prompt_embeds_ceiling(enabled=True, cache_gib=2, processes_per_pod=2, replicas=2),
    )
    for key, value in kw.items():
        setattr(obs, key, value)
    return obs


def test_status_fields_and_conditions() -> None:
    status = compute_status(_obs(2), None, now=T0)
    assert status["observedGeneration"] == 4
    assert (status["replicas"], status["readyReplicas"], status["selector"]) == (2, 2, "a=b")
    assert status["promptEmbeds"] == {
        "perPodBytes": 4 * 2**30,
        "totalBytes": 8 * 2**30,
        "perPod": "4Gi",
    }
    by_type = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert by_type["Ready"] == ("True", "Available")
    assert by_type["Progressing"] == ("False", "Reconciled")
    assert by_type["Degraded"] == ("False", "AsExpected")


def test_unchanged_observation_writes_nothing_and_keeps_times() -> None:
    first = compute_status(_obs(2), None, now=T0)
    second = compute_status(_obs(2), first, now=T1)
    assert not status_differs(second, first)


def test_degraded_reason_reaches_the_condition() -> None:
    obs = _obs(0, degraded=Problem("SecretNotFound", "spec.model.hfTokenSecretRef: missing"))
    by_type = {c["type"]: c for c in compute_status(obs, None, now=T0)["conditions"]}
    assert by_type["Degraded"]["status"] == "True"
    assert by_type["Degraded"]["reason"] == "SecretNotFound"
    assert by_type["Ready"]["status"] == "False"


def test_format_bytes() -> None:
    assert format_bytes(0) == "0"
    assert format_bytes(8 * 2**30) == "8Gi"
    assert format_bytes(1536 * 2**20) == "1536Mi"
    assert format_bytes(1000) == "1000"

"""`harness.epp.scores`: a pick's per-pod scores read back from the picker's debug log.

The lines are GIE v1.5.0's, as its zap JSON encoder writes them at `--zap-log-level=4`
(values that implement `fmt.Stringer`, the plugin's TypedName and the endpoint's
NamespacedName, are logged as their text)."""

from __future__ import annotations

import json

from harness.epp.scores import scores_of


def _line(
    request_id: str, plugin: str, endpoint: str, score: float, msg: str = "Calculated score"
) -> str:
    return json.dumps(
        {
            "level": "debug",
            "ts": "2026-12-06T07:00:00Z",
            "caller": "scheduling/scheduler_profile.go:166",
            "msg": msg,
            "x-request-id": request_id,
            "plugin": plugin,
            "endpoint": endpoint,
            "score": score,
        }
    )


def test_scores_are_grouped_by_pod_and_scorer_type() -> None:
    log = "\n".join(
        [
            '{"level":"info","msg":"EPP received request","x-request-id":"w0-1"}',
            _line(
                "w0-1",
                "kv-cache-utilization-scorer/kv-cache-utilization-scorer",
                "ns/a-1-rank-0",
                0.9,
            ),
            _line(
                "w0-1",
                "kv-cache-utilization-scorer/kv-cache-utilization-scorer",
                "ns/b-2-rank-0",
                1.0,
            ),
            _line("w0-1", "lora/lora-affinity-scorer", "ns/a-1-rank-0", 1.0),
            _line("w0-10", "lora/lora-affinity-scorer", "ns/a-1-rank-0", 0.5),  # another request
            _line("w0-1", "x/queue-scorer", "ns/a-1-rank-0", 0.0, msg="Completed running"),
            "not json, but it names w0-1 and Calculated score",
        ]
    )
    assert scores_of(log, "w0-1") == {
        "a-1": {"kv-cache-utilization-scorer": 0.9, "lora-affinity-scorer": 1.0},
        "b-2": {"kv-cache-utilization-scorer": 1.0},
    }


def test_structured_values_are_read_too() -> None:
    line = json.dumps(
        {
            "msg": "Calculated score",
            "x-request-id": "r",
            "plugin": {"type": "queue-scorer", "name": "q"},
            "endpoint": {"name": "pod-x-rank-1", "namespace": "ns"},
            "score": 1,
        }
    )
    assert scores_of(line, "r") == {"pod-x": {"queue-scorer": 1.0}}


def test_either_case_of_the_name_key_is_read() -> None:
    line = _line("r", "k/kv", "ignored", 0.5).replace(
        '"ignored"', '{"Namespace": "n", "Name": "p-rank-0"}'
    )
    assert scores_of(line, "r") == {"p": {"kv": 0.5}}


def test_a_request_the_picker_did_not_log_has_no_scores() -> None:
    assert scores_of(_line("a", "k/kv", "ns/p-rank-0", 1.0), "b") == {}

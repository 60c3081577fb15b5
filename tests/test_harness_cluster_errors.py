"""A failed cluster start must say what failed, even when a component logged long lines."""

from __future__ import annotations

import json

from harness.pytest_cluster import failure_summary


def test_the_error_line_survives_a_long_component_log() -> None:
    kwok = json.dumps({"level": "INFO", "msg": "Syncing lease", "pad": "x" * 400})
    stderr = "\n".join(
        [
            "[cluster 23:20:01] starting etcd",
            "[cluster 23:23:50] error: timed out after 120s waiting for nodes Ready; "
            "last log lines of kwok:",
            *[kwok] * 25,
        ]
    )
    summary = failure_summary(stderr)
    assert "timed out after 120s waiting for nodes Ready" in summary
    assert summary.index("starting etcd") < summary.index("error: timed out")
    assert summary.endswith(stderr[-100:])  # the tail is still there, after it
    assert all(len(line) <= 600 for line in summary.split("--- the end")[0].splitlines())

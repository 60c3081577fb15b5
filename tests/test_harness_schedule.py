"""harness/pytest_schedule.py: under pytest-xdist, every real-engine test runs on one worker,
before anything else on it and at a lower priority, and every other module runs whole on
one worker, costliest first by the last recorded run.

A real pytest session with two xdist workers runs a small tree shaped like the suite's
(`e2e/engine/` beside other modules); each test records its worker and its turn, and the
records are read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from harness.pytest_schedule import ENGINE_NICENESS, ENGINE_TESTS, unit_of

ROOT = Path(__file__).resolve().parent.parent

RECORDER = """
import json, os, time
from pathlib import Path

def record(request):
    line = {"test": request.node.nodeid, "worker": os.environ["PYTEST_XDIST_WORKER"],
            "at": time.monotonic_ns(), "nice": os.getpriority(os.PRIO_PROCESS, 0)}
    with open(os.environ["SCHEDULE_LOG"], "a") as log:
        log.write(json.dumps(line) + "\\n")
"""

MODULE = """
import pytest
from recorder import record

@pytest.mark.parametrize("n", range({count}))
def test_case(request, n):
    record(request)
"""

COSTS = """
| module | tests | cost | share | cumulative | slowest test |
| --- | ---: | ---: | ---: | ---: | --- |
| `tests/test_slow.py` | 2 | 2.5 min | 60 % | 60 % | `test_case[0]` 75 s |
| `e2e/test_cluster.py` | 5 | 40 s | 30 % | 90 % | `test_case[0]` 8 s |
| `tests/test_many.py` | 40 | 9 s | 10 % | 100 % | `test_case[0]` 0 s |
"""
"""The last run's costs as `tools/test_costs.py` writes them: the costliest module is last in
collection order and has the fewest tests, so neither pytest's order nor xdist's count of
tests would start it first; `tests/test_few.py` is not listed (a module new since)."""

TREE = {
    "tests/test_many.py": 40,  # more tests than the engine unit: xdist alone would run it first
    "tests/test_few.py": 3,
    "tests/test_slow.py": 2,
    "e2e/test_cluster.py": 5,
    "e2e/engine/test_engine_a.py": 4,
    "e2e/engine/test_engine_b.py": 4,
}


def test_the_engine_tests_share_one_worker_first_and_modules_stay_whole(tmp_path: Path) -> None:
    for path, count in TREE.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(MODULE.format(count=count))
    (tmp_path / "recorder.py").write_text(RECORDER)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "test-costs.md").write_text(COSTS)
    log = tmp_path / "schedule.jsonl"
    env = {
        **os.environ,
        "SCHEDULE_LOG": str(log),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), str(ROOT / "operator")]),
    }
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "harness.pytest_schedule",
         "-n", "2", "-q", "tests", "e2e"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == sum(TREE.values()), records

    workers_of: dict[str, set[str]] = defaultdict(set)
    for r in records:
        workers_of[unit_of(r["test"])].add(r["worker"])
    assert all(len(w) == 1 for w in workers_of.values()), dict(workers_of)
    assert set(workers_of) == {ENGINE_TESTS, *(p for p in TREE if "engine" not in p)}

    (engine_worker,) = workers_of[ENGINE_TESTS]
    on_it = sorted((r for r in records if r["worker"] == engine_worker), key=lambda r: r["at"])
    engine_count = sum(n for p, n in TREE.items() if p.startswith(ENGINE_TESTS))
    first = [r["test"] for r in on_it[:engine_count]]
    assert all(t.startswith(ENGINE_TESTS) for t in first), [r["test"] for r in on_it]
    assert {"gw0", "gw1"} == {r["worker"] for r in records}, "the other worker ran nothing"
    others_first = min((r for r in records if r["worker"] != engine_worker), key=lambda r: r["at"])
    assert unit_of(others_first["test"]) == "tests/test_slow.py", "not the costliest first"

    base = os.getpriority(os.PRIO_PROCESS, 0)
    niceness = {r["test"]: r["nice"] for r in records}
    assert all(
        n == min(19, base + ENGINE_NICENESS)
        for t, n in niceness.items()
        if t.startswith(ENGINE_TESTS)
    ), niceness
    other = [r for r in records if r["worker"] != engine_worker]
    assert all(r["nice"] == base for r in other), other


def test_units() -> None:
    assert unit_of("e2e/engine/test_x.py::test_y[1]") == ENGINE_TESTS
    assert unit_of("e2e/engine/test_x.py::TestZ::test_y") == ENGINE_TESTS
    assert unit_of("e2e/test_epp.py::test_y[gie]") == "e2e/test_epp.py"
    assert unit_of("tests/render/test_r.py::TestA::test_b") == "tests/render/test_r.py"

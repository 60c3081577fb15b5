"""The real-engine benches' plans build from their arguments (no engine, no cluster here)."""

from __future__ import annotations

from bench import front_overhead


def test_front_overhead_real_mode_measures_1_8_and_64_in_one_run() -> None:
    args = front_overhead.parse_args(["--engine", "real"])
    plan = front_overhead.real_plan(args)
    assert [c for c, _ in plan.points] == [1, 8, 64]
    assert plan.streams == (False, True)
    assert all(n // plan.rounds > 0 for _, n in plan.points)
    quick = front_overhead.real_plan(front_overhead.parse_args(["--engine", "real", "--quick"]))
    assert quick.streams == (False,)
    assert sum(n for _, n in quick.points) < sum(n for _, n in plan.points)


def test_front_overhead_standin_mode_keeps_its_defaults() -> None:
    args = front_overhead.parse_args([])
    assert (args.engine, args.requests, args.rounds) == ("standin", 1200, 6)
    quick = front_overhead.parse_args(["--quick"])
    assert (quick.requests, quick.rounds) == (200, 2)

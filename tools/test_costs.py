#!/usr/bin/env python3
"""docs/test-costs.md: what each test module costs, from the JUnit XML of a `scripts/test` run.

`scripts/test` writes the XML (and its set-up steps' times) outside the clone, under
``$PROMPTCACHE_CACHE_DIR/last-run/``; this script sums each module's tests, set-up, call and
teardown together (pytest's JUnit `time` is all three; a module- or session-scoped fixture is
paid by the first test that asks for it, so by its module), and writes the table, costliest
first. It tells where the suite's time goes, so the next test that costs minutes shows.

Usage::

    python tools/test_costs.py                   # from the last scripts/test run (both parts)
    python tools/test_costs.py --junit run.xml --steps steps.tsv --out /tmp/costs.md
    python tools/test_costs.py --junit part1.xml --junit part2.xml   # one run in parts
"""

from __future__ import annotations

import argparse
import os
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("PROMPTCACHE_CACHE_DIR") or Path.home() / ".cache" / "promptcache")
LAST_RUN = CACHE / "last-run"
OUT = ROOT / "docs" / "test-costs.md"


@dataclass
class ModuleCost:
    """One test module's tests and their summed time (set-up + call + teardown)."""

    module: str
    seconds: float = 0.0
    tests: int = 0
    failed: int = 0
    skipped: int = 0
    slowest: tuple[float, str] = (0.0, "")
    names: list[str] = field(default_factory=list)

    def add(self, name: str, seconds: float, outcome: str) -> None:
        self.seconds += seconds
        self.tests += 1
        self.failed += outcome == "failed"
        self.skipped += outcome == "skipped"
        if seconds > self.slowest[0]:
            self.slowest = (seconds, name)


def module_of(classname: str, root: Path = ROOT) -> str:
    """The module's path for a JUnit `classname` (`e2e.test_epp` or `e2e.test_epp.TestX`):
    the longest dotted prefix that is a file of the checkout."""
    parts = classname.split(".")
    for n in range(len(parts), 0, -1):
        path = Path(*parts[:n]).with_suffix(".py")
        if (root / path).is_file():
            return path.as_posix()
    return classname.replace(".", "/") + ".py"


def outcome_of(case: ET.Element) -> str:
    if case.find("failure") is not None or case.find("error") is not None:
        return "failed"
    if case.find("skipped") is not None:
        return "skipped"
    return "passed"


def _suite(path: Path) -> ET.Element:
    root = ET.parse(path).getroot()  # noqa: S314 - our own run's report
    if root.tag == "testsuites":
        found = root.find("testsuite")
        if found is None:
            raise SystemExit(f"{path}: no <testsuite>")
        return found
    return root


def read_junit(*paths: Path, root: Path = ROOT) -> tuple[list[ModuleCost], ET.Element]:
    """Per-module costs from pytest JUnit XMLs (one run, or the parts of one run), costliest
    first, and the first run's test suite (when and where it ran)."""
    suites = [_suite(p) for p in paths]
    modules: dict[str, ModuleCost] = {}
    for suite in suites:
        for case in suite.iter("testcase"):
            module = module_of(case.get("classname", "?"), root)
            cost = modules.setdefault(module, ModuleCost(module))
            cost.add(case.get("name", "?"), float(case.get("time", "0")), outcome_of(case))
    first = suites[0]
    if len(suites) > 1:
        first.set("time", str(sum(float(s.get("time", "0")) for s in suites)))
    return sorted(modules.values(), key=lambda m: -m.seconds), first


def read_steps(path: Path) -> list[tuple[str, int]]:
    """`scripts/test`'s set-up steps (name TAB seconds), in order."""
    if not path.is_file():
        return []
    rows = [line.split("\t") for line in path.read_text().splitlines() if "\t" in line]
    return [(name, int(secs)) for name, secs in rows]


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def seconds_of(cell: str) -> float:
    """The inverse of `minutes`: ``"35 s"`` or ``"1.8 min"`` in seconds."""
    value, unit = cell.split()
    return float(value) * (60 if unit == "min" else 1)


def read_table(text: str) -> dict[str, float]:
    """Each module's cost in seconds, read back from a page `render` wrote: what
    `harness.pytest_schedule` hands out costliest first to the workers of a parallel run."""
    costs: dict[str, float] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 6 and cells[0].startswith("`") and cells[0].endswith(".py`"):
            costs[cells[0].strip("`")] = seconds_of(cells[2])
    return costs


def table(costs: Iterable[ModuleCost], total: float) -> list[str]:
    lines = [
        "| module | tests | cost | share | cumulative | slowest test |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    running = 0.0
    for m in costs:
        running += m.seconds
        share = 100 * m.seconds / total if total else 0.0
        cumulative = 100 * running / total if total else 0.0
        notes = []
        if m.failed:
            notes.append(f"{m.failed} failed")
        if m.skipped:
            notes.append(f"{m.skipped} skipped")
        tests = f"{m.tests}" + (f" ({', '.join(notes)})" if notes else "")
        slow_s, slow_name = m.slowest
        slowest = f"`{slow_name}` {slow_s:.0f} s" if slow_name else ""
        lines.append(
            f"| `{m.module}` | {tests} | {minutes(m.seconds)} | {share:.1f} % "
            f"| {cumulative:.0f} % | {slowest} |"
        )
    return lines


def render(
    costs: list[ModuleCost], suite: ET.Element, steps: list[tuple[str, int]], note: str = ""
) -> str:
    total = sum(m.seconds for m in costs)
    tests = sum(m.tests for m in costs)
    when = suite.get("timestamp", "?")[:16].replace("T", " ")
    host = suite.get("hostname", "?")
    out = [
        "# What the tests cost",
        "",
        "Generated by `python tools/test_costs.py` from the JUnit XML of a `scripts/test` run",
        "(`$PROMPTCACHE_CACHE_DIR/last-run/junit-unit.xml` and `junit.xml`); do not edit,",
        "regenerate it after a run. A module's cost is the sum of its tests' set-up, call and",
        "teardown: a module- or session-scoped fixture (the local cluster, a shared engine) is",
        "paid by the module of the first test that asks for it. The unit tests run on parallel",
        "workers (`harness/pytest_parts.py`), so their test time is more than their wall time.",
        "",
        f"Run of {when} UTC on `{host}`: {tests} tests in {len(costs)} modules, "
        f"{minutes(total)} of test time (pytest's own wall time: "
        f"{minutes(float(suite.get('time', '0')))}).",
        "",
    ]
    if note:
        out += [note, ""]
    if steps:
        out += ["## Set-up steps of `scripts/test`", "", "| step | time |", "| --- | ---: |"]
        out += [f"| {name} | {minutes(secs)} |" for name, secs in steps]
        out += [
            "",
            "The Go builds run in the background from the start; the wait for them is the",
            "part they add to the run.",
            "",
        ]
    out += ["## Test modules, costliest first", "", *table(costs, total), ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--junit",
        type=Path,
        action="append",
        help="a JUnit XML (repeat for the parts of one run); default: the last scripts/test run",
    )
    p.add_argument("--steps", type=Path, default=LAST_RUN / "steps.tsv")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--note", default="", help="a sentence under the header (e.g. a partial run)")
    args = p.parse_args(argv)
    # scripts/test's two runs: the unit tests on parallel workers, then the rest.
    junits: list[Path] = args.junit or [
        *([LAST_RUN / "junit-unit.xml"] if (LAST_RUN / "junit-unit.xml").is_file() else []),
        LAST_RUN / "junit.xml",
    ]
    missing = [str(j) for j in junits if not j.is_file()]
    if missing:
        print(f"no JUnit XML at {', '.join(missing)}: run scripts/test first", file=sys.stderr)
        return 1
    costs, suite = read_junit(*junits)
    args.out.write_text(render(costs, suite, read_steps(args.steps), args.note))
    print(f"wrote {args.out} ({len(costs)} modules)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

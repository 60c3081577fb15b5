"""Pytest plugin: how a run with pytest-xdist shares the suite between its worker processes:
`scripts/check`'s unit tests on several workers, `PROMPTCACHE_TEST_WORKERS=2 scripts/test`.

Why: run one test at a time, about half of the suite's time is the real-engine tests and
the other half everything else. Two workers, one of them given every real-engine test first,
overlap the two halves where the machine has the cores for it. On this project's 2-core
machines it does not: one engine under traffic keeps both cores busy (its worker and
engine-core processes spin between steps), so the split took 42 min against 43 and
`scripts/test` runs one process by default there.

- **Every test under `e2e/engine/` is one unit of work**, scheduled first: they share the
  session's engine pod and its fronts (`e2e/engine/conftest.py`), so on two workers they
  would start a second engine (4 GB, a minute of CPU) and compete for the machine's engine
  slots. One worker runs them in their usual order; the other starts on the rest at once.
- **Every other module is a unit of its own**, as `--dist loadfile` makes it: its module
  fixtures (an operator, a picker, a cluster namespace) start once, on one worker, and the
  guards' per-module checks (`harness.pytest_guards`, `e2e/conftest.py`) see the whole
  module on one process.
- **The worker running engine tests lowers its priority** (`ENGINE_NICENESS`, inherited by
  the engines it starts): one engine under traffic keeps both cores busy (its worker and
  engine-core processes spin between steps), and at equal priority it starved the other
  worker's tests, whose processes then missed their own deadlines. Niced, the engines take
  what the other worker leaves, and the whole machine once it is done.
- Each worker has its own session fixtures, so the control-plane tests of each start one
  local control plane per worker (they pick free ports and pod CIDRs; see
  `harness/localcluster/state.py`).

Units are handed out in collection order, which this plugin makes "engine tests first, then
the other modules costliest first" by the last recorded run (`docs/test-costs.md`): a long
module started last would run alone at the end while the other workers idle. xdist's own
reordering (largest unit first, by number of tests) is turned off, since a module's number
of tests says nothing about its time here (a corpus of 300 cases takes seconds; three
engine rollouts take ten minutes).

Registered by `harness.pytest_plugins.register`; inert without xdist.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tools.test_costs import read_table

COSTS = Path("docs/test-costs.md")
"""The last recorded run's cost of each module (`tools/test_costs.py` writes it)."""
ENGINE_TESTS = "e2e/engine/"
"""The node-id prefix of the real-engine tests: one unit of work, first."""
TAKEN_OVER = frozenset({"load", "loadscope", "loadfile", "loadgroup"})
"""The distributions this plugin replaces: each would split the engine tests over workers
(`load`, `loadscope`, `loadfile`) or need every test marked (`loadgroup`)."""


ENGINE_NICENESS = 10
"""How much lower the engine worker's priority is: a tenth of the CPU share of a process at
the default priority (the kernel's weights), so the engines still get at least what a core
kept busy by something else leaves them, a condition the engine tests are held to."""
_reniced = False


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: all engine tests together, else its module."""
    if nodeid.startswith(ENGINE_TESTS):
        return ENGINE_TESTS
    return nodeid.split("::", 1)[0]


def recorded_costs(root: Path) -> dict[str, float]:
    """Each module's cost in seconds as the last recorded run measured it (`COSTS`); empty
    where the page is missing or unreadable, which only loses the ordering."""
    try:
        return read_table((root / COSTS).read_text())
    except (OSError, ValueError):
        return {}


def run_order(items: list[pytest.Item], costs: Mapping[str, float]) -> None:
    """Reorder in place: the engine tests first, in their order; then each other module
    whole, costliest first by `costs` (a module not in it last), each in its own order."""

    def key(item: pytest.Item) -> tuple[bool, float]:
        if item.nodeid.startswith(ENGINE_TESTS):
            return (False, 0.0)
        return (True, -costs.get(unit_of(item.nodeid), 0.0))

    items.sort(key=key)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Only on an xdist worker, so a run of one process keeps pytest's own order. Every
    # worker sorts the same way, as xdist requires of their collections.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        run_order(items, recorded_costs(config.rootpath))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before the test's fixtures start anything (the session's engine among them).
    global _reniced  # noqa: PLW0603 - once per worker process
    if _reniced or not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if item.nodeid.startswith(ENGINE_TESTS):
        os.nice(ENGINE_NICENESS)
        _reniced = True


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") not in TAKEN_OVER:
        return None
    from xdist.scheduler import (  # type: ignore[import-untyped]  # noqa: PLC0415 - under xdist only
        LoadScopeScheduling,
    )

    class EngineFirstScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """xdist's scope scheduler with the units of `unit_of`, in collection order."""

        def __init__(self, config: pytest.Config, log: Any = None) -> None:
            super().__init__(config, log)
            config.option.loadscopereorder = False

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return EngineFirstScheduling(config, log)

"""Pytest plugin: ``PROMPTCACHE_TEST_PART=unit`` or ``=rest`` splits the suite into the two
runs that `scripts/test` makes, and `scripts/check` makes the first of.

Why two parts: the unit tests (under ``tests/``, none of the `HEAVY` markers) mostly wait
on real deadlines and sockets, not on the CPU, so they share two cores well with each other
on several pytest-xdist workers (about 100 s, against about 4.5 min one at a time). The rest
needs the session's one control plane and the real engine, and runs in one process after
them. Which tests are unit tests is defined here once, for both scripts, instead of as a
marker expression copied into each.

An environment variable rather than a command-line option: this plugin is registered from
the test trees' conftests (`harness.pytest_plugins`), after pytest has parsed its options,
and xdist's workers inherit the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import pytest

HEAVY = ("cluster", "helm", "epp", "prometheus", "slow", "engine", "images")
"""Markers of a test that needs more than the Python environment, or many seconds of it."""
UNIT_TREE = "tests/"
"""Where the unit tests live (node-id prefix); everything in `e2e/` is in the rest."""
PARTS = ("unit", "rest")
PART_ENV = "PROMPTCACHE_TEST_PART"
"""Unset or empty: every test."""


def is_unit(item: pytest.Item) -> bool:
    return item.nodeid.startswith(UNIT_TREE) and not any(
        item.get_closest_marker(name) for name in HEAVY
    )


def part_of(env: Mapping[str, str]) -> str | None:
    part = env.get(PART_ENV) or None
    if part is not None and part not in PARTS:
        raise pytest.UsageError(f"{PART_ENV}={part!r}: expected one of {', '.join(PARTS)}")
    return part


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    part = part_of(os.environ)
    if part is None:
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        (keep if is_unit(item) == (part == "unit") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep

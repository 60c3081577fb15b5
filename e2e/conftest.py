"""Registers the shared cluster fixtures (see pytest_cluster.py) for the e2e tree.

The e2e helpers (`pytest_cluster`, `operator_harness`, `epp`) are importable because
pyproject.toml puts `e2e/` on pytest's `pythonpath`, and so is the checkout root (some e2e
tests reuse the unit tests' cases, `tests.render.*`, under a bare `pytest e2e/...`); no
module edits `sys.path`.
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Registered once per session whichever conftest loads first, so `tests/` and `e2e/`
    # share one session cluster instead of defining the fixture twice.
    if not config.pluginmanager.has_plugin("pytest_cluster"):
        import pytest_cluster  # noqa: PLC0415 - only when not registered yet

        config.pluginmanager.register(pytest_cluster, "pytest_cluster")

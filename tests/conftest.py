"""Registers the shared cluster fixtures (see e2e/pytest_cluster.py) for tests/ too."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_E2E = str(Path(__file__).resolve().parents[1] / "e2e")
if _E2E not in sys.path:
    sys.path.insert(0, _E2E)


def pytest_configure(config: pytest.Config) -> None:
    # Registered once per session whichever conftest loads first, so `tests/` and `e2e/`
    # share one session cluster instead of defining the fixture twice.
    if not config.pluginmanager.has_plugin("pytest_cluster"):
        import pytest_cluster

        config.pluginmanager.register(pytest_cluster, "pytest_cluster")

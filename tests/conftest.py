"""Registers the shared cluster fixtures (see e2e/pytest_cluster.py) for tests/ too.

`e2e` is a package next to `tests`, so its helpers import as `e2e.*`.
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Registered once per session whichever conftest loads first, so `tests/` and `e2e/`
    # share one session cluster instead of defining the fixture twice.
    if not config.pluginmanager.has_plugin("pytest_cluster"):
        from e2e import pytest_cluster

        config.pluginmanager.register(pytest_cluster, "pytest_cluster")

"""Registers the shared cluster fixtures (see pytest_cluster.py) for the e2e tree.

`e2e` is a package, imported from the checkout root as `tests` is: its helpers import as
`e2e.pytest_cluster`, `e2e.operator_harness`, `e2e.epp.*`, `e2e.localcluster.*`, and e2e
tests reuse the unit tests' cases (`tests.render.*`); no module edits `sys.path`.
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Registered once per session whichever conftest loads first, so `tests/` and `e2e/`
    # share one session cluster instead of defining the fixture twice.
    if not config.pluginmanager.has_plugin("pytest_cluster"):
        from e2e import pytest_cluster  # noqa: PLC0415 - only when not registered yet

        config.pluginmanager.register(pytest_cluster, "pytest_cluster")

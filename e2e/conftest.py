"""Registers the shared cluster fixtures (harness/pytest_cluster.py) for the e2e tree.

`e2e` is a package, imported from the checkout root as `tests` is. What its tests share
with the unit tests, the benches and the demo lives in `harness` (`harness.pytest_cluster`,
`harness.operator`, `harness.epp.*`, `harness.engine.*`); the control plane itself is
`e2e.localcluster`. No test imports another test module, and no module edits `sys.path`.
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Registered once per session whichever conftest loads first, so `tests/` and `e2e/`
    # share one session cluster instead of defining the fixture twice.
    if not config.pluginmanager.has_plugin("pytest_cluster"):
        from harness import pytest_cluster  # noqa: PLC0415 - only when not registered yet

        config.pluginmanager.register(pytest_cluster, "pytest_cluster")

"""Registers the shared cluster fixtures (see harness/pytest_cluster.py) for tests/ too."""

from __future__ import annotations

import pytest
from hypothesis import settings

# No per-example deadline: the machines are shared and noisy, and a timing assertion is a
# benchmark's job (bench/), not a property test's. Tests that set their own keep theirs.
settings.register_profile("promptcache", deadline=None)
settings.load_profile("promptcache")


def pytest_configure(config: pytest.Config) -> None:
    # Registered once per session whichever conftest loads first, so `tests/` and `e2e/`
    # share one session cluster instead of defining the fixture twice.
    if not config.pluginmanager.has_plugin("pytest_cluster"):
        from harness import pytest_cluster

        config.pluginmanager.register(pytest_cluster, "pytest_cluster")
    if not config.pluginmanager.has_plugin("pytest_guards"):
        from harness import pytest_guards

        config.pluginmanager.register(pytest_guards, "pytest_guards")

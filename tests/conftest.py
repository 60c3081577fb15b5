"""Registers the harness's pytest plugins (harness/pytest_plugins.py) for tests/ too."""

from __future__ import annotations

import pytest
from hypothesis import settings

from harness.pytest_plugins import register

# No per-example deadline: the machines are shared and noisy, and a timing assertion is a
# benchmark's job (bench/), not a property test's. Tests that set their own keep theirs.
settings.register_profile("promptcache", deadline=None)
settings.load_profile("promptcache")


def pytest_configure(config: pytest.Config) -> None:
    register(config)

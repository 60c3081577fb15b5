"""The pytest plugins every test tree of this checkout uses, registered once per session.

Why one function: `tests/` and `e2e/` each have a conftest, and a session may load either
or both; each plugin must be registered exactly once whichever loads first (so the trees
share one session cluster instead of defining the fixture twice).
"""

from __future__ import annotations

import importlib

import pytest

PLUGINS = ("pytest_cluster", "pytest_guards", "pytest_parts", "pytest_schedule")
"""Modules of `harness`, registered under their own names."""


def register(config: pytest.Config) -> None:
    for name in PLUGINS:
        if not config.pluginmanager.has_plugin(name):
            config.pluginmanager.register(importlib.import_module(f"harness.{name}"), name)

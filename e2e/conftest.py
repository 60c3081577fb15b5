"""Registers the shared cluster fixtures (see pytest_cluster.py) for the e2e tree."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_E2E = str(Path(__file__).resolve().parent)
if _E2E not in sys.path:
    sys.path.insert(0, _E2E)
# Some e2e tests run the unit tests' cases against the API server (`tests.render.*`); with a
# bare `pytest e2e/...` the checkout root is not on the path otherwise.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.append(_ROOT)


def pytest_configure(config: pytest.Config) -> None:
    # Registered once per session whichever conftest loads first, so `tests/` and `e2e/`
    # share one session cluster instead of defining the fixture twice.
    if not config.pluginmanager.has_plugin("pytest_cluster"):
        import pytest_cluster  # noqa: PLC0415 - importable only after the path insert

        config.pluginmanager.register(pytest_cluster, "pytest_cluster")

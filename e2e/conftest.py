"""Registers the harness's pytest plugins (harness/pytest_plugins.py) for the e2e tree.

`e2e` is a package, imported from the checkout root as `tests` is. What its tests share
with the unit tests, the benches and the demo lives in `harness` (`harness.pytest_cluster`,
`harness.operator`, `harness.epp.*`, `harness.engine.*`); the control plane itself is
`harness.localcluster`. No test imports another test module, and no module edits `sys.path`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.pod import running_pods
from harness.pytest_plugins import register


def pytest_configure(config: pytest.Config) -> None:
    register(config)


@pytest.fixture(scope="module", autouse=True)
def no_pod_outlives_its_module() -> Iterator[None]:
    """A module that leaves a pod running fails here, and the pod is stopped.

    A pod left running holds an engine slot for the rest of the session: the next module
    that needs engines then waits for a slot that never frees (half an hour each) and the
    whole run times out far from the test that leaked it."""
    before = set(running_pods())
    yield
    leaked = [p for p in running_pods() if p not in before and not p.outlives_module]
    for pod in leaked:
        pod.stop()
    if leaked:
        names = ", ".join(f"{p.name} ({p.ip})" for p in leaked)
        pytest.fail(f"this module left {len(leaked)} pod(s) running (now stopped): {names}")

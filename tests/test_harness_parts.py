"""harness/pytest_parts.py: `PROMPTCACHE_TEST_PART=unit` and `=rest` split a real pytest
session's tests in two, every test in exactly one part, the unit tests being those under
tests/ without a heavy marker (on the test, its class or its module)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.pytest_parts import HEAVY, PART_ENV

ROOT = Path(__file__).resolve().parent.parent

UNIT_MODULE = """
import pytest

def test_plain():
    pass

@pytest.mark.parametrize(
    "heavy", [pytest.param(name, marks=getattr(pytest.mark, name)) for name in {heavy!r}]
)
def test_marked(heavy):
    pass

@pytest.mark.cluster
class TestOnACluster:
    def test_in_a_marked_class(self):
        pass
"""

MARKED_MODULE = """
import pytest

pytestmark = pytest.mark.engine

def test_in_a_marked_module():
    pass
"""

E2E_MODULE = """
def test_unmarked_but_end_to_end():
    pass
"""

TREE = {
    "tests/test_u.py": UNIT_MODULE.format(heavy=list(HEAVY)),
    "tests/test_m.py": MARKED_MODULE,
    "e2e/test_e.py": E2E_MODULE,
}


def _collected(tree: Path, part: str | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "operator")])}
    env.pop(PART_ENV, None)
    if part is not None:
        env[PART_ENV] = part
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "harness.pytest_parts",
         "--collect-only", "-q", "tests", "e2e"],
        cwd=tree, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _ids(run: subprocess.CompletedProcess[str]) -> set[str]:
    assert run.returncode == 0, run.stdout + run.stderr
    return {line for line in run.stdout.splitlines() if "::" in line}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for path, text in TREE.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return tmp_path


def test_the_two_parts_split_the_session_in_two(tree: Path) -> None:
    everything = _ids(_collected(tree, None))
    unit = _ids(_collected(tree, "unit"))
    rest = _ids(_collected(tree, "rest"))
    assert unit == {"tests/test_u.py::test_plain"}
    assert unit | rest == everything
    assert not unit & rest
    assert len(everything) == 1 + len(HEAVY) + 1 + 1 + 1


def test_an_unknown_part_is_refused_with_the_choices(tree: Path) -> None:
    run = _collected(tree, "units")
    assert run.returncode != 0
    assert f"{PART_ENV}='units': expected one of unit, rest" in run.stdout + run.stderr

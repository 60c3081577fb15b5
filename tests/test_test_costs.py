"""tools/test_costs.py: module costs from the JUnit XML a real pytest run writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tools.test_costs import module_of, read_junit, read_steps, render

SLOW = """
import time
import pytest

@pytest.fixture(scope="module")
def costly():
    time.sleep(0.3)
    yield
    time.sleep(0.2)

def test_pays_the_module_fixture(costly):
    pass

class TestInAClass:
    def test_after(self, costly):
        time.sleep(0.1)
"""

FAST = """
import pytest

def test_fails():
    assert False

@pytest.mark.skip(reason="not here")
def test_skipped():
    pass
"""


def test_costs_sum_set_up_call_and_teardown_per_module(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "test_slow.py").write_text(SLOW)
    (tmp_path / "pkg" / "test_fast.py").write_text(FAST)
    xml = tmp_path / "junit.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--junitxml={xml}"],
        cwd=tmp_path,
        capture_output=True,
        check=False,
    )
    costs, suite = read_junit(xml, root=tmp_path)
    assert [m.module for m in costs] == ["pkg/test_slow.py", "pkg/test_fast.py"]
    slow, fast = costs
    assert slow.tests == 2
    assert slow.seconds >= 0.6  # the fixture's set-up and teardown count, and the call
    assert (fast.tests, fast.failed, fast.skipped) == (2, 1, 1)

    (tmp_path / "steps.tsv").write_text("bootstrap\t12\nwaiting for the Go builds\t300\n")
    text = render(costs, suite, read_steps(tmp_path / "steps.tsv"))
    assert "| waiting for the Go builds | 5.0 min |" in text
    assert "| `pkg/test_fast.py` | 2 (1 failed, 1 skipped) |" in text
    assert text.index("pkg/test_slow.py") < text.index("pkg/test_fast.py")


def test_a_class_inside_a_module_counts_for_the_module(tmp_path: Path) -> None:
    (tmp_path / "e2e").mkdir()
    (tmp_path / "e2e" / "test_x.py").write_text("")
    assert module_of("e2e.test_x.TestThing", tmp_path) == "e2e/test_x.py"
    assert module_of("e2e.test_x", tmp_path) == "e2e/test_x.py"

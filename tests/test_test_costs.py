"""tools/test_costs.py: module costs from the JUnit XML a real pytest run writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tools.test_costs import (
    OUT,
    minutes,
    module_of,
    read_junit,
    read_steps,
    read_table,
    render,
    seconds_of,
)

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

    # What a parallel run orders its modules by reads the same page back.
    read = read_table(text)
    assert set(read) == {"pkg/test_slow.py", "pkg/test_fast.py"}
    assert abs(read["pkg/test_slow.py"] - slow.seconds) <= 0.5


@given(st.floats(min_value=0, max_value=10 * 3600, allow_nan=False))
def test_a_printed_cost_reads_back_within_its_rounding(seconds: float) -> None:
    # Whole seconds below 90 s, tenths of a minute above.
    assert abs(seconds_of(minutes(seconds)) - seconds) <= (0.5 if seconds < 89.5 else 3.0)


def test_the_committed_table_reads_back_every_module_it_lists() -> None:
    text = OUT.read_text()
    header = next(line for line in text.splitlines() if line.startswith("Run of "))
    listed = int(header.split(" tests in ")[1].split(" modules")[0])
    costs = read_table(text)
    assert len(costs) == listed
    assert all(path.endswith(".py") and seconds >= 0 for path, seconds in costs.items())


def test_a_class_inside_a_module_counts_for_the_module(tmp_path: Path) -> None:
    (tmp_path / "e2e").mkdir()
    (tmp_path / "e2e" / "test_x.py").write_text("")
    assert module_of("e2e.test_x.TestThing", tmp_path) == "e2e/test_x.py"
    assert module_of("e2e.test_x", tmp_path) == "e2e/test_x.py"

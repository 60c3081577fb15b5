"""Every example's render is checked in (tests/render/golden/), so a change to any rendered
manifest is a visible diff in review; `python tools/render_examples.py` regenerates them."""

from __future__ import annotations

from tools import render_examples


def test_every_example_has_a_fresh_golden_render() -> None:
    stale = render_examples.stale_files()
    assert not stale, f"stale golden renders {stale}: run python tools/render_examples.py"


def test_there_is_a_golden_render_per_example() -> None:
    golden = {p.name for p in render_examples.GOLDEN.glob("*.yaml")}
    examples = {p.name for p in render_examples.EXAMPLES.glob("*.yaml")}
    assert golden == examples
    assert examples

"""Tests import the harness, never each other (issue 38): what two test modules share lives
in `harness/`, where the next test finds it, instead of in one test module (or a
`conftest.py`) that another imports, which ties the two together and runs the first's
module-level set-up for the second."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def modules_of_tests() -> list[Path]:
    """Every test module and conftest under tests/ and e2e/."""
    return sorted(
        p
        for tree in ("tests", "e2e")
        for p in (ROOT / tree).rglob("*.py")
        if p.name.startswith("test_") or p.name == "conftest.py"
    )


def imports_of_tests(source: str) -> list[str]:
    """The imports in `source` of another test module: relative ones, and any of `tests.*`
    or `e2e.*` (the local cluster tool, which tests import, is `harness.localcluster`)."""

    def is_test(module: str) -> bool:
        return module.partition(".")[0] in ("tests", "e2e")

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level > 0 or is_test(node.module or ""):
                found.append(f"{node.lineno}: from {'.' * node.level}{node.module or ''}")
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if is_test(a.name)]
    return found


def test_no_test_module_imports_another() -> None:
    found = {
        str(p.relative_to(ROOT)): hits
        for p in modules_of_tests()
        if (hits := imports_of_tests(p.read_text(encoding="utf-8")))
    }
    assert found == {}, f"move what they share into harness/ and import it from there: {found}"


def test_the_scan_finds_each_form() -> None:
    """The scan would catch what it forbids (else the test above could never fail)."""
    for source in (
        "from .conftest import SECRET\n",
        "from . import conftest\n",
        "from .test_front_embeds import _tensor\n",
        "from tests.embeds.vectors_lib import object_from_vector\n",
        "from e2e.demo_traffic import ladder_section\n",
        "import tests.front.conftest\n",
        "def f():\n    from .test_x import y\n",
    ):
        assert imports_of_tests(source), source
    allowed = "from harness.localcluster import state\nfrom harness.waiting import eventually\n"
    assert imports_of_tests(allowed) == []

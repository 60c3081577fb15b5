"""Nothing in the checkout edits the import path: the e2e helpers, the unit tests' cases and
the tools are packages (`e2e.*`, `tests.*`, `tools.*`) imported from the checkout root, which
pytest and `python -m bench.NAME` start from. A module that patched `sys.path` would import
a second copy of a helper under another name (two `Cluster` classes, two registries) and
work only from the directory it was written for."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("operator", "tests", "e2e", "bench", "tools", "scripts")
SCRIPTS = ("e2e/cluster", "e2e/demo")  # Python without a .py suffix


def path_edits(source: str) -> list[int]:
    """Lines that change the import path: `sys.path.<method>(...)`, an assignment to
    `sys.path` or one of its items, `site.addsitedir(...)`."""

    def is_sys_path(node: ast.AST) -> bool:
        base = node.value if isinstance(node, ast.Subscript) else node
        return (
            isinstance(base, ast.Attribute)
            and base.attr == "path"
            and isinstance(base.value, ast.Name)
            and base.value.id == "sys"
        )

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if is_sys_path(owner) or (
                isinstance(owner, ast.Name)
                and owner.id == "site"
                and node.func.attr == "addsitedir"
            ):
                lines.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(is_sys_path(t) for t in targets):
                lines.append(node.lineno)
    return lines


def python_files() -> list[Path]:
    files = [p for tree in TREES for p in (ROOT / tree).rglob("*.py")]
    return files + [ROOT / s for s in SCRIPTS]


def test_no_module_edits_the_import_path() -> None:
    found = {
        str(p.relative_to(ROOT)): hits
        for p in python_files()
        if (hits := path_edits(p.read_text(encoding="utf-8")))
    }
    assert found == {}, f"import these as packages from the checkout root instead: {found}"


def test_pytest_adds_no_import_path() -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    assert "pythonpath" not in options["ini_options"]


def test_the_check_finds_each_form_of_path_edit() -> None:
    """The scan would catch what it forbids (else the test above could never fail)."""
    for source in (
        "import sys\nsys.path.insert(0, 'e2e')\n",
        "import sys\nsys.path.append('e2e')\n",
        "import sys\nsys.path[:0] = ['e2e']\n",
        "import sys\nsys.path = ['e2e', *sys.path]\n",
        "import sys\nsys.path += ['e2e']\n",
        "import site\nsite.addsitedir('e2e')\n",
        "def f():\n    import sys\n    sys.path.extend(['x'])\n",
    ):
        assert path_edits(source), source
    assert path_edits("import sys\nprint(sys.path[0])\nsys.exit(0)\n") == []


def test_the_helpers_are_packages() -> None:
    for package in (
        "e2e",
        "harness",
        "harness/localcluster",
        "harness/epp",
        "harness/engine",
        "harness/vllm",
        "tests",
        "tools",
        "bench",
    ):
        assert (ROOT / package / "__init__.py").is_file(), package

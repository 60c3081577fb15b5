"""The architecture's "never" rules are import contracts (pyproject.toml, [tool.importlinter]):
the tree keeps them, and a deliberate violation breaks the check, so it can fail the build."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")


def _lint(tree: Path, workdir: Path) -> subprocess.CompletedProcess[str]:
    """Run the contracts of pyproject.toml over the package in `tree`."""
    return subprocess.run(
        [LINT_IMPORTS, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=workdir,
        env={"PYTHONPATH": str(tree), "PATH": str(Path(sys.executable).parent)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _copy(tmp_path: Path) -> Path:
    tree = tmp_path / "operator"
    shutil.copytree(ROOT / "operator" / "promptcache", tree / "promptcache")
    return tree


def test_the_tree_keeps_every_contract(tmp_path: Path) -> None:
    result = _lint(ROOT / "operator", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "bad_import", "contract"),
    [
        ("render/names.py", "import promptcache.controller.kube", "render is pure"),
        ("render/names.py", "import socket", "render is pure"),
        ("tenancy/policy.py", "import promptcache.controller.status", "the data plane never"),
        ("embeds/cache.py", "import lightkube", "the data plane never"),
        ("api/spec.py", "import promptcache.render", "api imports nothing of ours"),
        ("controller/status.py", "import torch", "the operator never imports torch"),
        ("contract/names.py", "import promptcache.api", "the contract imports nothing"),
        ("front/app.py", "import harness.vllm", "the product never imports test code"),
        ("gateway/command.py", "import harness.localcluster.state", "the product never imports"),
        ("gateway/policy_step.py", "import promptcache.front.app", "the cache front and the"),
        ("front/app.py", "import promptcache.gateway.settings", "the cache front and the"),
        ("tenancy/routes.py", "import promptcache.front.settings", "tenancy is below both"),
        ("runtime/spawn.py", "import promptcache.gateway.settings", "the runtime is below both"),
    ],
)
def test_a_deliberate_violation_breaks_its_contract(
    tmp_path: Path, module: str, bad_import: str, contract: str
) -> None:
    tree = _copy(tmp_path)
    target = tree / "promptcache" / module
    target.write_text(target.read_text() + f"\n{bad_import}  # injected by the test\n")
    result = _lint(tree, tmp_path)
    assert result.returncode != 0, result.stdout
    broken = [line for line in result.stdout.splitlines() if line.endswith("BROKEN")]
    assert any(line.startswith(contract) for line in broken), result.stdout


def test_the_cli_imports_each_plane_where_the_contracts_see_it() -> None:
    """Plain (lazy) import statements, not `importlib`: every arrow is in the graph."""
    import grimp

    graph = grimp.build_graph("promptcache")
    for plane in ("front", "controller", "gateway"):
        assert graph.direct_import_exists(
            importer="promptcache.cli", imported=f"promptcache.{plane}.command"
        ), plane
    assert "importlib" not in (ROOT / "operator" / "promptcache" / "cli.py").read_text()


def _imports(path: Path) -> list[str]:
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return found


def test_test_code_shares_helpers_through_the_harness_only() -> None:
    """Tests, e2e, benches, tools and the harness never import a test module or another
    test package's files: what two of them share lives in `harness/`."""
    bad = []
    for top in ("tests", "e2e", "bench", "harness", "tools"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT)
            own = ".".join(rel.parts[:2]) if top == "tests" and len(rel.parts) > 2 else None
            for name in _imports(path):
                parts = name.split(".")
                if parts[0] not in ("tests", "e2e"):
                    continue
                if any(p.startswith("test_") or p == "conftest" for p in parts[1:]):
                    bad.append(f"{rel}: imports {name}")
                elif parts[0] == "tests" and not (own and name.startswith(own + ".")):
                    bad.append(f"{rel}: imports {name} (another test package's file)")
    assert not bad, "\n".join(bad)

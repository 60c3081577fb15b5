"""`promptcache rbac` reads its rules from package data: it works from an installed package
(a wheel, the image), not only from a checkout whose chart lies above the package."""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "promptcache"


def test_rbac_runs_from_a_package_outside_the_checkout(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    shutil.copytree(PACKAGE, site / "promptcache", ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run(
        [sys.executable, "-c", "from promptcache.cli import main; main(['rbac'])"],
        env={"PYTHONPATH": str(site), "PATH": str(Path(sys.executable).parent)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    roles = list(yaml.safe_load_all(result.stdout))
    assert [r["kind"] for r in roles] == ["ClusterRole", "Role", "ClusterRole"]
    assert any("promptcachedeployments" in r["resources"] for r in roles[0]["rules"])


def test_the_rules_files_are_declared_package_data() -> None:
    """A file the wheel leaves out would fail only after release: check the globs."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["promptcache"]
    rules = sorted((PACKAGE / "controller" / "rbac_rules").glob("*.yaml"))
    assert rules
    for path in rules:
        relative = str(path.relative_to(PACKAGE))
        assert any(fnmatch.fnmatch(relative, g) for g in globs), relative


def test_the_chart_carries_the_package_rules_verbatim() -> None:
    for path in sorted((PACKAGE / "controller" / "rbac_rules").glob("*.yaml")):
        chart = ROOT / "charts" / "promptcache-operator" / "files" / path.name
        assert chart.read_text() == path.read_text(), f"run tools/install_assets.py ({path.name})"

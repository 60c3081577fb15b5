"""The CLI's happy paths: render to stdout and to a folder, crd, version."""

from __future__ import annotations

from pathlib import Path

import yaml

from harness.cli import run_cli
from promptcache._version import __version__
from promptcache.api.crd import custom_resource_definition

ROOT = Path(__file__).resolve().parents[2]


def test_render_to_stdout_is_multi_document_yaml() -> None:
    result = run_cli("render", "-f", "examples/minimal.yaml", cwd=ROOT)
    assert result.returncode == 0, result.stderr
    docs = list(yaml.safe_load_all(result.stdout))
    kinds = [d["kind"] for d in docs]
    assert kinds == [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Service",
        "Service",
        "NetworkPolicy",
        "Deployment",
        "Deployment",
        "PodDisruptionBudget",
        "InferencePool",
    ]
    assert "reads its salt key from Secret 'qwen-small-salt'" in result.stderr


def test_render_to_a_folder_writes_one_file_per_manifest(tmp_path: Path) -> None:
    result = run_cli(
        "render", "-f", str(ROOT / "examples" / "multi-tenant.yaml"), "-o", str(tmp_path), cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    folder = tmp_path / "inference" / "llama-tenants"
    files = sorted(p.name for p in folder.iterdir())
    assert files[0] == "00-serviceaccount-llama-tenants-epp.yaml"
    assert "06-networkpolicy-llama-tenants-epp.yaml" in files
    assert "11-httproute-llama-tenants.yaml" in files
    assert len(files) == 12
    route = yaml.safe_load((folder / "11-httproute-llama-tenants.yaml").read_text())
    assert route["spec"]["hostnames"] == ["llm.example.com"]


def test_crd_command_prints_the_generated_crd() -> None:
    result = run_cli("crd", cwd=ROOT)
    assert result.returncode == 0
    assert yaml.safe_load(result.stdout) == custom_resource_definition()


def test_version() -> None:
    result = run_cli("version", cwd=ROOT)
    assert result.stdout.strip() == __version__

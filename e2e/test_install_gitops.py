"""GitOps on a real API server: what is committed to Git applies once and then stays equal.

A GitOps tool (Argo CD, Flux) re-applies the repository and diffs it against the live
state over and over. These tests check the two things that make that quiet:
- applying the same object again with server-side apply writes nothing and
  `kubectl diff --server-side` exits 0;
- the CRD's defaults, filled in by the API server, do not show up as a difference between
  the committed (short) resource and the live (defaulted) one.
And the same for the render-only flow (`promptcache render -o DIR`, committed and applied)
and for the kustomize base in `config/`.
"""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.operator import wait_established
from harness.pytest_cluster import Cluster

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "serving.promptcache.io_promptcachedeployments.yaml"
CRD_NAME = "promptcachedeployments.serving.promptcache.io"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
MANAGER = "gitops"


@pytest.fixture(scope="module")
def crd(cluster: Cluster) -> str:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    wait_established(cluster.kubectl, CRD_NAME)
    return CRD_NAME


def moved(path: Path, namespace: str) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
    return docs


def write(docs: list[dict[str, Any]], path: Path) -> Path:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def apply(cluster: Cluster, *target: str) -> None:
    cluster.kubectl("apply", "--server-side", f"--field-manager={MANAGER}", *target)


def diff(
    cluster: Cluster, *target: str, server_side: bool = True
) -> subprocess.CompletedProcess[str]:
    mode = ["--server-side", f"--field-manager={MANAGER}"] if server_side else []
    proc = cluster.kubectl("diff", *mode, *target, check=False)
    assert proc.returncode in (0, 1), f"kubectl diff failed:\n{proc.stderr}"
    return proc


def our_writes(cluster: Cluster, docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per object: its generation and the managedFields entry of our manager.

    Controllers keep writing status (a Deployment's rollout), so resourceVersion moves on
    its own; a write of *ours* shows as a new timestamp or field set in our own entry.
    """
    out = {}
    for doc in docs:
        kind = doc["kind"].lower()
        group = doc["apiVersion"].rpartition("/")[0]
        resource = f"{kind}.{group}" if group else kind
        meta = doc["metadata"]
        scope = ["-n", meta["namespace"]] if "namespace" in meta else []
        live = cluster.get_json(resource, meta["name"], *scope, "--show-managed-fields")
        ours = [m for m in live["metadata"]["managedFields"] if m["manager"] == MANAGER]
        assert ours, f"{resource}/{meta['name']} has no fields of manager {MANAGER}"
        out[f"{resource}/{meta['name']}"] = (live["metadata"].get("generation"), ours)
    return out


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_applying_a_committed_resource_twice_changes_nothing(
    cluster: Cluster, crd: str, namespace: str, example: Path, tmp_path: Path
) -> None:
    docs = moved(example, namespace)
    committed = write(docs, tmp_path / example.name)
    apply(cluster, "-f", str(committed))
    before = our_writes(cluster, docs)

    apply(cluster, "-f", str(committed))
    assert our_writes(cluster, docs) == before, "the second apply wrote the object"
    for server_side in (True, False):
        same = diff(cluster, "-f", str(committed), server_side=server_side)
        assert same.returncode == 0, same.stdout
        assert same.stdout == ""

    # The check can fail: a real change in Git is a diff.
    docs[0]["spec"]["model"]["replicas"] = docs[0]["spec"]["model"].get("replicas", 1) + 3
    changed = diff(cluster, "-f", str(write(docs, tmp_path / "changed.yaml")))
    assert changed.returncode == 1
    assert "replicas:" in changed.stdout


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_crd_defaults_are_not_drift(
    cluster: Cluster, crd: str, namespace: str, example: Path, tmp_path: Path
) -> None:
    docs = moved(example, namespace)
    committed = write(docs, tmp_path / example.name)
    apply(cluster, "-f", str(committed))
    for doc in docs:
        live = cluster.get_json("pcd", doc["metadata"]["name"], "-n", namespace)
        # The API server filled defaults the committed file does not spell out...
        assert len(yaml.safe_dump(live["spec"])) > len(yaml.safe_dump(doc["spec"]))
        assert _contains(live["spec"], doc["spec"]), "live spec lost a committed value"
    # ...and neither diff mode reports them as a difference.
    assert diff(cluster, "-f", str(committed)).stdout == ""
    assert diff(cluster, "-f", str(committed), server_side=False).stdout == ""


def _contains(live: Any, committed: Any) -> bool:
    """Every committed value is live; defaults may have been added (also inside list items)."""
    if isinstance(committed, dict):
        return isinstance(live, dict) and all(
            k in live and _contains(live[k], v) for k, v in committed.items()
        )
    if isinstance(committed, list):
        return (
            isinstance(live, list)
            and len(live) == len(committed)
            and all(_contains(a, b) for a, b in zip(live, committed, strict=True))
        )
    return bool(live == committed)


def render(source: Path, out: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "promptcache.cli", "render", "-f", str(source), "-o", str(out)],
        check=True,
        capture_output=True,
        timeout=60,
    )


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_render_output_is_stable_and_applies_without_drift(
    cluster: Cluster, namespace: str, example: Path, tmp_path: Path
) -> None:
    source = write(moved(example, namespace), tmp_path / example.name)
    first, second = tmp_path / "first", tmp_path / "second"
    render(source, first)
    render(source, second)
    comparison = filecmp.dircmp(first, second)
    files = sorted(p.relative_to(first) for p in first.rglob("*.yaml"))
    assert files, "render wrote nothing"
    assert sorted(p.relative_to(second) for p in second.rglob("*.yaml")) == files
    for rel in files:
        assert (first / rel).read_bytes() == (second / rel).read_bytes(), f"{rel} differs"
    assert not comparison.diff_files

    apply(cluster, "-R", "-f", str(first))
    docs = [d for p in first.rglob("*.yaml") for d in yaml.safe_load_all(p.read_text()) if d]
    before = our_writes(cluster, docs)
    apply(cluster, "-R", "-f", str(first))
    assert our_writes(cluster, docs) == before, "re-applying render output wrote objects"
    same = diff(cluster, "-R", "-f", str(first))
    assert same.returncode == 0, same.stdout


def test_kustomize_base_builds_applies_and_stays_equal(cluster: Cluster) -> None:
    built = [
        d
        for d in yaml.safe_load_all(cluster.kubectl("kustomize", str(ROOT / "config")).stdout)
        if d
    ]
    base = [
        d
        for p in sorted((ROOT / "config").rglob("*.yaml"))
        if p.name != "kustomization.yaml"
        for d in yaml.safe_load_all(p.read_text())
        if d
    ]

    def key(d: dict[str, Any]) -> tuple[str, str]:
        return d["kind"], d["metadata"]["name"]

    assert sorted(map(key, built)) == sorted(map(key, base))
    for doc in built:
        labels = doc["metadata"].get("labels", {})
        assert "helm.sh/chart" not in labels
        assert labels.get("app.kubernetes.io/managed-by") in (None, "kustomize")
    not_crds = [d for d in built if d["kind"] != "CustomResourceDefinition"]
    try:
        apply(cluster, "--force-conflicts", "-k", str(ROOT / "config"))
        same = diff(cluster, "-k", str(ROOT / "config"))
        assert same.returncode == 0, same.stdout
        sa = "system:serviceaccount:promptcache-system:promptcache-operator"
        allowed = cluster.kubectl(
            "auth",
            "can-i",
            "watch",
            "promptcachedeployments.serving.promptcache.io",
            "--all-namespaces",
            f"--as={sa}",
            check=False,
        )
        assert allowed.stdout.strip() == "yes"
    finally:
        # Everything but the CRD: deleting it would delete every test's resources.
        cluster.kubectl(
            "delete",
            "--ignore-not-found",
            "--wait=false",
            "-f",
            "-",
            input=yaml.safe_dump_all(not_crds),
            check=False,
        )

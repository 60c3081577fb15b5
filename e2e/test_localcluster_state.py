"""localcluster.state: the state file round-trips, ports are distinct, pod CIDRs avoid the
ones other clusters in the cache use; and the `e2e/cluster` launcher answers from any
directory with the package's results (`harness.localcluster`, which it runs with the
checkout root on the path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.localcluster.errors import ClusterError
from harness.localcluster.paths import CLI, ROOT
from harness.localcluster.ports import free_ports
from harness.localcluster.state import State, cluster_dir, pick_pod_cidr
from harness.localcluster.targets import binary_path


def test_state_round_trips_and_names_its_kubeconfig(tmp_path: Path) -> None:
    st = State(name="a", dir=str(tmp_path), pod_cidr="127.101.0.0/16", ports={"etcd": 1})
    st.pids["etcd"] = 42
    st.nodes.append("kwok-gpu-0")
    st.save()
    assert State.load(tmp_path) == st
    assert st.kubeconfig == tmp_path / "kubeconfig"
    assert State.load(tmp_path / "absent") is None
    assert not list(tmp_path.glob("*.tmp"))  # written atomically, no leftovers


def test_cluster_dir_prefers_an_explicit_dir(tmp_path: Path) -> None:
    assert cluster_dir("x", str(tmp_path)) == tmp_path.resolve()
    assert cluster_dir("x", None).name == "x"


def test_free_ports_are_distinct_loopback_ports() -> None:
    ports = free_ports(["a", "b", "c", "d", "e", "f"])
    assert sorted(ports) == ["a", "b", "c", "d", "e", "f"]
    assert len(set(ports.values())) == 6


def clusters_using(root: Path, cidrs: list[str]) -> None:
    for i, cidr in enumerate(cidrs):
        d = root / f"c{i}"
        d.mkdir()
        State(name=d.name, dir=str(d), pod_cidr=cidr, ports={}).save()


def test_pod_cidrs_avoid_every_other_cluster(tmp_path: Path) -> None:
    """With 131 of the 151 /16s taken by clusters in the cache, a free one is picked (200
    random draws miss all 20 free ones with probability (131/151)^200 < 1e-12)."""
    every = [f"127.{third}.0.0/16" for third in range(100, 251)]
    free = set(every[::7][:20])
    clusters_using(tmp_path, [c for c in every if c not in free])
    for _ in range(5):
        assert pick_pod_cidr(tmp_path) in free


def test_no_free_pod_cidr_is_an_error(tmp_path: Path) -> None:
    clusters_using(tmp_path, [f"127.{third}.0.0/16" for third in range(100, 251)])
    with pytest.raises(ClusterError, match="no free 127"):
        pick_pod_cidr(tmp_path)


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CLI), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
    )


def test_the_script_imports_its_package_from_any_directory(tmp_path: Path) -> None:
    which = cli("which", "kubectl", cwd=tmp_path)
    assert (which.returncode, which.stdout.strip()) == (0, str(binary_path("kubectl")))
    unknown = cli("which", "nope", cwd=tmp_path)
    assert unknown.returncode == 1
    assert "error: unknown binary 'nope'" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    status = cli("status", "--dir", str(tmp_path), cwd=tmp_path)
    assert (status.returncode, status.stdout) == (3, f"no cluster in {tmp_path}\n")
    env = cli("env", "--dir", str(tmp_path), cwd=tmp_path)
    assert env.returncode == 3
    assert env.stdout == ""  # `eval "$(e2e/cluster env)"` gets nothing to run


def test_the_script_runs_its_own_checkouts_tool_from_inside_another(tmp_path: Path) -> None:
    """Run from a directory holding another `harness` (another checkout, say main's), the
    launcher still runs its own: `python -m` would put the working directory first on the
    path, and the launcher's `-P` keeps it off (found running a worktree's `e2e/cluster`
    from inside /work/main, whose harness has no `localcluster` yet)."""
    decoy = tmp_path / "harness"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise ImportError('the decoy harness was imported')\n")
    which = cli("which", "kubectl", cwd=tmp_path)
    assert (which.returncode, which.stdout.strip()) == (0, str(binary_path("kubectl"))), (
        which.stderr
    )


def test_the_script_needs_nothing_but_the_standard_library(tmp_path: Path) -> None:
    """It must run before the project is installed (`scripts/test` builds with the system
    `python3` before any venv exists): no site-packages (`-S`, which the launcher passes
    on), no PYTHONPATH (so no promptcache), and every module the tool loads, `harness`'s
    own `__init__` included, is the standard library's or the tool's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run(
        [sys.executable, "-S", str(CLI), "which", "kubectl"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
        env=env,
    )
    assert (proc.returncode, proc.stdout.strip()) == (0, str(binary_path("kubectl"))), proc.stderr
    loaded = subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            "import sys, harness.localcluster.cli; print(' '.join(sys.modules))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=ROOT,  # `-c` puts the working directory on the path: the checkout, as the launcher
        env=env,
    ).stdout.split()
    assert "harness.localcluster.lifecycle" in loaded
    outside = [
        m
        for m in loaded
        if m.partition(".")[0] not in sys.stdlib_module_names
        and m not in ("__main__", "harness")
        and not m.startswith("harness.localcluster")
    ]
    assert outside == [], f"the local cluster tool must stay stdlib-only: {outside}"

"""helm (built from its Go module) installs, waits for and uninstalls a chart on the cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.pytest_cluster import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.helm]

CHART = Path(__file__).resolve().parent / "testdata" / "tiny-chart"


def test_helm_install_waits_for_ready_pods_and_uninstalls(cluster: Cluster, namespace: str) -> None:
    out = cluster.helm(
        "install", "demo", str(CHART), "-n", namespace,
        "--set", "greeting=hi there", "--set", "replicas=2",
        "--wait", "--timeout", "3m",
    )  # fmt: skip
    assert "STATUS: deployed" in out.stdout

    releases = json.loads(cluster.helm("list", "-n", namespace, "-o", "json").stdout)
    assert [(r["name"], r["status"], r["chart"]) for r in releases] == [
        ("demo", "deployed", "tiny-0.1.0")
    ]
    cm = cluster.get_json("configmap", "demo-config", "-n", namespace)
    assert cm["data"] == {"greeting": "hi there"}
    # --wait returned only once the Deployment was available: its pods really run.
    dep = cluster.get_json("deployment", "demo-app", "-n", namespace)
    assert dep["status"].get("readyReplicas") == 2
    assert dep["metadata"]["annotations"]["meta.helm.sh/release-name"] == "demo"
    assert dep["metadata"]["annotations"]["meta.helm.sh/release-namespace"] == namespace

    cluster.helm("uninstall", "demo", "-n", namespace, "--wait", "--timeout", "2m")
    gone = cluster.kubectl("get", "configmap", "demo-config", "-n", namespace, check=False)
    assert gone.returncode != 0
    assert "NotFound" in gone.stderr
    assert json.loads(cluster.helm("list", "-n", namespace, "-o", "json").stdout) == []

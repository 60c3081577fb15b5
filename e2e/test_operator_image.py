"""The operator *from its image*, as the chart runs it, reconciling on the local control plane.

The container is the chart's (`tests/chart/golden/default.yaml`: its user, read-only root,
/tmp emptyDir, every capability dropped), run with podman on the host network so it
reaches the local API server. What a cluster would hand the pod differs, and only that: a
kubeconfig (certificates embedded, mounted read-only) in place of the ServiceAccount token,
one watched namespace, free health/metrics ports, no Lease (no release namespace here).
It must take a resource to Ready=True (the `Available` transition) as the process does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.images import PodRun, built_image, chart_operator_pod, embedded_kubeconfig
from harness.net import answers_ok, free_port
from harness.operator import apply_yaml, condition, get_json, install_crd, resource
from harness.pytest_cluster import Cluster
from harness.waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.images]

TIMEOUT_S = 240
KUBECONFIG_DIR = "/var/run/promptcache-test"
DROPPED = ("--all-namespaces", "--lease-name", "--lease-namespace", "--health-port",
           "--metrics-port", "--endpoint-picker-cluster-role")  # fmt: skip


def test_operator_image_makes_a_resource_available(cluster: Cluster, tmp_path: Path) -> None:
    install_crd(cluster.kubectl)
    ns = cluster.create_namespace("opimage")
    pod, container = chart_operator_pod()
    kubeconfig = embedded_kubeconfig(cluster.kubeconfig, tmp_path / "kube")
    health, metrics = free_port(), free_port()
    args = [a for a in container["args"] if not a.startswith(DROPPED)]
    args += [f"--namespace={ns}", "--no-leader-election",
             f"--health-port={health}", f"--metrics-port={metrics}"]  # fmt: skip
    run = PodRun(
        built_image("operator").ref,
        pod,
        {**container, "args": args},
        tmp_path,
        env={"KUBECONFIG": f"{KUBECONFIG_DIR}/kubeconfig"},
        fields={"metadata.namespace": ns},
        network="host",
        mounts={KUBECONFIG_DIR: kubeconfig.parent},
    )
    log = tmp_path / "operator.log"
    proc = run.start(log)
    try:

        def exited() -> str | None:
            code = proc.poll()
            return None if code is None else f"the operator exited {code}"

        def ready() -> dict[str, Any] | None:
            obj = cluster.pcd_json(ns, "fromimage")
            return condition(obj, "Ready")

        def operator_log() -> str:
            return f"operator log:\n{log.read_text()}"

        wait_until(
            lambda: answers_ok(f"http://127.0.0.1:{health}/healthz"),
            "the operator's /healthz answering",
            within_s=TIMEOUT_S,
            interval_s=1,
            fail_if=exited,
            detail=operator_log,
        )
        apply_yaml(cluster.kubectl, resource("fromimage", ns))
        wait_until(
            ready,
            "fromimage Ready (its Ready condition)",
            within_s=TIMEOUT_S,
            interval_s=1,
            until=lambda cond: cond is not None and cond["status"] == "True",
            fail_if=exited,
            detail=operator_log,
        )
        events = get_json(cluster.kubectl, "events", "-n", ns,
                          "--field-selector", "involvedObject.name=fromimage")  # fmt: skip
        assert any(e["reason"] == "Available" for e in events["items"]), log.read_text()
    finally:
        run.remove()
        proc.wait(timeout=60)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)

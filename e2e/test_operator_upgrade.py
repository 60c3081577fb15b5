"""Upgrading to promptcache's picker as the default, on a real control plane.

A resource that leaves `spec.gateway.picker` empty was rendered for llm-d-router by the
previous release (its default): the picker container, the gateway policy step in front of
it, a NetworkPolicy admitting the step's ports. The operator of this release renders it
for promptcache's own picker: the picker Deployment rolls (its image and args change, the
step's container goes), the NetworkPolicy follows, the resource is Ready again, and
nothing else of the user's moves: the resource itself, its salt Secret (every tenant keeps
its salt) and the model servers (their engines keep their caches; only the picker's
prefix index starts empty and warms again). The previous release's rendering is the
operator's with `--picker llm-d-router`, the flag that sets that default.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.net import free_port
from harness.operator import (
    OperatorProcess,
    apply_yaml,
    condition,
    get_json,
    install_crd,
    resource,
    wait_for,
)
from harness.pytest_cluster import Cluster
from promptcache.contract import (
    EPP_EXT_PROC_PORT,
    GATEWAY_POLICY_METRICS_PORT,
    PROFILES,
    PickerTarget,
)
from promptcache.render.epp import GATEWAY_POLICY_CONTAINER

pytestmark = pytest.mark.cluster

TIMEOUT_S = 60
NAME = "upgraded"


@pytest.fixture
def ns(cluster: Cluster) -> Iterator[str]:
    install_crd(cluster.kubectl)
    name = cluster.create_namespace("upgrade")
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def operator(cluster: Cluster, ns: str, log: Path, *flags: str) -> OperatorProcess:
    args = ["-n", ns, "--no-leader-election", "--resync-seconds", "2",
            "--scrape-port", str(free_port()), "--scrape-timeout", "1", *flags]  # fmt: skip
    return OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=log, args=args).start()


def ready(cluster: Cluster, ns: str, op: OperatorProcess) -> dict[str, Any]:
    def now() -> Any:
        obj = cluster.pcd_json(ns, NAME)
        cond = condition(obj, "Ready")
        gen = obj["metadata"]["generation"]
        ok = cond and cond["status"] == "True" and obj["status"].get("observedGeneration") == gen
        return obj if ok else None

    return dict(wait_for(now, f"{NAME} Ready\n{op.log_tail()}", timeout=TIMEOUT_S))


def picker(cluster: Cluster, ns: str) -> dict[str, Any]:
    found: dict[str, Any] = get_json(cluster.kubectl, "deployment", f"{NAME}-epp", "-n", ns)
    return found


def containers(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


def admitted(cluster: Cluster, ns: str) -> set[int]:
    policy = get_json(cluster.kubectl, "networkpolicy", f"{NAME}-epp", "-n", ns)
    return {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}


def test_an_old_default_resource_rolls_to_promptcaches_picker(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    old = operator(cluster, ns, tmp_path / "old.log", "--picker", "llm-d-router")
    try:
        doc = resource(NAME, ns, isolation={"mode": "PerKey"})
        doc["metadata"]["labels"] = {"team": "chat"}
        apply_yaml(cluster.kubectl, doc)
        before = ready(cluster, ns, old)
        epp = picker(cluster, ns)
        assert set(containers(epp)) == {"epp", GATEWAY_POLICY_CONTAINER}
        assert containers(epp)["epp"]["image"] == PROFILES[PickerTarget.LLM_D_ROUTER].image
        assert GATEWAY_POLICY_METRICS_PORT in admitted(cluster, ns)
        salt = get_json(cluster.kubectl, "secret", f"{NAME}-salt", "-n", ns)
        model = get_json(cluster.kubectl, "deployment", NAME, "-n", ns)
    finally:
        old.stop()

    new = operator(cluster, ns, tmp_path / "new.log")  # this release: no --picker
    try:

        def rolled() -> Any:
            now = picker(cluster, ns)
            return now if set(containers(now)) == {"epp"} else None

        epp = wait_for(rolled, f"the picker rolled\n{new.log_tail()}", timeout=TIMEOUT_S)
        container = containers(epp)["epp"]
        assert container["image"] == PROFILES[PickerTarget.PROMPTCACHE].image
        args = container["args"]
        assert args[args.index("--grpc-port") + 1] == str(EPP_EXT_PROC_PORT)
        assert "--secure-serving=false" not in args  # alone on the Service's port: TLS
        assert "--allow-experimental-plugins" not in args
        assert {"grpc", "grpc-health", "metrics"} == {p["name"] for p in container["ports"]}
        config = get_json(cluster.kubectl, "configmap", f"{NAME}-epp", "-n", ns)
        assert "Endpoint Picker: promptcache" in config["data"]["config.yaml"]
        wait_for(
            lambda: admitted(cluster, ns) == {EPP_EXT_PROC_PORT, 9003, 9090},
            f"the NetworkPolicy follows the pod\n{new.log_tail()}",
            timeout=TIMEOUT_S,
        )
        after = ready(cluster, ns, new)
        assert condition(after, "Degraded")["status"] == "False"  # type: ignore[index]
        # the user's own: the resource as written, the tenants' salts, the model servers
        assert after["spec"] == before["spec"]
        assert "picker" not in after["spec"].get("gateway", {})
        assert after["metadata"]["labels"] == {"team": "chat"}
        now_salt = get_json(cluster.kubectl, "secret", f"{NAME}-salt", "-n", ns)
        assert now_salt["data"] == salt["data"]
        now_model = get_json(cluster.kubectl, "deployment", NAME, "-n", ns)
        assert now_model["metadata"]["generation"] == model["metadata"]["generation"]
        assert now_model["spec"]["template"] == model["spec"]["template"]
        assert new.alive()
    finally:
        new.stop()

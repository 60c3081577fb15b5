"""Bad and partial worlds: unrealisable specs, missing CRDs, a killed operator, two replicas.

Each unrealisable resource must say why in `Degraded` with a reason a user can act on,
while the operator keeps serving the other resources beside it.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest

from harness.operator import (
    CHILD_KINDS,
    OperatorProcess,
    apply_yaml,
    condition,
    get_json,
    install_crd,
    namespaced_operator,
    resource,
    wait_for,
)
from harness.pytest_cluster import Cluster
from harness.waiting import wait_until

pytestmark = pytest.mark.cluster

TIMEOUT_S = 180
KINDS = (*CHILD_KINDS, "secrets")


@pytest.fixture(scope="module")
def env(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with namespaced_operator(cluster, "worlds", tmp_path_factory.mktemp("worlds")) as env:
        yield env


def wait_condition(
    cluster: Cluster, ns: str, name: str, type_: str, status: str, op: OperatorProcess,
    reason: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    def check() -> Any:
        cond = condition(cluster.pcd_json(ns, name), type_)
        if cond and cond["status"] == status and (reason is None or cond["reason"] == reason):
            return cond
        return None

    what = f"{name} {type_}={status} {reason or ''}\n{op.log_tail()}"
    return dict(wait_for(check, what, timeout=TIMEOUT_S))


def test_missing_secret_is_degraded_and_others_still_served(
    cluster: Cluster, env: dict[str, Any]
) -> None:
    ns, op = env["ns"], env["op"]
    apply_yaml(
        cluster.kubectl,
        resource("needs-token", ns, model={"hfTokenSecretRef": {"name": "hf-token"}}),
        resource("fine", ns),
    )
    cond = wait_condition(cluster, ns, "needs-token", "Degraded", "True", op, "SecretNotFound")
    assert cond["message"].startswith(
        f"spec.model.hfTokenSecretRef: Secret 'hf-token' not found in namespace '{ns}'"
    )
    wait_condition(cluster, ns, "fine", "Ready", "True", op)
    cluster.kubectl("-n", ns, "create", "secret", "generic", "hf-token", "--from-literal=token=x")
    wait_condition(cluster, ns, "needs-token", "Degraded", "False", op, "AsExpected")


def test_more_gpus_than_any_node_is_degraded(cluster: Cluster, env: dict[str, Any]) -> None:
    ns, op = env["ns"], env["op"]
    apply_yaml(cluster.kubectl, resource("huge", ns, model={"resources": {"gpus": 64}}))
    cond = wait_condition(cluster, ns, "huge", "Degraded", "True", op, "InsufficientGPUs")
    assert cond["message"].startswith("spec.model.resources.gpus=64 but the largest node")


def test_name_too_long_is_degraded_and_creates_nothing(
    cluster: Cluster, env: dict[str, Any]
) -> None:
    ns, op = env["ns"], env["op"]
    name = "n" * 60
    apply_yaml(cluster.kubectl, resource(name, ns))
    cond = wait_condition(cluster, ns, name, "Degraded", "True", op, "NameTooLong")
    assert cond["message"].startswith(f"metadata.name: {name!r} is 60 characters")
    for kind in KINDS:
        items = get_json(
            cluster.kubectl, kind, "-n", ns, "-l", f"app.kubernetes.io/instance={name}"
        )
        assert items["items"] == [], kind


def test_killed_mid_reconcile_converges_without_duplicates(
    cluster: Cluster, env: dict[str, Any]
) -> None:
    ns, op = env["ns"], env["op"]
    apply_yaml(cluster.kubectl, resource("phoenix", ns, model={"replicas": 2}))
    # Kill -9 as soon as the first child exists: the reconcile is then mid-way.
    wait_for(
        lambda: get_json(
            cluster.kubectl, "serviceaccounts", "-n", ns, "-l", "app.kubernetes.io/instance=phoenix"
        )["items"],
        "first child of phoenix",
        timeout=TIMEOUT_S,
        every=0.05,
    )
    op.stop(signal.SIGKILL)
    salt_before = get_json(cluster.kubectl, "secret", "phoenix-salt", "-n", ns)
    op.start()
    wait_condition(cluster, ns, "phoenix", "Ready", "True", op)
    for kind in KINDS:
        items = get_json(
            cluster.kubectl, kind, "-n", ns, "-l", "app.kubernetes.io/instance=phoenix"
        )
        names = sorted(i["metadata"]["name"] for i in items["items"])
        assert len(names) == len(set(names)), kind
        expected = {"deployments": 2, "services": 2}.get(kind, 1)
        assert len(names) == expected, f"{kind}: {names}"
    if salt_before is not None:
        after = get_json(cluster.kubectl, "secret", "phoenix-salt", "-n", ns)
        assert after["data"] == salt_before["data"]


def test_two_replicas_only_one_acts(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    install_crd(cluster.kubectl)
    ns = cluster.create_namespace("ha")
    logs = tmp_path_factory.mktemp("ha")
    args = ["-n", ns, "--lease-namespace", ns, "--lease-seconds", "6", "--resync-seconds", "2"]
    ops = [
        OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=logs / f"op{i}.log",
                        args=[*args, "--identity", f"replica-{i}"]).start()
        for i in range(2)
    ]  # fmt: skip
    try:
        apply_yaml(cluster.kubectl, resource("shared", ns))
        wait_condition(cluster, ns, "shared", "Ready", "True", ops[0])
        roles = wait_for(lambda: sorted(o.readyz() for o in ops) == ["leader", "standby"],
                         "one leader, one standby", timeout=60)  # fmt: skip
        assert roles
        leader = next(o for o in ops if o.readyz() == "leader")
        standby = next(o for o in ops if o is not leader)
        assert leader.counter("promptcache_reconciles_total") > 0
        assert standby.counter("promptcache_reconciles_total") == 0
        assert standby.counter("promptcache_api_requests_total", verb="PATCH") == 0
        lease = get_json(cluster.kubectl, "lease", "promptcache-operator", "-n", ns)
        assert lease["spec"]["holderIdentity"] in ("replica-0", "replica-1")
        leader.stop(signal.SIGKILL)
        wait_for(lambda: standby.readyz() == "leader", "the standby to take over", timeout=60)
        cluster.kubectl("-n", ns, "scale", "pcd/shared", "--replicas", "2")
        wait_for(
            lambda: (get_json(cluster.kubectl, "deployment", "shared", "-n", ns)["spec"]["replicas"]
                     == 2),
            f"the new leader to reconcile\n{standby.log_tail()}",
            timeout=TIMEOUT_S,
        )  # fmt: skip
        assert standby.counter("promptcache_reconciles_total") > 0
    finally:
        for o in ops:
            o.stop()
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.mark.timeout(1200)  # starts a control plane of its own (up: 240 s at most)
def test_without_gateway_crds_model_servers_are_managed(
    cluster_factory: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    bare: Cluster = cluster_factory(gateway_crds=False)
    install_crd(bare.kubectl)
    ns = bare.create_namespace("nogw")
    op = OperatorProcess(
        kubeconfig=bare.kubeconfig,
        log_path=tmp_path_factory.mktemp("nogw") / "operator.log",
        args=["-n", ns, "--no-leader-election", "--resync-seconds", "1"],
    ).start()
    try:
        apply_yaml(bare.kubectl, resource("plain", ns, model={"replicas": 2}))
        cond = wait_condition(bare, ns, "plain", "GatewayReady", "False", op, "CRDNotInstalled")
        assert "InferencePool CRD is not installed" in cond["message"]
        wait_condition(bare, ns, "plain", "Ready", "True", op)
        dep = get_json(bare.kubectl, "deployment", "plain", "-n", ns)
        assert dep["status"]["readyReplicas"] == 2
        lines_before = op.log_text().count("not served")
        resyncs = op.counter("promptcache_reconciles_total", trigger="resync")
        # The observation window, counted in resyncs (15 must not log 15 errors), not in
        # seconds: a busy machine may fit fewer resyncs into 15 s than it should.
        wait_until(
            lambda: op.counter("promptcache_reconciles_total", trigger="resync"),
            f"15 resyncs after {resyncs:g} (resyncs counted)",
            within_s=120,
            interval_s=0.5,
            until=lambda now: now >= resyncs + 15,
        )
        assert op.alive()
        assert op.log_text().count("not served") - lines_before <= 1
        assert "Traceback" not in op.log_text()
    finally:
        op.stop()

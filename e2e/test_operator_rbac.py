"""The ClusterRole in charts/promptcache-operator/files/clusterrole-rules.yaml is enough, and
every rule counts: the operator runs as a ServiceAccount bound to exactly those rules (a
token from `kubectl create token` in a kubeconfig of its own), then with one rule removed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube.config.kubeconfig import KubeConfig

from operator_harness import (
    RULES_FILE,
    OperatorProcess,
    apply_yaml,
    condition,
    get_json,
    install_crd,
    resource,
    wait_for,
)
from promptcache.controller.kube import ApiError, Kube
from promptcache.controller.reconcile import apply_in_order
from pytest_cluster import Cluster

pytestmark = pytest.mark.cluster
TIMEOUT_S = 180


def token_kubeconfig(cluster: Cluster, ns: str, sa: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount, nothing else."""
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    current = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])
    cluster_entry = next(c for c in admin["clusters"] if c["name"] == current["context"]["cluster"])
    token = cluster.kubectl("create", "token", sa, "-n", ns, "--duration", "2h").stdout.strip()
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [cluster_entry],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": cluster_entry["name"], "user": "sa",
                                                "namespace": ns}}],
    }))  # fmt: skip
    path.chmod(0o600)
    return path


def bind(cluster: Cluster, name: str, ns: str, rules: list[dict[str, Any]]) -> None:
    apply_yaml(
        cluster.kubectl,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": name}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]},
    )  # fmt: skip


@pytest.fixture
def rbac_ns(cluster: Cluster) -> Iterator[str]:
    install_crd(cluster.kubectl)
    ns = cluster.create_namespace("rbac")
    try:
        yield ns
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _run(
    cluster: Cluster, ns: str, name: str, rules: list[dict[str, Any]], tmp: Path
) -> OperatorProcess:
    bind(cluster, name, ns, rules)
    kubeconfig = token_kubeconfig(cluster, ns, name, tmp / f"{name}.kubeconfig")
    return OperatorProcess(
        kubeconfig=kubeconfig, log_path=tmp / f"{name}.log",
        args=["-n", ns, "--lease-namespace", ns, "--resync-seconds", "2"],
    ).start()  # fmt: skip


def test_the_exact_rules_are_enough(cluster: Cluster, rbac_ns: str, tmp_path: Path) -> None:
    rules = yaml.safe_load(RULES_FILE.read_text())
    op = _run(cluster, rbac_ns, f"pco-full-{rbac_ns}", rules, tmp_path)
    try:
        apply_yaml(
            cluster.kubectl,
            resource(
                "guarded",
                rbac_ns,
                model={"replicas": 1},
                gateway={"route": {"parentRefs": [{"name": "gw"}]}},
            ),
        )

        def ready() -> Any:
            obj = get_json(cluster.kubectl, "pcd", "guarded", "-n", rbac_ns)
            cond = condition(obj, "Ready")
            return cond and cond["status"] == "True"

        wait_for(ready, f"Ready under the exact ClusterRole\n{op.log_tail()}", timeout=TIMEOUT_S)
        obj = get_json(cluster.kubectl, "pcd", "guarded", "-n", rbac_ns)
        assert condition(obj, "Degraded")["status"] == "False"
        assert get_json(cluster.kubectl, "httproute", "guarded", "-n", rbac_ns) is not None
        assert get_json(cluster.kubectl, "secret", "guarded-salt", "-n", rbac_ns) is not None
        events = get_json(cluster.kubectl, "events", "-n", rbac_ns)
        assert any(e["involvedObject"]["name"] == "guarded" for e in events["items"])
        assert "Forbidden" not in op.log_text()
        assert "forbidden" not in op.log_text()
    finally:
        op.stop()


def test_removing_one_rule_breaks_it(cluster: Cluster, rbac_ns: str, tmp_path: Path) -> None:
    rules = [r for r in yaml.safe_load(RULES_FILE.read_text())
             if r["resources"] != ["poddisruptionbudgets"]]  # fmt: skip
    assert len(rules) == len(yaml.safe_load(RULES_FILE.read_text())) - 1
    op = _run(cluster, rbac_ns, f"pco-less-{rbac_ns}", rules, tmp_path)
    try:
        apply_yaml(cluster.kubectl, resource("unguarded", rbac_ns))

        def degraded() -> Any:
            cond = condition(
                get_json(cluster.kubectl, "pcd", "unguarded", "-n", rbac_ns), "Degraded"
            )
            return cond if cond and cond["status"] == "True" else None

        cond = wait_for(
            degraded, f"Degraded without the PDB rule\n{op.log_tail()}", timeout=TIMEOUT_S
        )
        assert cond["reason"] == "ApplyFailed"
        assert cond["message"].startswith("PodDisruptionBudget/unguarded:")
        assert "forbidden" in cond["message"]
        assert get_json(cluster.kubectl, "pdb", "unguarded", "-n", rbac_ns) is None
    finally:
        op.stop()


def _role_and_binding(ns: str, name: str, sa: str) -> tuple[dict[str, Any], dict[str, Any]]:
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": ns},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
    }
    return role, binding  # fmt: skip


def test_a_rolebinding_is_applied_after_its_role(
    cluster: Cluster, rbac_ns: str, tmp_path: Path
) -> None:
    """The cause of a flake: Degraded said `RoleBinding/...: ... not found` under load.

    Without `bind`, the API server checks a new RoleBinding against the Role it names; the
    operator applied both at once, and when the binding arrived first it got 404. Shown
    here deterministically, then the operator's apply order, binding listed first."""
    sa = f"pco-order-{rbac_ns}"
    bind(cluster, sa, rbac_ns, yaml.safe_load(RULES_FILE.read_text()))
    config = KubeConfig.from_file(token_kubeconfig(cluster, rbac_ns, sa, tmp_path / "kc")).get()

    async def run() -> None:
        kube = Kube(config)
        try:
            role, binding = _role_and_binding(rbac_ns, "early", sa)
            with pytest.raises(ApiError) as refused:
                await kube.apply(binding)
            assert refused.value.code == 404, refused.value
            role, binding = _role_and_binding(rbac_ns, "ordered", sa)
            results = await apply_in_order(kube, [binding, role])
            assert [r["kind"] for r in results if isinstance(r, dict)] == ["RoleBinding", "Role"]
        finally:
            await kube.close()

    asyncio.run(run())

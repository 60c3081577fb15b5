"""The ClusterRole of controller/rbac_rules/clusterrole-rules.yaml is enough, and
every rule counts: the operator runs as a ServiceAccount bound to exactly those rules (a
token from `kubectl create token` in a kubeconfig of its own), plus the Role for its leader
Lease in its namespace and the Endpoint Picker's static ClusterRole it binds per namespace,
then with one rule removed. And the chart's RBAC is least privilege in all-namespaces mode:
no Lease outside its namespace, no Secret it did not create, and the built-in `edit` role
is all a namespace user needs to create a PromptCacheDeployment.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube.config.kubeconfig import KubeConfig

from harness.operator import (
    RULES_FILE,
    OperatorProcess,
    apply_yaml,
    condition,
    get_json,
    install_crd,
    resource,
    wait_for,
)
from harness.pytest_cluster import Cluster
from promptcache.controller.errors import NotFoundError
from promptcache.controller.kube import Kube
from promptcache.controller.rbac import leader_election_role, load_rules, picker_cluster_role
from promptcache.controller.reconcile import apply_in_order

pytestmark = pytest.mark.cluster
TIMEOUT_S = 180


def operator_rules(name: str) -> list[dict[str, Any]]:
    """The rules file as the chart gives it: `bind` on this operator's picker role."""
    return load_rules(RULES_FILE, picker_role=f"{name}-endpoint-picker")


def bind(cluster: Cluster, name: str, ns: str, rules: list[dict[str, Any]]) -> None:
    leader = leader_election_role(name)
    leader["metadata"]["namespace"] = ns
    apply_yaml(
        cluster.kubectl,
        picker_cluster_role(name),
        leader,
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": leader["metadata"]["name"], "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": leader["metadata"]["name"]},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]},
    )  # fmt: skip
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
    kubeconfig = cluster.service_account_kubeconfig(ns, name, tmp / f"{name}.kubeconfig")
    return OperatorProcess(
        kubeconfig=kubeconfig, log_path=tmp / f"{name}.log",
        args=["-n", ns, "--lease-namespace", ns, "--resync-seconds", "2",
              "--endpoint-picker-cluster-role", f"{name}-endpoint-picker"],
    ).start()  # fmt: skip


def test_the_exact_rules_are_enough(cluster: Cluster, rbac_ns: str, tmp_path: Path) -> None:
    name = f"pco-full-{rbac_ns}"
    op = _run(cluster, rbac_ns, name, operator_rules(name), tmp_path)
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
        # The picker's rights: a RoleBinding to the static ClusterRole, no Role of its own.
        binding = get_json(cluster.kubectl, "rolebinding", "guarded-epp-picker", "-n", rbac_ns)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": f"{name}-endpoint-picker",
        }
        assert get_json(cluster.kubectl, "role", "guarded-epp", "-n", rbac_ns) is None
        events = get_json(cluster.kubectl, "events", "-n", rbac_ns)
        assert any(e["involvedObject"]["name"] == "guarded" for e in events["items"])
        assert "Forbidden" not in op.log_text()
        assert "forbidden" not in op.log_text()
    finally:
        op.stop()


def test_removing_one_rule_breaks_it(cluster: Cluster, rbac_ns: str, tmp_path: Path) -> None:
    name = f"pco-less-{rbac_ns}"
    rules = [r for r in operator_rules(name) if r["resources"] != ["poddisruptionbudgets"]]
    assert len(rules) == len(operator_rules(name)) - 1
    op = _run(cluster, rbac_ns, name, rules, tmp_path)
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
    # The chart's operator binds the picker's ClusterRole and creates no Role; an operator
    # run without --endpoint-picker-cluster-role (no chart) renders a Role per picker, and
    # needs to create Roles and hold what they grant: here, pods get.
    role_creator = [
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"],
         "verbs": ["get", "create", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
    ]  # fmt: skip
    bind(cluster, sa, rbac_ns, operator_rules(sa) + role_creator)
    config = KubeConfig.from_file(
        cluster.service_account_kubeconfig(rbac_ns, sa, tmp_path / "kc")
    ).get()

    async def run() -> None:
        kube = Kube(config)
        try:
            role, binding = _role_and_binding(rbac_ns, "early", sa)
            with pytest.raises(NotFoundError):
                await kube.apply(binding)
            role, binding = _role_and_binding(rbac_ns, "ordered", sa)
            results = await apply_in_order(kube, [binding, role])
            assert [r["kind"] for r in results if isinstance(r, dict)] == ["RoleBinding", "Role"]
        finally:
            await kube.close()

    asyncio.run(run())


CHART = Path(__file__).resolve().parents[1] / "charts" / "promptcache-operator"


def can_i(cluster: Cluster, who: str, verb: str, what: str, ns: str | None) -> bool:
    scope = ["-n", ns] if ns else []
    proc = cluster.kubectl("auth", "can-i", verb, what, *scope, f"--as={who}", check=False)
    return proc.stdout.strip() == "yes"


@pytest.mark.helm
def test_the_charts_rbac_is_least_privilege_in_all_namespaces_mode(cluster: Cluster) -> None:
    install_crd(cluster.kubectl)  # the shared cluster's CRD; the chart leaves it alone
    ops = cluster.create_namespace("ops")
    team = cluster.create_namespace("team")
    release = f"lp-{ops.rpartition('-')[2]}"
    name = f"{release}-promptcache-operator"
    cluster.helm("install", release, str(CHART), "-n", ops, "--set", "crds.install=false")
    try:
        sa = f"system:serviceaccount:{ops}:{name}"
        # Its own leader Lease, in its namespace only: never kube-system's or a team's.
        assert can_i(cluster, sa, "update", "leases.coordination.k8s.io", ops)
        for ns in ("kube-system", team):
            for verb in ("delete", "update", "get", "create"):
                assert not can_i(cluster, sa, verb, "leases.coordination.k8s.io", ns), (verb, ns)
        # Secrets: it creates the salt key; it cannot read (nor list, nor rewrite) any Secret.
        assert can_i(cluster, sa, "create", "secrets", team)
        for verb in ("get", "list", "watch", "update", "patch", "delete"):
            assert not can_i(cluster, sa, verb, "secrets", team), verb
            assert not can_i(cluster, sa, verb, "secrets", "kube-system"), verb
        # The picker's rights are bound, not held: bind on exactly the picker role.
        assert can_i(cluster, sa, "bind", f"clusterroles/{name}-endpoint-picker", team)
        assert not can_i(cluster, sa, "bind", "clusterroles/cluster-admin", team)
        assert not can_i(cluster, sa, "escalate", "clusterroles", None)
        assert not can_i(cluster, sa, "watch", "pods", team)
        assert can_i(cluster, sa, "list", "pods", team)
        assert not can_i(cluster, sa, "create", "roles", team)
        # Still all it needs to act in every namespace.
        assert can_i(cluster, sa, "watch", "promptcachedeployments.serving.promptcache.io", None)
        assert can_i(cluster, sa, "create", "rolebindings", team)

        # A namespace user with only the built-in `edit` role creates a resource; `view` reads.
        alice, bob = f"alice-{team}", f"bob-{team}"
        for user, role in ((alice, "edit"), (bob, "view")):
            cluster.kubectl(
                "create", "rolebinding", f"{user}-{role}", f"--clusterrole={role}",
                f"--user={user}", "-n", team,
            )  # fmt: skip
        pcd = "promptcachedeployments.serving.promptcache.io"
        cluster.wait_for(
            lambda: can_i(cluster, alice, "create", pcd, team), "edit aggregates the PCD rules"
        )
        cluster.kubectl(
            "apply", "--server-side", f"--as={alice}", "-f", "-",
            input=yaml.safe_dump(resource("by-alice", team)),
        )  # fmt: skip
        assert get_json(cluster.kubectl, "pcd", "by-alice", "-n", team) is not None
        cluster.wait_for(lambda: can_i(cluster, bob, "get", pcd, team), "view aggregates")
        assert not can_i(cluster, bob, "create", pcd, team)
        assert not can_i(cluster, alice, "create", pcd, ops)  # only where edit is bound
    finally:
        cluster.helm("uninstall", release, "-n", ops, check=False)
        for ns in (ops, team):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)

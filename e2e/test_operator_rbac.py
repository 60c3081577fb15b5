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
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube.config.kubeconfig import KubeConfig

from harness.operator import (
    apply_yaml,
    bind_operator_rules,
    condition,
    get_json,
    install_crd,
    operator_rules,
    resource,
    run_as_service_account,
    wait_for,
)
from harness.pytest_cluster import Cluster
from promptcache.contract.router import MAPPING_FINALIZER
from promptcache.controller.errors import NotFoundError
from promptcache.controller.kube import Kube
from promptcache.controller.reconcile import apply_in_order

pytestmark = pytest.mark.cluster
TIMEOUT_S = 180


@pytest.fixture
def rbac_ns(cluster: Cluster) -> Iterator[str]:
    install_crd(cluster.kubectl)
    ns = cluster.create_namespace("rbac")
    try:
        yield ns
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_the_exact_rules_are_enough(cluster: Cluster, rbac_ns: str, tmp_path: Path) -> None:
    name = f"pco-full-{rbac_ns}"
    op = run_as_service_account(cluster, rbac_ns, name, operator_rules(name), tmp_path)
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
            obj = cluster.pcd_json(rbac_ns, "guarded")
            cond = condition(obj, "Ready")
            return cond and cond["status"] == "True"

        wait_for(ready, f"Ready under the exact ClusterRole\n{op.log_tail()}", timeout=TIMEOUT_S)
        obj = cluster.pcd_json(rbac_ns, "guarded")
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


def test_the_exact_rules_take_a_router_mapping_out(
    cluster: Cluster, rbac_ns: str, tmp_path: Path
) -> None:
    """routeByModel on, then off, then the resource deleted, under exactly the ClusterRole:
    the finalizers are held and released on the resource and its mapping (patch) and the
    mapping is deleted (the ConfigMap `delete` verb; without it the old prune was refused)."""
    name = f"pco-map-{rbac_ns}"
    op = run_as_service_account(cluster, rbac_ns, name, operator_rules(name), tmp_path)
    route = {"parentRefs": [{"name": "gw"}], "routeByModel": True}
    try:
        apply_yaml(cluster.kubectl, resource("mapped", rbac_ns, gateway={"route": route}))

        def finalizers(*args: str) -> list[str] | None:
            obj = get_json(cluster.kubectl, *args, "-n", rbac_ns)
            return None if obj is None else list(obj["metadata"].get("finalizers") or [])

        wait_for(
            lambda: (
                finalizers("configmap", "mapped-bbr") == [MAPPING_FINALIZER]
                and MAPPING_FINALIZER in (finalizers("pcd", "mapped") or [])
            ),
            "the mapping and its resource hold the finalizer",
            TIMEOUT_S,
            operator=op,
        )
        off = {"spec": {"gateway": {"route": {"routeByModel": False}}}}
        cluster.kubectl("-n", rbac_ns, "patch", "pcd", "mapped", "--type=merge", "-p",
                        json.dumps(off))  # fmt: skip
        wait_for(
            lambda: (
                finalizers("configmap", "mapped-bbr") is None
                and MAPPING_FINALIZER not in (finalizers("pcd", "mapped") or [])
            ),
            "the mapping deleted and the resource released",
            TIMEOUT_S,
            operator=op,
        )
        cluster.kubectl("-n", rbac_ns, "patch", "pcd", "mapped", "--type=merge", "-p",
                        json.dumps({"spec": {"gateway": {"route": route}}}))  # fmt: skip
        wait_for(
            lambda: finalizers("configmap", "mapped-bbr") == [MAPPING_FINALIZER],
            "the mapping back",
            TIMEOUT_S,
            operator=op,
        )
        cluster.kubectl("-n", rbac_ns, "delete", "pcd", "mapped", "--wait=false")
        wait_for(
            lambda: (
                finalizers("pcd", "mapped") is None
                and finalizers("configmap", "mapped-bbr") is None
            ),
            "the resource and its mapping gone",
            TIMEOUT_S,
            operator=op,
        )
        assert "orbidden" not in op.log_text()
    finally:
        op.stop()


def test_removing_one_rule_breaks_it(cluster: Cluster, rbac_ns: str, tmp_path: Path) -> None:
    name = f"pco-less-{rbac_ns}"
    rules = [r for r in operator_rules(name) if r["resources"] != ["poddisruptionbudgets"]]
    assert len(rules) == len(operator_rules(name)) - 1
    op = run_as_service_account(cluster, rbac_ns, name, rules, tmp_path)
    try:
        apply_yaml(cluster.kubectl, resource("unguarded", rbac_ns))

        def degraded() -> Any:
            cond = condition(cluster.pcd_json(rbac_ns, "unguarded"), "Degraded")
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
    bind_operator_rules(cluster, sa, rbac_ns, operator_rules(sa) + role_creator)
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
        # Pods and children are read from label-selected watches (controller/cache.py).
        assert can_i(cluster, sa, "watch", "pods", team)
        assert not can_i(cluster, sa, "get", "pods", team)
        assert not can_i(cluster, sa, "delete", "pods", team)
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
        assert cluster.pcd_json(team, "by-alice") is not None
        cluster.wait_for(lambda: can_i(cluster, bob, "get", pcd, team), "view aggregates")
        assert not can_i(cluster, bob, "create", pcd, team)
        assert not can_i(cluster, alice, "create", pcd, ops)  # only where edit is bound
    finally:
        cluster.helm("uninstall", release, "-n", ops, check=False)
        for ns in (ops, team):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)

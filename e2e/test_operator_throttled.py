"""The operator under API-server throttling, on the real API server: its 429s are waited
out for their Retry-After, and every resource still converges.

API Priority and Fairness decides: a FlowSchema sends this operator's ServiceAccount (and
nothing else) to a priority level of its own with one nominal share of the server's
concurrency (a few seats), no borrowing and no queue, so whatever it sends beyond those
seats is rejected at once with 429 and a Retry-After. The operator runs as that
ServiceAccount under the chart's exact rules: an admin client would match the `exempt`
schema and never be throttled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.operator import (
    apply_yaml,
    condition,
    get_json,
    install_crd,
    metric_sum,
    operator_rules,
    parse_prometheus,
    resource,
    run_as_service_account,
    wait_for,
)
from harness.pytest_cluster import Cluster

pytestmark = pytest.mark.cluster
RESOURCES = 6
TIMEOUT_S = 240
APF = "flowcontrol.apiserver.k8s.io/v1"


def _throttle(name: str, ns: str) -> list[dict[str, Any]]:
    """A priority level of one share without borrowing or queueing, and the FlowSchema that
    sends ServiceAccount `ns/name` there (before the built-in schemas: precedence 100)."""
    return [
        {"apiVersion": APF, "kind": "PriorityLevelConfiguration", "metadata": {"name": name},
         "spec": {"type": "Limited",
                  "limited": {"nominalConcurrencyShares": 1, "lendablePercent": 0,
                              "borrowingLimitPercent": 0,
                              "limitResponse": {"type": "Reject"}}}},
        {"apiVersion": APF, "kind": "FlowSchema", "metadata": {"name": name},
         "spec": {"priorityLevelConfiguration": {"name": name}, "matchingPrecedence": 100,
                  "distinguisherMethod": {"type": "ByUser"},
                  "rules": [{"subjects": [{"kind": "ServiceAccount",
                                           "serviceAccount": {"name": name, "namespace": ns}}],
                             "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"],
                                                "resources": ["*"], "clusterScope": True,
                                                "namespaces": ["*"]}],
                             "nonResourceRules": [{"verbs": ["*"],
                                                   "nonResourceURLs": ["*"]}]}]}},
    ]  # fmt: skip


def _rejected(cluster: Cluster, level: str) -> float:
    samples = parse_prometheus(cluster.kubectl("get", "--raw", "/metrics").stdout)
    return metric_sum(
        samples, "apiserver_flowcontrol_rejected_requests_total", priority_level=level
    )


def test_throttled_by_priority_and_fairness_the_operator_waits_and_converges(
    cluster: Cluster, tmp_path: Path
) -> None:
    install_crd(cluster.kubectl)
    ns = cluster.create_namespace("throttled")
    name = f"pco-slow-{ns}"
    apply_yaml(cluster.kubectl, *_throttle(name, ns))
    op = None
    try:
        op = run_as_service_account(cluster, ns, name, operator_rules(name), tmp_path,
                                    extra_args=("--no-leader-election",))  # fmt: skip
        # All at once: each reconcile applies its children concurrently, far more requests
        # in flight than the priority level's seats.
        apply_yaml(
            cluster.kubectl,
            *(resource(f"t{i}", ns, model={"replicas": 0}) for i in range(RESOURCES)),
        )

        def converged() -> bool:
            items = get_json(cluster.kubectl, "pcd", "-n", ns)["items"]
            done = [
                i for i in items
                if (i.get("status") or {}).get("observedGeneration") == i["metadata"]["generation"]
                and (condition(i, "Degraded") or {}).get("status") == "False"
            ]  # fmt: skip
            return len(done) == RESOURCES

        wait_for(converged, "every throttled resource reconciled", TIMEOUT_S, operator=op)
        # The operator keeps working after convergence (status writes, kopf's watches), so
        # both counters keep rising: read the operator's first. Every 429 it saw was counted
        # by the API server before the server sent it, so the server's count read *after*
        # bounds it; read in the other order, a rejection between the two reads breaks it.
        throttled = op.counter("promptcache_api_throttled_total")
        waited = op.counter("promptcache_api_throttle_wait_seconds_total")
        rejected = _rejected(cluster, name)
        assert rejected > 0, "the priority level never rejected: the test throttled nothing"
        # The operator's own client saw some of them (kopf's requests are the rest) and
        # waited each out for the Retry-After the API server sent (at least 1 s: APF's).
        assert 0 < throttled <= rejected
        assert waited >= throttled
        for kind in ("deployments", "services", "configmaps"):
            listed = get_json(cluster.kubectl, kind, "-n", ns)["items"]
            assert len(listed) >= RESOURCES, kind
    finally:
        if op is not None:
            op.stop()
        for kind in ("flowschema", "prioritylevelconfiguration"):
            cluster.kubectl("delete", kind, name, "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)

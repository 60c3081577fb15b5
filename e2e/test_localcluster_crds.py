"""localcluster.crds.wait_established on a real API server: a CRD applied a moment ago (not
visible or without conditions yet) is waited for, not an error; one that never appears
times out naming it."""

from __future__ import annotations

import json
import uuid

import pytest

from harness.localcluster.crds import established, kubectl_getter, wait_established
from harness.localcluster.errors import ClusterError
from harness.pytest_cluster import Cluster, binary

pytestmark = pytest.mark.cluster


def crd(group: str, plural: str) -> dict[str, object]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {"plural": plural, "singular": plural[:-1], "kind": plural[:-1].capitalize()},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object"}},
                }
            ],
        },
    }


def test_a_fresh_crd_is_waited_for_then_usable(cluster: Cluster) -> None:
    group = f"t{uuid.uuid4().hex[:8]}.example.com"
    names = [f"widgets.{group}", f"gadgets.{group}"]
    get = kubectl_getter([str(binary("kubectl")), "--kubeconfig", str(cluster.kubeconfig)])
    assert get(names[0]) is None  # not there yet: "not visible" reads as None, not an error
    try:
        docs = [crd(group, "widgets"), crd(group, "gadgets")]
        for doc in docs:
            cluster.kubectl("create", "-f", "-", input=json.dumps(doc))
        wait_established(get, names, timeout=60)  # right after the create: no race
        assert all(established(get(n)) for n in names)
        cluster.kubectl("get", f"widgets.{group}", "-A")  # served
    finally:
        for n in names:
            cluster.kubectl("delete", "crd", n, "--wait=false", check=False)


def test_a_crd_that_never_appears_times_out_naming_it(cluster: Cluster) -> None:
    get = kubectl_getter([str(binary("kubectl")), "--kubeconfig", str(cluster.kubeconfig)])
    with pytest.raises(ClusterError) as err:
        wait_established(get, ["nothings.absent.example.com"], timeout=1)
    assert "nothings.absent.example.com" in str(err.value)


def test_established_reads_only_a_true_established_condition() -> None:
    assert not established(None)
    assert not established({"status": {}})
    assert not established(
        {"status": {"conditions": [{"type": "NamesAccepted", "status": "True"}]}}
    )
    assert not established({"status": {"conditions": [{"type": "Established", "status": "False"}]}})
    assert established({"status": {"conditions": [{"type": "Established", "status": "True"}]}})

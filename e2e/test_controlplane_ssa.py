"""Server-side apply behaves as Kubernetes documents it (the operator relies on it).

Documented rules checked here (kubernetes.io "Server-Side Apply", Conflicts):
- a manager that applies a field another manager owns, with a different value, gets a
  409 Conflict naming the other manager and the field;
- applying the *same* value is no conflict: the field becomes shared;
- with force, the applier takes the field and the previous manager loses it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from harness.pytest_cluster import Cluster

pytestmark = pytest.mark.cluster


def cm(data: dict[str, str]) -> str:
    return json.dumps(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": data}
    )


def owners_of(cluster: Cluster, namespace: str, key: str) -> set[str]:
    """Managers whose managedFields own data.<key>, as the API server reports them."""
    obj = cluster.get_json("configmap", "settings", "-n", namespace, "--show-managed-fields")
    found = set()
    for entry in obj["metadata"].get("managedFields", []):
        fields: dict[str, Any] = entry.get("fieldsV1", {})
        if f"f:{key}" in fields.get("f:data", {}):
            found.add(entry["manager"])
    return found


def apply(cluster: Cluster, ns: str, manager: str, data: dict[str, str], *extra: str) -> Any:
    return cluster.kubectl(
        "apply", "--server-side", f"--field-manager={manager}", "-n", ns, "-f", "-", *extra,
        input=cm(data), check=False,
    )  # fmt: skip


def test_server_side_apply_conflict_and_force(cluster: Cluster, namespace: str) -> None:
    first = apply(cluster, namespace, "alice", {"replicas": "1", "mode": "shared"})
    assert first.returncode == 0, first.stderr
    assert owners_of(cluster, namespace, "replicas") == {"alice"}

    # Same value from another manager: no conflict, ownership is shared.
    same = apply(cluster, namespace, "bob", {"mode": "shared"})
    assert same.returncode == 0, same.stderr
    assert owners_of(cluster, namespace, "mode") == {"alice", "bob"}

    # Different value, no force: a conflict naming the owner and the field; nothing changes.
    clash = apply(cluster, namespace, "bob", {"mode": "shared", "replicas": "2"})
    assert clash.returncode != 0
    assert "conflict" in clash.stderr.lower()
    assert 'conflict with "alice"' in clash.stderr
    assert ".data.replicas" in clash.stderr
    obj = cluster.get_json("configmap", "settings", "-n", namespace)
    assert obj["data"]["replicas"] == "1"

    # The same request through the Python client shows the HTTP status: 409.
    with pytest.raises(ApiException) as info:
        cluster.core.patch_namespaced_config_map(
            "settings",
            namespace,
            json.loads(cm({"mode": "shared", "replicas": "2"})),
            field_manager="bob",
            _content_type="application/apply-patch+yaml",
        )
    assert info.value.status == 409
    assert "alice" in str(info.value.body)

    # Force: bob takes the field, alice no longer owns it; the shared field stays shared.
    forced = apply(cluster, namespace, "bob", {"mode": "shared", "replicas": "2"},
                   "--force-conflicts")  # fmt: skip
    assert forced.returncode == 0, forced.stderr
    assert cluster.get_json("configmap", "settings", "-n", namespace)["data"]["replicas"] == "2"
    assert owners_of(cluster, namespace, "replicas") == {"bob"}
    assert owners_of(cluster, namespace, "mode") == {"alice", "bob"}

    # A manager that stops applying a field it solely owns removes it.
    dropped = apply(cluster, namespace, "bob", {"mode": "shared"})
    assert dropped.returncode == 0, dropped.stderr
    assert "replicas" not in cluster.get_json("configmap", "settings", "-n", namespace)["data"]

"""The picker pod's NetworkPolicy: its served ports only, the inner ext_proc port for the
policy step only.

`promptcache`'s picker (the default) serves alone and reads the salt key: its pod admits
the ports it serves, whatever the isolation mode. Behind the gateway's policy step the picker serves plaintext ext_proc on
`EPP_LOCAL_GRPC_PORT` for the step on the pod's loopback. Neither picker can bind that port
to loopback (GIE v1.5.0's `--help` lists no bind-address flag), so the renderer admits
ingress to the picker pod only on the ports the pod serves to others: what the Service
targets, the probes' health port, metrics. The checks read the rendered Deployment, so a
port added to the pod without the policy following it fails here.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings

from harness.resource_strategies import resources
from harness.resources import rendered
from harness.schemas import validate_manifest
from promptcache.api import parse_resource, resolved
from promptcache.contract import EPP_LOCAL_GRPC_PORT, PickerTarget
from promptcache.render import render
from promptcache.render.epp import uses_policy_step
from promptcache.render.picker import picker_of

STEPPED = {"picker": "llm-d-router"}
"""A picker the policy step fronts (when isolation derives salts or sessions are on)."""


def one(manifests: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    (found,) = [
        m for m in manifests if m["kind"] == kind and m["metadata"]["name"].endswith(suffix)
    ]
    return found


def policies(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == "NetworkPolicy"]


def admitted(policy: dict[str, Any]) -> set[int]:
    """Ports the policy admits (every rule admits from any source: no `from`)."""
    out: set[int] = set()
    for rule in policy["spec"]["ingress"]:
        assert "from" not in rule
        out |= {p["port"] for p in rule["ports"]}
    return out


def selected(policy: dict[str, Any], labels: dict[str, str]) -> bool:
    wanted = policy["spec"]["podSelector"]["matchLabels"]
    return all(labels.get(k) == v for k, v in wanted.items())


def pod_labels(dep: dict[str, Any]) -> dict[str, str]:
    return dict(dep["spec"]["template"]["metadata"]["labels"])


def served_ports(manifests: list[dict[str, Any]]) -> dict[str, int]:
    """The picker pod's named container ports (what the Service and probes reach)."""
    pod = one(manifests, "Deployment", "-epp")["spec"]["template"]["spec"]
    return {p["name"]: p["containerPort"] for c in pod["containers"] for p in c.get("ports", [])}


def test_the_default_picker_admits_exactly_the_ports_it_serves() -> None:
    for isolation in ({"mode": "Shared"}, {"mode": "PerKey"}, {"mode": "Required"}):
        manifests = rendered(isolation={**isolation, "header": "x-tenant"})
        (policy,) = policies(manifests)
        validate_manifest(policy)
        assert (
            policy["metadata"]["name"] == one(manifests, "Deployment", "-epp")["metadata"]["name"]
        )
        assert admitted(policy) == set(served_ports(manifests).values()) == {9002, 9003, 9090}
        service = one(manifests, "Service", "-epp")
        assert {served_ports(manifests)[p["targetPort"]] for p in service["spec"]["ports"]} <= (
            admitted(policy)
        )


def test_behind_the_policy_step_only_the_served_ports_are_admitted() -> None:
    manifests = rendered(gateway=STEPPED)  # PerKey isolation: the step fronts the picker
    (policy,) = policies(manifests)
    validate_manifest(policy)
    assert policy["metadata"]["name"] == one(manifests, "Deployment", "-epp")["metadata"]["name"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    ports = served_ports(manifests)
    assert admitted(policy) == set(ports.values()) == {9002, 9003, 9090, 9092}
    epp = next(
        c
        for c in one(manifests, "Deployment", "-epp")["spec"]["template"]["spec"]["containers"]
        if c["name"] == "epp"
    )
    inner = int(epp["args"][epp["args"].index("--grpc-port") + 1])
    assert inner == EPP_LOCAL_GRPC_PORT
    assert inner not in admitted(policy)
    # Every port the Service sends to is admitted, by the name it targets.
    service = one(manifests, "Service", "-epp")
    assert {ports[p["targetPort"]] for p in service["spec"]["ports"]} <= admitted(policy)


def test_it_selects_the_picker_pods_and_no_model_server() -> None:
    manifests = rendered()
    (policy,) = policies(manifests)
    picker, model = (
        one(manifests, "Deployment", "-epp"),
        next(
            m
            for m in manifests
            if m["kind"] == "Deployment" and not m["metadata"]["name"].endswith("-epp")
        ),
    )
    assert selected(policy, pod_labels(picker))
    assert not selected(policy, pod_labels(model))


def test_no_policy_step_no_policy_and_the_switch_turns_it_off() -> None:
    assert policies(rendered(gateway=STEPPED, isolation={"mode": "Shared"})) == []
    assert policies(rendered(gateway={**STEPPED, "networkPolicy": False})) == []
    assert policies(rendered(gateway={"networkPolicy": False})) == []
    shared_sessions = {"isolation": {"mode": "Shared"}, "sessionAffinity": {"enabled": True}}
    assert len(policies(rendered(gateway=STEPPED, **shared_sessions)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(resources())
def test_any_resource_the_inner_port_is_never_admitted(doc: dict[str, Any]) -> None:
    pcd = resolved(parse_resource(doc))
    manifests = render(pcd)
    found = policies(manifests)
    alone = picker_of(pcd) is PickerTarget.PROMPTCACHE
    if not ((uses_policy_step(pcd) or alone) and pcd.spec.gateway.network_policy):
        assert found == []
        return
    (policy,) = found
    validate_manifest(policy)
    assert EPP_LOCAL_GRPC_PORT not in admitted(policy)
    assert admitted(policy) == set(served_ports(manifests).values())

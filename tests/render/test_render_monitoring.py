"""PodMonitors: only when monitoring is on, selecting exactly the pods the Deployments run."""

from __future__ import annotations

from typing import Any

import pytest

from harness.schemas import validate_manifest
from promptcache.api import parse_resource
from promptcache.render import render
from promptcache.render.monitoring import RELABELINGS


def doc(**monitoring: Any) -> Any:
    return parse_resource({
        "apiVersion": "serving.promptcache.io/v1alpha1",
        "kind": "PromptCacheDeployment",
        "metadata": {"name": "qwen", "namespace": "llm"},
        "spec": {"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
                 **({"monitoring": monitoring} if monitoring else {})},
    })  # fmt: skip


@pytest.mark.parametrize("monitoring", [{}, {"enabled": False}])
def test_no_pod_monitor_unless_enabled(monitoring: dict[str, Any]) -> None:
    assert [m for m in render(doc(**monitoring)) if m["kind"] == "PodMonitor"] == []


def test_pod_monitors_select_the_pods_and_their_metrics_ports() -> None:
    manifests = render(doc(enabled=True, interval="15s"))
    monitors = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "PodMonitor"}
    deployments = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "Deployment"}
    assert set(monitors) == set(deployments)
    for name, monitor in monitors.items():
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["namespace"] == "llm"
        pod = deployments[name]["spec"]["template"]
        selector = monitor["spec"]["selector"]["matchLabels"]
        assert selector == deployments[name]["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod["metadata"]["labels"].items()
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        assert endpoint["port"] in ports, f"{name}: no container port {endpoint['port']}"
        assert (endpoint["path"], endpoint["interval"]) == ("/metrics", "15s")
        assert endpoint["relabelings"] == RELABELINGS
        validate_manifest(monitor)  # the pinned Prometheus Operator CRD, unknown fields refused
    assert {RELABELINGS[0]["targetLabel"], RELABELINGS[1]["targetLabel"]} == {
        "promptcache_deployment",
        "component",
    }


def test_the_operator_default_applies_only_where_the_spec_is_silent() -> None:
    from promptcache.api import OperatorDefaults

    on = OperatorDefaults(pod_monitors=True)
    kinds = [m["kind"] for m in render(doc(), on)]
    assert kinds.count("PodMonitor") == 2
    assert "PodMonitor" not in [m["kind"] for m in render(doc(enabled=False), on)]

"""spec.autoscaling renders an autoscaling/v2 HPA on the resource's own scale subresource."""

from __future__ import annotations

from typing import Any

import pytest

from harness.schemas import validate_manifest
from promptcache.api import parse_resource
from promptcache.api.crd import custom_resource_definition
from promptcache.render import render


def resource(**autoscaling: Any) -> dict[str, Any]:
    return {
        "apiVersion": "serving.promptcache.io/v1alpha1",
        "kind": "PromptCacheDeployment",
        "metadata": {"name": "demo", "namespace": "ns"},
        "spec": {"model": {"name": "org/model"}, "autoscaling": autoscaling},
    }


def hpas(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in render(parse_resource(doc)) if m["kind"] == "HorizontalPodAutoscaler"]


def test_off_by_default() -> None:
    assert hpas(resource()) == []


@pytest.mark.parametrize(
    ("settings", "metric", "target"),
    [
        ({}, "vllm_num_requests_waiting", "2"),
        ({"target": 5}, "vllm_num_requests_waiting", "5"),
        ({"metric": "KVCacheUsage"}, "vllm_kv_cache_usage_perc", "800m"),
        ({"metric": "KVCacheUsage", "target": "600m", "customMetricName": "kv_usage"},
         "kv_usage", "600m"),
    ],
)  # fmt: skip
def test_the_hpa_scales_this_resource_on_a_per_pod_metric(
    settings: dict[str, Any], metric: str, target: str
) -> None:
    (hpa,) = hpas(resource(enabled=True, minReplicas=2, maxReplicas=6, **settings))
    validate_manifest(hpa)
    assert hpa["metadata"]["name"] == "demo"
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "serving.promptcache.io/v1alpha1",
        "kind": "PromptCacheDeployment",
        "name": "demo",
    }
    assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 6)
    assert spec["metrics"] == [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": metric},
                "target": {"type": "AverageValue", "averageValue": target},
            },
        }
    ]
    assert spec["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300


def test_the_scale_subresource_gives_the_hpa_what_it_reads() -> None:
    """The HPA scales through spec.model.replicas and selects pods by status.selector."""
    scale = custom_resource_definition()["spec"]["versions"][0]["subresources"]["scale"]
    assert scale["specReplicasPath"] == ".spec.model.replicas"
    assert scale["labelSelectorPath"] == ".status.selector"

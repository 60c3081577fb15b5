"""The HorizontalPodAutoscaler that scales a PromptCacheDeployment on its model servers' load.

It targets the resource itself through its scale subresource (`spec.model.replicas`,
`status.replicas`, `status.selector`), so the operator stays the only writer of the
Deployment. The metric is per pod, read through the custom metrics API: whatever serves that
API (prometheus-adapter, KEDA's metrics server, ...) must expose vLLM's series under the
names below, or under `autoscaling.customMetricName`.
"""

from __future__ import annotations

from typing import Any, Final

from promptcache.api import API_VERSION, KIND, PromptCacheDeployment
from promptcache.render.names import Component, Names, metadata

METRIC_NAMES: Final[dict[str, str]] = {
    "WaitingRequests": "vllm_num_requests_waiting",
    "KVCacheUsage": "vllm_kv_cache_usage_perc",
}
"""Custom-metrics names of vLLM's `vllm:num_requests_waiting` and `vllm:kv_cache_usage_perc`
(Prometheus' `:` replaced by `_`, as the documented adapter rule does)."""
DEFAULT_TARGETS: Final[dict[str, str]] = {"WaitingRequests": "2", "KVCacheUsage": "800m"}


def autoscaler(pcd: PromptCacheDeployment, names: Names) -> dict[str, Any] | None:
    spec = pcd.spec.autoscaling
    if not spec.enabled:
        return None
    target = spec.target if spec.target is not None else DEFAULT_TARGETS[spec.metric]
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(names, names.instance, Component.MODEL_SERVER),
        "spec": {
            "scaleTargetRef": {"apiVersion": API_VERSION, "kind": KIND, "name": names.instance},
            "minReplicas": spec.min_replicas,
            "maxReplicas": spec.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": spec.custom_metric_name or METRIC_NAMES[spec.metric]},
                        "target": {"type": "AverageValue", "averageValue": str(target)},
                    },
                }
            ],
            "behavior": {
                "scaleDown": {"stabilizationWindowSeconds": spec.scale_down_stabilization_seconds}
            },
        },
    }

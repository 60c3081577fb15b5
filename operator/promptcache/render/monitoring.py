"""PodMonitors for the Prometheus Operator: the model servers' and the Endpoint Picker's metrics.

Emitted only when `spec.monitoring.enabled` is true, or empty while the operator-wide
default `--pod-monitors` is true (render stays a pure function of the resource and the
defaults). Conventions of the Prometheus Operator: `monitoring.coreos.com/v1`
PodMonitor in the resource's namespace, selecting the pods by their immutable selector
labels, endpoints by container port name. The Prometheus Operator itself adds the
`namespace`, `pod` and `container` target labels; the relabelings add
`promptcache_deployment` (the resource) and `component`, which the chart's rules and
dashboard aggregate by (docs/monitoring.md).
"""

from __future__ import annotations

from typing import Any, Final

from promptcache.api import PromptCacheDeployment, filled
from promptcache.render.names import Component, Names, metadata, selector_labels

MONITORING_API: Final[str] = "monitoring.coreos.com/v1"
POD_MONITOR: Final[str] = "PodMonitor"
MONITORING_KINDS: Final[frozenset[str]] = frozenset({POD_MONITOR})
"""Kinds whose CRDs come from the Prometheus Operator and may be missing from a cluster."""

RELABELINGS: Final[list[dict[str, Any]]] = [
    {
        "sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
        "targetLabel": "promptcache_deployment",
    },
    {
        "sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_component"],
        "targetLabel": "component",
    },
]


def _pod_monitor(
    pcd: PromptCacheDeployment, names: Names, component: str, name: str, port: str
) -> dict[str, Any]:
    return {
        "apiVersion": MONITORING_API,
        "kind": POD_MONITOR,
        "metadata": metadata(names, name, component),
        "spec": {
            "selector": {"matchLabels": selector_labels(names, component)},
            "podMetricsEndpoints": [
                {
                    "port": port,
                    "path": "/metrics",
                    "interval": pcd.spec.monitoring.interval,
                    "relabelings": [dict(r) for r in RELABELINGS],
                }
            ],
        },
    }


def monitoring_enabled(pcd: PromptCacheDeployment) -> bool:
    """`spec.monitoring.enabled` of the resolved resource (empty, the operator's
    `--pod-monitors` filled it)."""
    return filled(pcd.spec.monitoring.enabled, "spec.monitoring.enabled")


def pod_monitors(pcd: PromptCacheDeployment, names: Names) -> list[dict[str, Any]]:
    """The model servers' PodMonitor (the front's port, which carries vLLM's metrics too) and
    the Endpoint Picker's; none unless monitoring is enabled."""
    if not monitoring_enabled(pcd):
        return []
    return [
        _pod_monitor(pcd, names, Component.MODEL_SERVER, names.model_server, "http"),
        _pod_monitor(pcd, names, Component.ENDPOINT_PICKER, names.epp, "metrics"),
    ]


__all__ = [
    "MONITORING_API",
    "MONITORING_KINDS",
    "POD_MONITOR",
    "RELABELINGS",
    "monitoring_enabled",
    "pod_monitors",
]

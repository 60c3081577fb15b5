"""`podTemplate` overlay cases: each kind of override, where it lands in the rendered pod,
and a resource carrying one; shared by the render tests and the API-server tests."""

from __future__ import annotations

from typing import Any

from promptcache.contract import ENDPOINT_PICKER_POD, MODEL_SERVER_POD, Container

PODS = {
    "model": ("model-server", Container.VLLM.value, MODEL_SERVER_POD),
    "gateway": ("endpoint-picker", Container.EPP.value, ENDPOINT_PICKER_POD),
}
VOLUME = {"name": "extra", "configMap": {"name": "my-config"}}
MOUNT = {"name": "extra", "mountPath": "/etc/extra", "readOnly": True}
AFFINITY: dict[str, Any] = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu-a"]}]}
            ]
        }
    },
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 100,
                "podAffinityTerm": {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "demo"}},
                },
            }
        ]
    },
}
SPREAD = {
    "maxSkew": 1,
    "topologyKey": "topology.kubernetes.io/zone",
    "whenUnsatisfiable": "ScheduleAnyway",
    "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "demo"}},
}
# (override, where it lands in the pod template, what must be there)
KINDS: dict[str, tuple[dict[str, Any], tuple[str, ...], Any]] = {
    "labels": ({"metadata": {"labels": {"team": "search"}}}, ("metadata", "labels", "team"),
               "search"),
    "annotations": ({"metadata": {"annotations": {"sidecar.istio.io/inject": "false"}}},
                    ("metadata", "annotations", "sidecar.istio.io/inject"), "false"),
    "affinity": ({"spec": {"affinity": AFFINITY}}, ("spec", "affinity"), AFFINITY),
    "topologySpreadConstraints": ({"spec": {"topologySpreadConstraints": [SPREAD]}},
                                  ("spec", "topologySpreadConstraints"), [SPREAD]),
    "imagePullSecrets": ({"spec": {"imagePullSecrets": [{"name": "regcred"}]}},
                         ("spec", "imagePullSecrets"), [{"name": "regcred"}]),
    "priorityClassName": ({"spec": {"priorityClassName": "inference-high"}},
                          ("spec", "priorityClassName"), "inference-high"),
    "runtimeClassName": ({"spec": {"runtimeClassName": "nvidia"}}, ("spec", "runtimeClassName"),
                         "nvidia"),
    "schedulerName": ({"spec": {"schedulerName": "volcano"}}, ("spec", "schedulerName"),
                      "volcano"),
}  # fmt: skip


def resource(where: str, overlay: dict[str, Any]) -> dict[str, Any]:
    """A minimal resource with `overlay` as the `podTemplate` of `where` (model, gateway)."""
    spec: dict[str, Any] = {"model": {"name": "org/model"}}
    spec.setdefault(where, {})["podTemplate"] = overlay
    return {
        "apiVersion": "serving.promptcache.io/v1alpha1",
        "kind": "PromptCacheDeployment",
        "metadata": {"name": "demo", "namespace": "ns"},
        "spec": spec,
    }

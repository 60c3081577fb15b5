"""The Endpoint Picker: Deployment, Service, ServiceAccount, RBAC and its ConfigMap."""

from __future__ import annotations

from typing import Any, Final

from promptcache.api import PromptCacheDeployment
from promptcache.render.epp_config import (
    endpoint_picker_config,
    endpoint_picker_config_text,
    needs_experimental_plugins,
)
from promptcache.render.names import Component, Names, metadata, selector_labels
from promptcache.render.security import container_security_context, pod_security_context

GRPC_PORT: Final[int] = 9002
GRPC_HEALTH_PORT: Final[int] = 9003
METRICS_PORT: Final[int] = 9090
CONFIG_DIR: Final[str] = "/config"
CONFIG_KEY: Final[str] = "config.yaml"
POOL_GROUP: Final[str] = "inference.networking.k8s.io"
_READ: Final[list[str]] = ["get", "list", "watch"]


def epp_args(pcd: PromptCacheDeployment, names: Names) -> list[str]:
    """The flags the EPP runs with; docs/endpoint-picker.md says why each is there."""
    gateway = pcd.spec.gateway
    args = [
        "--pool-name", names.pool,
        "--pool-namespace", names.namespace,
        "--pool-group", POOL_GROUP,
        "--config-file", f"{CONFIG_DIR}/{CONFIG_KEY}",
        "--grpc-port", str(GRPC_PORT),
        "--grpc-health-port", str(GRPC_HEALTH_PORT),
        "--metrics-port", str(METRICS_PORT),
        # Scrapers need no TokenReview rights; the operator then needs no ClusterRoles per pool.
        "--metrics-endpoint-auth=false",
        "--tracing=false",
    ]  # fmt: skip
    if needs_experimental_plugins(endpoint_picker_config(pcd)):
        args.append("--allow-experimental-plugins")
    if gateway.replicas > 1:
        args.append("--ha-enable-leader-election")
    return args + list(gateway.extra_flags)


def _probe(service: str, period: int) -> dict[str, Any]:
    return {"grpc": {"port": GRPC_HEALTH_PORT, "service": service}, "periodSeconds": period}


def epp_deployment(pcd: PromptCacheDeployment, names: Names) -> dict[str, Any]:
    replicas = pcd.spec.gateway.replicas
    # With leader election only the leader serves; probes then name the role they check.
    liveness, readiness = (
        ("liveness", "readiness") if replicas > 1 else ("inference-extension",) * 2
    )
    container = {
        "name": "epp",
        "image": pcd.spec.gateway.epp_image,
        "imagePullPolicy": "IfNotPresent",
        "args": epp_args(pcd, names),
        "env": [
            {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "ports": [
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "grpc-health", "containerPort": GRPC_HEALTH_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "livenessProbe": {**_probe(liveness, 10), "initialDelaySeconds": 5},
        "readinessProbe": _probe(readiness, 2),
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        "securityContext": container_security_context(read_only_root=True),
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(names, names.epp, Component.ENDPOINT_PICKER),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector_labels(names, Component.ENDPOINT_PICKER)},
            "template": {
                "metadata": {
                    "labels": {
                        **selector_labels(names, Component.ENDPOINT_PICKER),
                        "app.kubernetes.io/part-of": "promptcache",
                    }
                },
                "spec": {
                    "serviceAccountName": names.epp,
                    "securityContext": pod_security_context(),
                    "terminationGracePeriodSeconds": 130,
                    "containers": [container],
                    "volumes": [{"name": "config", "configMap": {"name": names.epp}}],
                },
            },
        },
    }


def epp_service(names: Names) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(names, names.epp, Component.ENDPOINT_PICKER),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(names, Component.ENDPOINT_PICKER),
            "ports": [
                {
                    "name": "grpc-ext-proc",
                    "port": GRPC_PORT,
                    "targetPort": "grpc",
                    "protocol": "TCP",
                    "appProtocol": "kubernetes.io/h2c",
                },
                {
                    "name": "http-metrics",
                    "port": METRICS_PORT,
                    "targetPort": "metrics",
                    "protocol": "TCP",
                },
            ],
        },
    }


def epp_config_map(pcd: PromptCacheDeployment, names: Names) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(names, names.epp, Component.ENDPOINT_PICKER),
        "data": {CONFIG_KEY: endpoint_picker_config_text(pcd)},
    }


def epp_service_account(names: Names) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(names, names.epp, Component.ENDPOINT_PICKER),
        "automountServiceAccountToken": True,
    }


def epp_role(pcd: PromptCacheDeployment, names: Names) -> dict[str, Any]:
    """Exactly what the EPP reads, in its own namespace (docs/endpoint-picker.md, 'RBAC')."""
    rules: list[dict[str, Any]] = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": _READ},
        {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"], "verbs": _READ},
        {
            "apiGroups": ["llm-d.ai", "inference.networking.x-k8s.io"],
            "resources": ["inferenceobjectives", "inferencemodelrewrites"],
            "verbs": _READ,
        },
    ]
    if pcd.spec.gateway.replicas > 1:
        rules += [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
            },
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        ]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata(names, names.epp, Component.ENDPOINT_PICKER),
        "rules": rules,
    }


def epp_role_binding(names: Names) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata(names, names.epp, Component.ENDPOINT_PICKER),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": names.epp},
        "subjects": [{"kind": "ServiceAccount", "name": names.epp, "namespace": names.namespace}],
    }

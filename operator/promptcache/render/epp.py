"""The Endpoint Picker: Deployment, Service, ServiceAccount, RBAC and its ConfigMap."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from promptcache.api import BUILT_IN_DEFAULTS, OperatorDefaults, PromptCacheDeployment
from promptcache.contract import (
    EPP_EXT_PROC_PORT,
    EPP_LOCAL_GRPC_PORT,
    SESSION_USER_FIELD,
    SessionShimEnv,
)
from promptcache.contract.shim import (
    DEFAULT_SHIM_LISTEN,
    DEFAULT_SHIM_MAX_BODY_BYTES,
    DEFAULT_SHIM_MAX_BUFFERED_BYTES,
    DEFAULT_SHIM_UPSTREAM,
)
from promptcache.render.epp_config import (
    endpoint_picker_config,
    endpoint_picker_config_text,
    needs_experimental_plugins,
)
from promptcache.render.names import Component, Names, metadata, selector_labels
from promptcache.render.security import container_security_context, pod_security_context

GRPC_PORT: Final[int] = EPP_EXT_PROC_PORT
"""What the gateway dials through the Service: the EPP's port, or the session shim's."""
GRPC_HEALTH_PORT: Final[int] = 9003
METRICS_PORT: Final[int] = 9090
CONFIG_DIR: Final[str] = "/config"
CONFIG_KEY: Final[str] = "config.yaml"
POOL_GROUP: Final[str] = "inference.networking.k8s.io"
_READ: Final[list[str]] = ["get", "list", "watch"]
SESSION_SHIM_CONTAINER: Final[str] = "session-shim"
TERMINATION_GRACE_SECONDS: Final[int] = 130
SHIM_DRAIN_SECONDS: Final[int] = TERMINATION_GRACE_SECONDS - 10
"""Open ext_proc streams (one per in-flight request) may finish before the pod is killed."""


def uses_session_shim(pcd: PromptCacheDeployment) -> bool:
    """Whether the body's `user` must reach the EPP: then the session shim fronts it.

    The EPP reads the session from a header only (docs/endpoint-picker.md, 'How a `user`
    field reaches the Endpoint Picker')."""
    session = pcd.spec.session_affinity
    return session.enabled and session.use_user_field


def epp_args(pcd: PromptCacheDeployment, names: Names) -> list[str]:
    """The flags the EPP runs with; docs/endpoint-picker.md says why each is there."""
    gateway = pcd.spec.gateway
    args = [
        "--pool-name", names.pool,
        "--pool-namespace", names.namespace,
        "--pool-group", POOL_GROUP,
        "--config-file", f"{CONFIG_DIR}/{CONFIG_KEY}",
        # Behind the session shim the EPP takes another port; the shim dials it on localhost.
        "--grpc-port", str(EPP_LOCAL_GRPC_PORT if uses_session_shim(pcd) else GRPC_PORT),
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


def session_shim_image(pcd: PromptCacheDeployment, defaults: OperatorDefaults) -> str:
    """The resource's `gateway.sessionShimImage`, else the operator's default."""
    return pcd.spec.gateway.session_shim_image or defaults.session_shim_image


def session_shim_container(
    pcd: PromptCacheDeployment, defaults: OperatorDefaults = BUILT_IN_DEFAULTS
) -> dict[str, Any]:
    """The ext_proc proxy that copies the body's `user` into the session header.

    It owns the `grpc` port the Service targets and relays to the EPP on localhost; its
    memory limit covers the bodies it may hold (`MAX_BUFFERED_BYTES`) plus the runtime."""
    env = {
        SessionShimEnv.LISTEN: DEFAULT_SHIM_LISTEN,
        SessionShimEnv.UPSTREAM: DEFAULT_SHIM_UPSTREAM,
        SessionShimEnv.SESSION_HEADER: pcd.spec.session_affinity.header,
        SessionShimEnv.USER_FIELD: SESSION_USER_FIELD,
        SessionShimEnv.MAX_BODY_BYTES: str(DEFAULT_SHIM_MAX_BODY_BYTES),
        SessionShimEnv.MAX_BUFFERED_BYTES: str(DEFAULT_SHIM_MAX_BUFFERED_BYTES),
        SessionShimEnv.DRAIN_SECONDS: str(SHIM_DRAIN_SECONDS),
    }
    tcp = {"tcpSocket": {"port": "grpc"}}
    return {
        "name": SESSION_SHIM_CONTAINER,
        "image": session_shim_image(pcd, defaults),
        "imagePullPolicy": "IfNotPresent",
        "args": ["session-shim"],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "ports": [{"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"}],
        "livenessProbe": {**tcp, "initialDelaySeconds": 5, "periodSeconds": 10},
        "readinessProbe": {**tcp, "periodSeconds": 2},
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"memory": "256Mi"},
        },
        "securityContext": container_security_context(),
    }


def epp_deployment(
    pcd: PromptCacheDeployment, names: Names, defaults: OperatorDefaults = BUILT_IN_DEFAULTS
) -> dict[str, Any]:
    replicas = pcd.spec.gateway.replicas
    shim = uses_session_shim(pcd)
    # With leader election only the leader serves; probes then name the role they check.
    liveness, readiness = (
        ("liveness", "readiness") if replicas > 1 else ("inference-extension",) * 2
    )
    # Behind the shim the EPP's ext_proc port is the shim's upstream, not a named pod port.
    grpc_port = [] if shim else [{"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"}]
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
            *grpc_port,
            {"name": "grpc-health", "containerPort": GRPC_HEALTH_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "livenessProbe": {**_probe(liveness, 10), "initialDelaySeconds": 5},
        "readinessProbe": _probe(readiness, 2),
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        "securityContext": container_security_context(),
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
                    "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
                    "containers": [
                        container,
                        *([session_shim_container(pcd, defaults)] if shim else []),
                    ],
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


PICKER_READ_RULES: Final[tuple[dict[str, Any], ...]] = (
    {"apiGroups": [""], "resources": ["pods"], "verbs": _READ},
    {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"], "verbs": _READ},
    {
        "apiGroups": ["llm-d.ai", "inference.networking.x-k8s.io"],
        "resources": ["inferenceobjectives", "inferencemodelrewrites"],
        "verbs": _READ,
    },
)
"""What every Endpoint Picker reads in its namespace (docs/endpoint-picker.md, 'RBAC')."""
PICKER_LEADER_RULES: Final[tuple[dict[str, Any], ...]] = (
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
    },
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
)
"""What replicas > 1 add: the pickers elect a leader through a Lease in their namespace."""


def _fresh(rules: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies sharing no list (a YAML dump would otherwise write anchors)."""
    return [{key: list(value) for key, value in rule.items()} for rule in rules]


def picker_rules() -> list[dict[str, Any]]:
    """Every rule a picker may need: the chart's static Endpoint Picker ClusterRole.

    A RoleBinding grants it in one namespace only, so the leader rules reach no other."""
    return _fresh([*PICKER_READ_RULES, *PICKER_LEADER_RULES])


def epp_role(pcd: PromptCacheDeployment, names: Names) -> dict[str, Any]:
    """Exactly what the EPP reads, in its own namespace (docs/endpoint-picker.md, 'RBAC').

    Rendered without an operator (`promptcache render`); an operator binds the chart's
    static ClusterRole instead (`epp_cluster_role_binding`)."""
    rules = _fresh(PICKER_READ_RULES)
    if pcd.spec.gateway.replicas > 1:
        rules += _fresh(PICKER_LEADER_RULES)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata(names, names.epp, Component.ENDPOINT_PICKER),
        "rules": rules,
    }


def epp_cluster_role_binding_name(names: Names) -> str:
    """Not `names.epp`: a RoleBinding's roleRef is immutable, and an operator upgraded from
    a Role-based release still owns a RoleBinding of that name pointing at the Role."""
    return f"{names.epp}-picker"


def epp_cluster_role_binding(names: Names, cluster_role: str) -> dict[str, Any]:
    """The picker's rights: the chart's static ClusterRole, bound in this namespace only.

    The operator may create it because it holds `bind` on exactly that ClusterRole; it
    holds none of the rights inside (no cluster-wide leases, pods or events)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata(
            names, epp_cluster_role_binding_name(names), Component.ENDPOINT_PICKER
        ),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": cluster_role,
        },
        "subjects": [{"kind": "ServiceAccount", "name": names.epp, "namespace": names.namespace}],
    }


def epp_role_binding(names: Names) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata(names, names.epp, Component.ENDPOINT_PICKER),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": names.epp},
        "subjects": [{"kind": "ServiceAccount", "name": names.epp, "namespace": names.namespace}],
    }

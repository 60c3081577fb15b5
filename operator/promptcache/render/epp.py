"""The Endpoint Picker: Deployment, Service, ServiceAccount, RBAC and its ConfigMap."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Final

from promptcache.api import PromptCacheDeployment, filled
from promptcache.contract import (
    EPP_EXT_PROC_PORT,
    EPP_LOCAL_GRPC_PORT,
    GATEWAY_POLICY_METRICS_PORT,
    GO_GC_PERCENT_ENV,
    GO_MEMORY_LIMIT_ENV,
    OPERATOR_ANNOTATION_PREFIX,
    SALT_KEY_MOUNT_DIR,
    SESSION_USER_FIELD,
    Command,
    Container,
    GatewayPolicyEnv,
    PickerFlag,
)
from promptcache.contract import PickerFeature as Feature
from promptcache.contract.gateway_policy import (
    DEFAULT_GATEWAY_POLICY_LISTEN,
    DEFAULT_GATEWAY_POLICY_MAX_BUFFERED_BYTES,
    DEFAULT_GATEWAY_POLICY_METRICS_LISTEN,
    DEFAULT_GATEWAY_POLICY_UPSTREAM,
    GATEWAY_POLICY_BUDGET_PER_MAX_BODY,
    GATEWAY_POLICY_SETTINGS,
    ISOLATION_FIELDS,
)
from promptcache.contract.settings import format_float
from promptcache.render.epp_config import (
    endpoint_picker_config,
    endpoint_picker_config_text,
    needs_experimental_plugins,
)
from promptcache.render.epp_sizing import (
    GO_GC_PERCENT,
    go_memory_limit,
    picker_millicores,
    promptcache_picker_memory,
    step_millicores,
    step_workers,
)
from promptcache.render.front import (
    SALT_VOLUME,
    front_env,
    salt_secret,
    salt_volume,
    signs_predictions,
)
from promptcache.render.names import Component, Names, metadata, selector_labels
from promptcache.render.overlay import apply_pod_template
from promptcache.render.picker import picker_target
from promptcache.render.quantities import mebibytes
from promptcache.render.security import container_security_context, pod_security_context

GRPC_PORT: Final[int] = EPP_EXT_PROC_PORT
"""What the gateway dials through the Service: the EPP's port, or the gateway policy step's."""
GRPC_HEALTH_PORT: Final[int] = 9003
METRICS_PORT: Final[int] = 9090
CONFIG_DIR: Final[str] = "/config"
CONFIG_KEY: Final[str] = "config.yaml"
POOL_GROUP: Final[str] = "inference.networking.k8s.io"
_READ: Final[list[str]] = ["get", "list", "watch"]
GATEWAY_POLICY_CONTAINER: Final[str] = Container.GATEWAY_POLICY.value
"""The policy step's container (it was the session shim)."""
POLICY_COMMAND: Final[str] = Command.GATEWAY_POLICY.value
"""`promptcache gateway-policy`."""
EPP_CONTAINER: Final[str] = Container.EPP.value
TERMINATION_GRACE_SECONDS: Final[int] = 130
GATEWAY_POLICY_DRAIN_SECONDS: Final[int] = TERMINATION_GRACE_SECONDS - 10
"""Open ext_proc streams (one per in-flight request) may finish before the pod is killed."""


CONFIG_HASH_ANNOTATION: Final[str] = f"{OPERATOR_ANNOTATION_PREFIX}epp-config-sha256"


def config_hash(pcd: PromptCacheDeployment) -> str:
    """SHA-256 of the ConfigMap's config text, the picker's whole configuration file."""
    return hashlib.sha256(endpoint_picker_config_text(pcd).encode()).hexdigest()


def epp_image(pcd: PromptCacheDeployment) -> str:
    """`gateway.eppImage`, else the pinned release of the chosen picker."""
    return pcd.spec.gateway.epp_image or picker_target(pcd).image


def uses_gateway_policy(pcd: PromptCacheDeployment) -> bool:
    """Whether the gateway's policy step fronts the picker: whenever isolation derives salts
    (the tenant's salt must be in the body the picker hashes, and a client's own must not)
    or the body names sessions (`prompt_cache_key`, `user`; the picker reads headers only).
    Never in front of promptcache's own picker, which derives the salt itself (its
    tenant-salt parser). See docs/endpoint-picker.md, 'The gateway's policy step'."""
    if not picker_target(pcd).policy_step:
        return False
    return pcd.spec.isolation.mode != "Shared" or pcd.spec.session_affinity.enabled


def salts_in_picker(pcd: PromptCacheDeployment) -> bool:
    """Whether the picker container itself reads the salt key (promptcache's picker, with
    the front on: to derive salts, and to sign its predictions in any mode): it then
    mounts the front's salt Secret."""
    return Feature.PREDICTED_MATCH in picker_target(pcd).features and signs_predictions(pcd)


uses_policy_step = uses_gateway_policy


def epp_args(pcd: PromptCacheDeployment, names: Names) -> list[str]:
    """The flags the EPP runs with; docs/endpoint-picker.md says why each is there."""
    gateway = pcd.spec.gateway
    args = [
        "--pool-name", names.pool,
        "--pool-namespace", names.namespace,
        "--pool-group", POOL_GROUP,
        "--config-file", f"{CONFIG_DIR}/{CONFIG_KEY}",
        # Behind the gateway policy step the EPP takes another port; the shim dials it on localhost.
        "--grpc-port", str(EPP_LOCAL_GRPC_PORT if uses_gateway_policy(pcd) else GRPC_PORT),
        "--grpc-health-port", str(GRPC_HEALTH_PORT),
        "--metrics-port", str(METRICS_PORT),
        # Scrapers need no TokenReview rights; the operator then needs no ClusterRoles per pool.
        "--metrics-endpoint-auth=false",
        "--tracing=false",
    ]  # fmt: skip
    if uses_gateway_policy(pcd):
        # The policy step dials the picker in plain gRPC over the pod's loopback (the two
        # containers share it); without this flag the picker would serve TLS there and no
        # request would route. Alone on the Service's port the picker keeps its TLS default.
        args.append("--secure-serving=false")
    # GIE v1.5.0 has no such flag (an unknown flag stops it); it has no Alpha plugins either.
    if Feature.EXPERIMENTAL_FLAG in picker_target(pcd).features and needs_experimental_plugins(
        endpoint_picker_config(pcd)
    ):
        args.append("--allow-experimental-plugins")
    if Feature.BODY_BOUNDS in picker_target(pcd).features:
        # Without the step the picker is the first process to read a body: it bounds it
        # with the front's own limits (picker/boundary), so it refuses with 413 / 408
        # exactly what the front would, before holding more of it.
        front = pcd.spec.front
        args += [
            PickerFlag.MAX_BODY_BYTES.value, str(front.max_request_bytes),
            PickerFlag.BODY_TIMEOUT_SECONDS.value, format_float(front.body_timeout_seconds),
        ]  # fmt: skip
    if gateway.replicas > 1:
        args.append("--ha-enable-leader-election")
    return args + list(gateway.extra_flags)


def _probe(service: str, period: int) -> dict[str, Any]:
    return {"grpc": {"port": GRPC_HEALTH_PORT, "service": service}, "periodSeconds": period}


def gateway_policy_image(pcd: PromptCacheDeployment) -> str:
    """The resolved resource's `gateway.gatewayPolicyImage` (empty, the operator's default
    filled it)."""
    return filled(pcd.spec.gateway.gateway_policy_image, "spec.gateway.gatewayPolicyImage")


_ISOLATION_ENV: Final[frozenset[str]] = frozenset(
    s.env for s in GATEWAY_POLICY_SETTINGS if s.field in ISOLATION_FIELDS
)


GATEWAY_POLICY_RUNTIME_BYTES: Final[int] = 128 * 1024**2
"""Memory one step process needs besides the bodies it holds: the interpreter, gRPC and its
decide workers' interpreters (bench/gateway_hop.py and bench/hostile_load.py measure it)."""
GATEWAY_POLICY_TMP_VOLUME: Final[str] = "gateway-policy-tmp"
"""Where several workers' counters are summed (prometheus_client's multiprocess files)."""


def _within_share(n: int, percent: int) -> int:
    """The smallest budget whose `percent` share holds `n` bytes."""
    return -(-n * 100 // percent)


def _policy_body_limits(pcd: PromptCacheDeployment) -> tuple[int, int]:
    """(per request, all requests): the front's own limit, so the step refuses with 413
    only what the front would. All requests together hold at least the default budget and
    enough that one client's share holds the working memory of deciding one maximal body
    (`GATEWAY_POLICY_BUDGET_PER_MAX_BODY` times its bytes: bytes, parse, re-encoding);
    each worker's equal part at least what puts one maximal body's bytes within a client's
    share. So a stalled maximal body holds at most `tenantSharePercent` / 4 of one worker's
    budget (an eighth by default), and no single client more than its share of it."""
    front = pcd.spec.front
    per_request, percent = front.max_request_bytes, front.tenant_share_percent
    return per_request, max(
        DEFAULT_GATEWAY_POLICY_MAX_BUFFERED_BYTES,
        _within_share(GATEWAY_POLICY_BUDGET_PER_MAX_BODY * per_request, percent),
        step_workers(pcd) * _within_share(per_request, percent),
    )


def gateway_policy_container(pcd: PromptCacheDeployment, names: Names) -> dict[str, Any]:
    """The gateway's policy step: tenant salt, sessions from the body, Required refusals.

    It owns the `grpc` port the Service targets and relays to the picker on the pod's
    loopback in plain gRPC. It mounts the front's salt Secret and gets the front's isolation
    settings, so it derives the very salt the front derives. Its memory limit covers the
    bodies it may hold (parsed and copied once) plus each worker process's runtime; its CPU
    and its workers follow `gateway.sizing` (`epp_sizing`)."""
    session = pcd.spec.session_affinity
    per_request, budget = _policy_body_limits(pcd)
    workers = step_workers(pcd)
    # only a picker with a session plugin is told the session (GIE's has none)
    names_sessions = session.enabled and Feature.SESSION_AFFINITY in picker_target(pcd).features
    env = {
        GatewayPolicyEnv.LISTEN: DEFAULT_GATEWAY_POLICY_LISTEN,
        GatewayPolicyEnv.UPSTREAM: DEFAULT_GATEWAY_POLICY_UPSTREAM,
        GatewayPolicyEnv.SESSION_HEADER: session.header if names_sessions else "",
        GatewayPolicyEnv.USER_FIELD: SESSION_USER_FIELD if session.use_user_field else "",
        GatewayPolicyEnv.MAX_BODY_BYTES: str(per_request),
        GatewayPolicyEnv.MAX_BUFFERED_BYTES: str(budget),
        GatewayPolicyEnv.DRAIN_SECONDS: str(GATEWAY_POLICY_DRAIN_SECONDS),
        # the front's own body timeout: a body too slow for the front is refused here first
        GatewayPolicyEnv.BODY_TIMEOUT_SECONDS: format_float(pcd.spec.front.body_timeout_seconds),
        GatewayPolicyEnv.METRICS_LISTEN: DEFAULT_GATEWAY_POLICY_METRICS_LISTEN,
        GatewayPolicyEnv.WORKERS: str(workers),
        # The front's own isolation variables, with the very values the front gets.
        **{k: v for k, v in front_env(pcd, names).items() if k in _ISOLATION_ENV},
    }
    mounts: list[dict[str, Any]] = []
    if salt_secret(pcd, names) is not None:
        mounts.append({"name": SALT_VOLUME, "mountPath": SALT_KEY_MOUNT_DIR, "readOnly": True})
    if workers > 1:
        mounts.append({"name": GATEWAY_POLICY_TMP_VOLUME, "mountPath": "/tmp"})
    tcp = {"tcpSocket": {"port": "grpc"}}
    container: dict[str, Any] = {
        "name": GATEWAY_POLICY_CONTAINER,
        "image": gateway_policy_image(pcd),
        "imagePullPolicy": "IfNotPresent",
        "args": [POLICY_COMMAND],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "ports": [
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {
                "name": "policy-metrics",
                "containerPort": GATEWAY_POLICY_METRICS_PORT,
                "protocol": "TCP",
            },
        ],
        "livenessProbe": {**tcp, "initialDelaySeconds": 5, "periodSeconds": 10},
        "readinessProbe": {**tcp, "periodSeconds": 2},
        "resources": {
            "requests": {
                "cpu": f"{step_millicores(pcd)}m",
                "memory": mebibytes(workers * GATEWAY_POLICY_RUNTIME_BYTES),
            },
            # the budget charges bodies, their parse and re-encoding; the rest is runtime
            "limits": {"memory": mebibytes(2 * budget + workers * GATEWAY_POLICY_RUNTIME_BYTES)},
        },
        "securityContext": container_security_context(),
    }
    if mounts:
        container["volumeMounts"] = mounts
    return container


def _picker_resources(pcd: PromptCacheDeployment) -> dict[str, Any]:
    """CPU from `gateway.sizing`. Memory: behind the step the prefix index's, not the rate's
    (the step holds the bodies); promptcache's picker reads bodies itself, so its limit also
    holds the bodies it may (`epp_sizing.promptcache_picker_memory`)."""
    cpu = f"{picker_millicores(pcd)}m"
    if Feature.BODY_BOUNDS in picker_target(pcd).features:
        request, limit = promptcache_picker_memory(pcd)
        return {"requests": {"cpu": cpu, "memory": mebibytes(request)},
                "limits": {"memory": mebibytes(limit)}}  # fmt: skip
    return {"requests": {"cpu": cpu, "memory": "512Mi"}, "limits": {"memory": "2Gi"}}


def epp_deployment(pcd: PromptCacheDeployment, names: Names) -> dict[str, Any]:
    replicas = pcd.spec.gateway.replicas
    shim = uses_gateway_policy(pcd)
    # With leader election only the leader serves; probes then name the role they check.
    liveness, readiness = (
        ("liveness", "readiness") if replicas > 1 else ("inference-extension",) * 2
    )
    # Behind the shim the EPP's ext_proc port is the shim's upstream, not a named pod port.
    grpc_port = [] if shim else [{"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"}]
    container = {
        "name": EPP_CONTAINER,
        "image": epp_image(pcd),
        "imagePullPolicy": "IfNotPresent",
        "args": epp_args(pcd, names),
        "env": [
            {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            *(
                # the Go collector works harder near the limit instead of being killed at it,
                # and, bounded by it, collects less often far below it
                [
                    {
                        "name": GO_MEMORY_LIMIT_ENV,
                        "value": go_memory_limit(promptcache_picker_memory(pcd)[1]),
                    },
                    {"name": GO_GC_PERCENT_ENV, "value": str(GO_GC_PERCENT)},
                ]
                if Feature.BODY_BOUNDS in picker_target(pcd).features
                else []
            ),
        ],
        "ports": [
            *grpc_port,
            {"name": "grpc-health", "containerPort": GRPC_HEALTH_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "livenessProbe": {**_probe(liveness, 10), "initialDelaySeconds": 5},
        "readinessProbe": _probe(readiness, 2),
        "resources": _picker_resources(pcd),
        "securityContext": container_security_context(),
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            *(
                [{"name": SALT_VOLUME, "mountPath": SALT_KEY_MOUNT_DIR, "readOnly": True}]
                if salts_in_picker(pcd)
                else []
            ),
        ],
    }
    volumes: list[dict[str, Any]] = [{"name": "config", "configMap": {"name": names.epp}}]
    salt = salt_volume(pcd, names) if shim or salts_in_picker(pcd) else None
    if salt is not None:
        volumes.append(salt)
    if shim and step_workers(pcd) > 1:
        tmp = {"medium": "Memory", "sizeLimit": "16Mi"}
        volumes.append({"name": GATEWAY_POLICY_TMP_VOLUME, "emptyDir": tmp})
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(names, names.epp, Component.ENDPOINT_PICKER),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector_labels(names, Component.ENDPOINT_PICKER)},
            "template": apply_pod_template(
                {
                    "metadata": {
                        "labels": {
                            **selector_labels(names, Component.ENDPOINT_PICKER),
                            "app.kubernetes.io/part-of": "promptcache",
                        },
                        # The picker reads its config only at start: a changed config
                        # (weights, tiers, target) changes this hash, and so rolls it out.
                        "annotations": {CONFIG_HASH_ANNOTATION: config_hash(pcd)},
                    },
                    "spec": {
                        "serviceAccountName": names.epp,
                        "securityContext": pod_security_context(),
                        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
                        "containers": [
                            container,
                            *([gateway_policy_container(pcd, names)] if shim else []),
                        ],
                        "volumes": volumes,
                    },
                },
                pcd.spec.gateway.pod_template,
                EPP_CONTAINER,
            ),
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


def epp_network_policy(pcd: PromptCacheDeployment, names: Names) -> dict[str, Any] | None:
    """Ingress to the picker pod on its served ports only, when the policy step fronts it,
    or when promptcache's picker (which reads the salt key and derives salts) serves alone.

    Behind the step the picker serves ext_proc in plain gRPC on `EPP_LOCAL_GRPC_PORT`, for the
    step on the pod's loopback; neither picker can bind it to loopback only (GIE v1.5.0 and
    llm-d-router v0.10.0 have no bind-address flag), so without this any pod could dial it
    directly, with a forged `cache_salt`, past the tenant rules. Traffic over the pod's own
    loopback and from its node (kubelet probes) is not subject to NetworkPolicy."""
    if not pcd.spec.gateway.network_policy:
        return None
    if uses_gateway_policy(pcd):
        ports: tuple[int, ...] = (
            GRPC_PORT,
            GRPC_HEALTH_PORT,
            METRICS_PORT,
            GATEWAY_POLICY_METRICS_PORT,
        )
    elif not picker_target(pcd).policy_step:
        # no step: the picker's own served ports, the first being the one the gateway dials
        ports = (GRPC_PORT, GRPC_HEALTH_PORT, METRICS_PORT)
    else:
        return None
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(names, names.epp, Component.ENDPOINT_PICKER),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(names, Component.ENDPOINT_PICKER)},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"protocol": "TCP", "port": p} for p in ports]}],
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

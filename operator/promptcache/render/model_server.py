"""The model servers: the vLLM Deployment (with the cache front), its Service and PDB."""

from __future__ import annotations

import json
from typing import Any, Final

from promptcache.api import PromptCacheDeployment, ResolvedDeployment
from promptcache.contract import (
    FRONT_LIFECYCLE_PORT,
    MODEL_CACHE_MOUNT_PATH,
    POD_TERMINATION_GRACE_SECONDS,
    SERVING_PORT,
    VLLM_LOCAL_PORT,
    Container,
    VllmFlag,
)
from promptcache.render.front import front_container, salt_volume
from promptcache.render.names import Component, Names, metadata, selector_labels
from promptcache.render.overlay import apply_pod_template
from promptcache.render.security import container_security_context, pod_security_context

VLLM_CONTAINER: Final[str] = Container.VLLM.value
MODEL_CACHE_DIR = MODEL_CACHE_MOUNT_PATH
GPU_RESOURCE = "nvidia.com/gpu"
GPU_RESOURCES: dict[str, str] = {"nvidia": GPU_RESOURCE, "amd": "amd.com/gpu"}
"""The device plugins' extended resource per `resources.gpuVendor`; each vendor's GPU nodes
are conventionally tainted with the same key (`<resource>:NoSchedule`)."""
GPU_PRODUCT_LABELS: dict[str, str] = {
    "nvidia": "nvidia.com/gpu.product",  # NVIDIA GPU Feature Discovery / GPU Operator
    "amd": "amd.com/gpu.product-name",  # ROCm node labeller / AMD GPU Operator
}
STARTUP_BUDGET_SECONDS = 30 * 60
"""Weight loading of a large model can take many minutes; the startup probe waits this long."""


def vllm_args(pcd: PromptCacheDeployment) -> list[str]:
    """`vllm serve MODEL --flags`: prefix caching on and sized, token details for usage headers.

    `engine.extraArgs` come last; the API refuses any of them that would override a flag
    written here (`contract.OWNED_ENGINE_FLAGS`)."""
    spec = pcd.spec
    behind_front = spec.front.enabled
    args = [
        spec.model.name,
        VllmFlag.SERVED_MODEL_NAME,
        spec.model.effective_served_name,
        VllmFlag.HOST,
        "127.0.0.1" if behind_front else "0.0.0.0",  # noqa: S104 - the pod's serving port
        VllmFlag.PORT,
        str(VLLM_LOCAL_PORT if behind_front else SERVING_PORT),
        VllmFlag.ENABLE_PREFIX_CACHING,
        VllmFlag.ENABLE_PROMPT_TOKENS_DETAILS,
        VllmFlag.API_SERVER_COUNT,
        str(spec.engine.api_server_count),
        VllmFlag.BLOCK_SIZE,
        str(spec.engine.block_size),
        VllmFlag.GPU_MEMORY_UTILIZATION,
        f"{spec.engine.gpu_memory_utilization:g}",
    ]
    if spec.engine.max_model_len is not None:
        args += [VllmFlag.MAX_MODEL_LEN, str(spec.engine.max_model_len)]
    if spec.engine.max_num_seqs is not None:
        args += [VllmFlag.MAX_NUM_SEQS, str(spec.engine.max_num_seqs)]
    if spec.prompt_embeds.enabled:
        args.append(VllmFlag.ENABLE_PROMPT_EMBEDS)
    if spec.model.resources.gpus > 1:
        args += [VllmFlag.TENSOR_PARALLEL_SIZE, str(spec.model.resources.gpus)]
    return args + lora_args(pcd) + list(spec.engine.extra_args)


def lora_args(pcd: PromptCacheDeployment) -> list[str]:
    """`--enable-lora`, the adapters and the limits; nothing without adapters.

    vLLM 0.33's `--lora-modules` takes several words after one flag (a second flag would
    replace the first list) and reads an item as JSON unless it is `name=path` without a
    comma; the JSON form always, so a path with `=` or `,` is read as written, and
    `base_model_name` makes `/v1/models` name the served model as each adapter's parent."""
    spec = pcd.spec
    limits = spec.lora_limits
    if limits is None:
        return []
    base = spec.model.effective_served_name
    modules = [
        json.dumps(
            {"name": a.name, "path": a.source, "base_model_name": base}, separators=(",", ":")
        )
        for a in spec.model.adapters
    ]
    return [
        VllmFlag.ENABLE_LORA,
        VllmFlag.LORA_MODULES,
        *modules,
        VllmFlag.MAX_LORAS,
        str(limits.max_loras),
        VllmFlag.MAX_LORA_RANK,
        str(limits.max_lora_rank),
        VllmFlag.MAX_CPU_LORAS,
        str(limits.max_cpu_loras),
    ]


def _vllm_health_probe(pcd: PromptCacheDeployment, **timing: int) -> dict[str, Any]:
    """Behind the front, vLLM listens on 127.0.0.1, out of the kubelet's reach: probe inside,
    with bash's own TCP redirection rather than an interpreter. A probe's cost is paid
    again every period, and on a CPU-starved node it is its wall time that the timeout
    counts: `python3 -c "import urllib.request; ..."` needs ~60 ms of CPU (the interpreter
    and urllib's imports), which took 2-8 s at a load of 20 on two cores, so four
    timeouts in a row restarted an engine that answered /health in milliseconds; bash
    needs ~2 ms. Every vLLM image is a Linux distribution's Python with bash."""
    if pcd.spec.front.enabled:
        handler: dict[str, Any] = {"exec": {"command": vllm_health_check(VLLM_LOCAL_PORT)}}
    else:
        handler = {"httpGet": {"path": "/health", "port": "http"}}
    return {**handler, "timeoutSeconds": 5, **timing}


def vllm_health_check(port: int) -> list[str]:
    """`GET /health` on 127.0.0.1:`port`, succeeding on a 200 status line only: an HTTP/1.0
    request (the server closes after answering, so nothing waits on keep-alive) whose
    first line bash reads, giving up after 4 s as the python check did."""
    script = (
        f"exec 3<>/dev/tcp/127.0.0.1/{port} && "
        "printf 'GET /health HTTP/1.0\\r\\n\\r\\n' >&3 && "
        'read -r -t 4 _ status _ <&3 && [ "$status" = 200 ]'
    )
    return ["bash", "-c", script]


def _vllm_env(pcd: PromptCacheDeployment) -> list[dict[str, Any]]:
    model = pcd.spec.model
    env: list[dict[str, Any]] = [
        {"name": "HF_HOME", "value": MODEL_CACHE_DIR},
        {"name": "HOME", "value": "/tmp"},  # non-root has no home; /tmp is an emptyDir
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
    ]
    if model.hf_token_secret_ref is not None:
        ref = model.hf_token_secret_ref
        env.append(
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
        )
    env += [{"name": e.name, "value": e.value} for e in pcd.spec.engine.env]
    return env


def gpu_resource(pcd: PromptCacheDeployment) -> str:
    return GPU_RESOURCES[pcd.spec.model.resources.vendor]


def node_selector(pcd: PromptCacheDeployment) -> dict[str, str]:
    """model.nodeSelector, plus the vendor's product label when resources.gpuProduct is set
    (model.nodeSelector wins on the same key)."""
    res = pcd.spec.model.resources
    product = {GPU_PRODUCT_LABELS[res.vendor]: res.gpu_product} if res.gpu_product else {}
    return {**product, **pcd.spec.model.node_selector}


def _tolerations(pcd: PromptCacheDeployment) -> list[dict[str, Any]]:
    """The user's, plus the vendor's GPU taint when the pod asks for GPUs."""
    model = pcd.spec.model
    out = [t.model_dump(by_alias=True, exclude_none=True) for t in model.tolerations]
    gpu = {"key": gpu_resource(pcd), "operator": "Exists", "effect": "NoSchedule"}
    if model.resources.gpus > 0 and gpu not in out:
        out.append(gpu)
    return out


def _vllm_resources(pcd: PromptCacheDeployment) -> dict[str, Any]:
    res = pcd.spec.model.resources
    requests: dict[str, Any] = dict(res.requests)
    limits: dict[str, Any] = dict(res.limits)
    if res.gpus > 0:
        requests[gpu_resource(pcd)] = res.gpus
        limits[gpu_resource(pcd)] = res.gpus
    return {"requests": requests, "limits": limits}


def _vllm_container(pcd: ResolvedDeployment) -> dict[str, Any]:
    spec = pcd.spec
    container: dict[str, Any] = {
        "name": VLLM_CONTAINER,
        "image": spec.model.image,
        "imagePullPolicy": spec.model.image_pull_policy,
        "args": vllm_args(pcd),
        "env": _vllm_env(pcd),
        "resources": _vllm_resources(pcd),
        "startupProbe": _vllm_health_probe(
            pcd, periodSeconds=10, failureThreshold=STARTUP_BUDGET_SECONDS // 10
        ),
        "livenessProbe": _vllm_health_probe(pcd, periodSeconds=15, failureThreshold=4),
        # vLLM writes no termination message: the tail of its log is what says why it
        # stopped (an adapter it could not load, for status.adapters). The kubelet keeps it
        # in the pod's status, which the operator already reads: no log access needed.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # Read-only root: vLLM writes only under HOME=/tmp (its, torch's and triton's
        # caches), HF_HOME (the model cache) and /dev/shm, all volumes.
        "securityContext": container_security_context(run_as_user=pcd.operator.model_server_user),
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "model-cache", "mountPath": MODEL_CACHE_DIR},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    if not spec.front.enabled:
        container["ports"] = [{"name": "http", "containerPort": SERVING_PORT, "protocol": "TCP"}]
        container["readinessProbe"] = _vllm_health_probe(pcd, periodSeconds=5, failureThreshold=2)
    else:
        container["lifecycle"] = {"preStop": {"exec": {"command": _WAIT_FOR_FRONT}}}
    return container


_WAIT_FOR_FRONT: Final[list[str]] = [
    "python3",
    "-c",
    "import socket, time\n"
    "while True:\n"
    "    try:\n"
    f"        socket.create_connection(('127.0.0.1', {FRONT_LIFECYCLE_PORT}), 2).close()\n"
    "    except OSError:\n"
    "        break\n"
    "    time.sleep(0.5)\n",
]
"""vLLM's preStop: wait until the front has exited (its lifecycle socket refuses), so vLLM
gets SIGTERM (which aborts whatever it still runs) only after the front has answered every
request it took: the front is vLLM's only client. Bounded by the pod's grace period; if the
image has no python3 the hook fails and the kubelet stops vLLM at once, as before."""


def _volumes(pcd: PromptCacheDeployment, names: Names) -> list[dict[str, Any]]:
    cache = pcd.spec.model.model_cache
    model_cache: dict[str, Any] = (
        {"persistentVolumeClaim": {"claimName": cache.claim_name}}
        if cache.claim_name
        else {"emptyDir": {"sizeLimit": cache.size_limit} if cache.size_limit is not None else {}}
    )
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "model-cache", **model_cache},
        {"name": "tmp", "emptyDir": {}},
    ]
    salt = salt_volume(pcd, names) if pcd.spec.front.enabled else None
    if salt is not None:
        volumes.append(salt)
    return volumes


def _strategy(replicas: int) -> dict[str, Any]:
    """With several replicas replace one at a time without a surge pod: GPUs are rarely spare."""
    if replicas > 1:
        return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


def pod_template_labels(names: Names) -> dict[str, str]:
    """Pod labels carry no version, so upgrading the operator never restarts model servers."""
    return {
        **selector_labels(names, Component.MODEL_SERVER),
        "app.kubernetes.io/part-of": "promptcache",
        "llm-d.ai/engine-type": "vllm",
    }


def model_server_deployment(pcd: ResolvedDeployment, names: Names) -> dict[str, Any]:
    spec = pcd.spec
    containers = [_vllm_container(pcd)]
    if spec.front.enabled:
        containers.insert(0, front_container(pcd, names))
    pod_spec: dict[str, Any] = {
        "securityContext": pod_security_context(fs_group=pcd.operator.model_server_user),
        "terminationGracePeriodSeconds": POD_TERMINATION_GRACE_SECONDS,
        "containers": containers,
        "volumes": _volumes(pcd, names),
    }
    if node_selector(pcd):
        pod_spec["nodeSelector"] = node_selector(pcd)
    if _tolerations(pcd):
        pod_spec["tolerations"] = _tolerations(pcd)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(names, names.model_server, Component.MODEL_SERVER),
        "spec": {
            "replicas": spec.model.replicas,
            "selector": {"matchLabels": selector_labels(names, Component.MODEL_SERVER)},
            "strategy": _strategy(spec.model.replicas),
            "template": apply_pod_template(
                {"metadata": {"labels": pod_template_labels(names)}, "spec": pod_spec},
                spec.model.pod_template,
                VLLM_CONTAINER,
            ),
        },
    }


def model_server_service(names: Names) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(names, names.model_server, Component.MODEL_SERVER),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(names, Component.MODEL_SERVER),
            "ports": [
                {"name": "http", "port": SERVING_PORT, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }


def model_server_pdb(names: Names) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(names, names.model_server, Component.MODEL_SERVER),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(names, Component.MODEL_SERVER)},
        },
    }

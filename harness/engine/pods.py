"""Test resources for the real engine, and their rendered pods run as processes."""

from __future__ import annotations

import random
import secrets
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from harness.epp.rendered import deep_merge
from harness.pod import ProcessPod
from promptcache.api import PromptCacheDeployment
from promptcache.contract import SERVING_PORT, VLLM_LOCAL_PORT, Container, FrontEnv
from promptcache.render import render

SERVED_NAME = "tiny"
FrontFor = Callable[..., str]
"""The `front_for` fixture: a front of the given isolation mode before the session's engine,
by its URL."""
ENGINE_ARGS = ["--enforce-eager", "--dtype=float32"]
"""Chosen by the test resource, not translated: eager mode skips minutes of CPU kernel
compilation at start, float32 is faster than bfloat16 on CPUs without AVX512-BF16."""
BLOCK_SIZE = 32
"""A block size the CPU build accepts (it needs multiples of 32), so the rendered
`--block-size` is what the engine runs."""


def engine_resource(model: Path, name: str = "tiny", **spec: Any) -> dict[str, Any]:
    """A PromptCacheDeployment for the local tiny model; `spec` keys override (deep merge)."""
    base: dict[str, Any] = {
        "model": {
            "name": str(model),
            "servedModelName": SERVED_NAME,
            "replicas": 1,
            "resources": {"gpus": 0},
        },
        "engine": {"blockSize": BLOCK_SIZE, "extraArgs": list(ENGINE_ARGS)},
        "promptEmbeds": {"enabled": True},
        "isolation": {"mode": "PerKey"},
    }
    deep_merge(base, spec)
    return {
        "apiVersion": "serving.promptcache.io/v1alpha1",
        "kind": "PromptCacheDeployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": base,
    }


def rendered_pod_spec(resource: Mapping[str, Any]) -> dict[str, Any]:
    """The model-server Deployment's pod spec, as `render` writes it."""
    pcd = PromptCacheDeployment.model_validate(resource)
    deployment = next(
        m
        for m in render(pcd)
        if m["kind"] == "Deployment"
        and Container.VLLM in {c["name"] for c in m["spec"]["template"]["spec"]["containers"]}
    )
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def free_pod_ip() -> str:
    """A loopback address whose serving and engine ports are both free: the pod's IP."""
    rng = random.SystemRandom()
    for _ in range(200):
        ip = f"127.{rng.randint(20, 90)}.{rng.randint(1, 250)}.{rng.randint(2, 250)}"
        try:
            for port in (SERVING_PORT, VLLM_LOCAL_PORT):
                with socket.socket() as s:
                    s.bind((ip, port))
        except OSError:
            continue
        return ip
    raise RuntimeError("no free loopback pod address")


class SaltSecrets:
    """The resource's salt Secret, as the operator would create it (one random key)."""

    def __init__(self) -> None:
        self.key = secrets.token_hex(32).encode()

    def __call__(self, name: str, key: str) -> bytes:
        return self.key


def process_pod(
    resource: Mapping[str, Any],
    workdir: Path,
    *,
    secrets_: SaltSecrets | None = None,
    kv_cache_bytes: int | None = None,
) -> ProcessPod:
    """The rendered model-server pod of `resource`, ready to `start()`."""
    name = str(resource["metadata"]["name"])
    return ProcessPod(
        name,
        rendered_pod_spec(resource),
        free_pod_ip(),
        workdir,
        secrets_ or SaltSecrets(),
        kv_cache_bytes=kv_cache_bytes,
    )


def front_only_pod(
    resource: Mapping[str, Any], engine_url: str, workdir: Path, secrets_: SaltSecrets
) -> ProcessPod:
    """Only the cache-front container of `resource`'s pod, in front of another pod's engine:
    several isolation modes on one engine, without a 4 GB engine each."""
    spec = rendered_pod_spec(resource)
    spec["containers"] = [c for c in spec["containers"] if c["name"] != Container.VLLM]
    for container in spec["containers"]:
        for item in container.get("env", []):
            if item["name"] == FrontEnv.UPSTREAM:
                item["value"] = engine_url
    return ProcessPod(str(resource["metadata"]["name"]), spec, free_pod_ip(), workdir, secrets_)

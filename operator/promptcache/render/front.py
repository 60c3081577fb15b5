"""The cache-front container: the per-request half of prompt caching, in each model-server pod.

It owns the serving port the InferencePool targets; vLLM moves behind it to
127.0.0.1 so no client can bypass the isolation policy.
"""

from __future__ import annotations

from typing import Any, Final

from promptcache.api import PromptCacheDeployment, ceiling_of, filled
from promptcache.contract import (
    FRONT_HEALTH_PATH,
    FRONT_LAME_DUCK_SECONDS,
    FRONT_LIFECYCLE_PORT,
    FRONT_READY_PATH,
    SALT_KEY_FILE,
    SALT_KEY_MOUNT_DIR,
    SALT_KEY_SECRET_KEY,
    SERVING_PORT,
    SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR,
    Command,
    Container,
    FrontEnv,
    format_bool,
    format_cache_gib,
    format_float,
    profile_of,
)
from promptcache.contract import PickerFeature as Feature
from promptcache.contract.front import (
    DEFAULT_LISTEN,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_IN_FLIGHT_BYTES,
    DEFAULT_UPSTREAM,
    budget_for,
)
from promptcache.render.names import Names
from promptcache.render.quantities import mebibytes
from promptcache.render.security import container_security_context

FRONT_CONTAINER: Final[str] = Container.CACHE_FRONT.value
FRONT_LIFECYCLE_LISTEN = f"127.0.0.1:{FRONT_LIFECYCLE_PORT}"
"""Loopback only: no client, picker or Gateway can reach it; the vllm container (same
network namespace) can."""
SALT_VOLUME = "salt-key"
_BUDGET_PER_REQUEST_BYTE = 5
"""A maximal request is charged about 5x its size at its peak (body, parse, forwarded copy)."""
_BASE_MEMORY_BYTES = 640 * 1024**2
"""One front process before any request, measured: the interpreter, aiohttp and torch
(loaded at the first prompt-embeds payload) 550 MiB RSS, its JSON worker processes
(`--decode-workers`, 34 MiB each) and multiprocessing's resource tracker (13 MiB)."""
CPU_MILLICORES_PER_PROCESS = 500
"""The front's CPU request per process when `front.resources` names none. One process
spent 0.3-0.8 ms of CPU per answer next to a real vLLM (`bench/front_overhead.py --engine
real`, docs/cache-front.md), so half a core carries about 600-1600 answers a second before
it needs more than its request; there is one process per vLLM API server, so the request
grows with them. No CPU limit: a CFS quota would stall the front's bursts for whole
periods, and each stall is latency every client of the pod waits for."""


def in_flight_bytes(pcd: PromptCacheDeployment) -> int:
    """The front's memory budget: as set, or at least 1 GiB and four maximal requests, with
    one maximal request within one client's share (`contract.front.budget_for`), so no
    single request, and no single client, can hold all of it."""
    front = pcd.spec.front
    if front.memory_budget_bytes is not None:
        return front.memory_budget_bytes
    one = _BUDGET_PER_REQUEST_BYTE * front.max_request_bytes
    return budget_for(DEFAULT_MAX_IN_FLIGHT_BYTES, one, front.tenant_share_percent)


def max_concurrency(pcd: PromptCacheDeployment) -> int:
    """The front's concurrency cap: as set, else vLLM's max_num_seqs (never below vLLM's)."""
    spec = pcd.spec
    if spec.front.max_concurrency is not None:
        return spec.front.max_concurrency
    return spec.engine.max_num_seqs or DEFAULT_MAX_IN_FLIGHT


def signs_predictions(pcd: PromptCacheDeployment) -> bool:
    """Whether promptcache's picker signs its predictions for the fronts (issue 39): its
    own picker with the front on. In mode Shared this alone is why the pods get the salt
    Secret: the picker signs with it, the front checks with it, nothing is salted."""
    picker = profile_of(filled(pcd.spec.gateway.picker, "spec.gateway.picker"))
    return pcd.spec.front.enabled and Feature.PREDICTED_MATCH in picker.features


def salt_secret(pcd: PromptCacheDeployment, names: Names) -> tuple[str, str] | None:
    """(Secret name, key) the front reads its HMAC key from, or None when it needs none (no
    salts are derived and no prediction is signed)."""
    isolation = pcd.spec.isolation
    if not (pcd.spec.needs_salt_key or signs_predictions(pcd)):
        return None
    if isolation.salt_secret_ref is not None:
        return isolation.salt_secret_ref.name, isolation.salt_secret_ref.key
    return names.salt_secret, SALT_KEY_SECRET_KEY


def _env(pcd: PromptCacheDeployment, has_salt: bool) -> list[dict[str, str]]:
    spec = pcd.spec
    iso, usage, session = spec.isolation, spec.front.usage_headers, spec.session_affinity
    cache_gib = spec.prompt_embeds.effective_cache_gib
    values: list[tuple[str, str]] = [
        (FrontEnv.LISTEN, DEFAULT_LISTEN),
        (FrontEnv.UPSTREAM, DEFAULT_UPSTREAM),
        (FrontEnv.LIFECYCLE_LISTEN, FRONT_LIFECYCLE_LISTEN),
        (FrontEnv.LAME_DUCK_SECONDS, format_float(FRONT_LAME_DUCK_SECONDS)),
        (FrontEnv.WORKERS, str(spec.engine.api_server_count)),
        (SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR, format_cache_gib(cache_gib)),
        (FrontEnv.ISOLATION_MODE, iso.mode.value),
        (FrontEnv.ISOLATION_HEADER, iso.header),
        (FrontEnv.ISOLATION_FIELD, iso.body_field),
        (FrontEnv.HONOR_MAX_LEN, format_bool(spec.honors_prompt_cache_max_len)),
        (FrontEnv.MAX_BODY_BYTES, str(spec.front.max_request_bytes)),
        (FrontEnv.MAX_IN_FLIGHT_BYTES, str(in_flight_bytes(pcd))),
        (FrontEnv.MAX_IN_FLIGHT, str(max_concurrency(pcd))),
        (FrontEnv.MAX_BODY_READS, str(spec.front.max_concurrent_body_reads)),
        (FrontEnv.HEADER_TIMEOUT_SECONDS, format_float(spec.front.header_timeout_seconds)),
        (FrontEnv.BODY_TIMEOUT_SECONDS, format_float(spec.front.body_timeout_seconds)),
        (FrontEnv.WRITE_TIMEOUT_SECONDS, format_float(spec.front.write_timeout_seconds)),
        (FrontEnv.SEND_BUFFER_BYTES, str(spec.front.send_buffer_bytes)),
        (FrontEnv.MAX_PROMPT_EMBEDS_REFERENCES, str(spec.front.max_prompt_embeds_references)),
        (FrontEnv.ALLOW_CLIENT_PRIORITY, format_bool(spec.front.allow_client_priority)),
        (FrontEnv.ALLOW_ENGINE_STATE, format_bool(spec.front.allow_engine_state)),
        (FrontEnv.FAIR_SHARE_BYTES_PER_SECOND, str(spec.front.fair_share_bytes_per_second)),
        (FrontEnv.TENANT_SHARE_PERCENT, str(spec.front.tenant_share_percent)),
        (FrontEnv.PROMPT_TOKENS_HEADER, usage.prompt_tokens_header if usage.enabled else ""),
        (
            FrontEnv.CACHED_PROMPT_TOKENS_HEADER,
            usage.cached_prompt_tokens_header if usage.enabled else "",
        ),
        (FrontEnv.SESSION_HEADER, session.header if session.enabled else ""),
        (
            FrontEnv.SESSION_FROM_USER,
            format_bool(session.enabled and session.use_user_field),
        ),
    ]
    if iso.identity.enabled:  # only then: a deployment without accounts renders as before
        values += [
            (FrontEnv.IDENTITY_HEADER, iso.identity.header),
            (FrontEnv.IDENTITY_BEARER, format_bool(iso.identity.bearer_token)),
            (FrontEnv.IDENTITY_REQUIRED, format_bool(iso.identity.required)),
        ]
    if has_salt:
        values.append((FrontEnv.SALT_KEY_FILE, SALT_KEY_FILE))
    return [{"name": name, "value": value} for name, value in values]


def front_env(pcd: PromptCacheDeployment, names: Names) -> dict[str, str]:
    """The cache front's environment by name (the gateway's policy step shares some)."""
    has_salt = salt_secret(pcd, names) is not None
    return {e["name"]: e["value"] for e in _env(pcd, has_salt)}


def _resources(pcd: PromptCacheDeployment) -> dict[str, Any]:
    front = pcd.spec.front.resources
    processes = pcd.spec.engine.api_server_count
    requests: dict[str, Any] = dict(front.requests)
    if "cpu" not in requests:
        requests = {"cpu": f"{CPU_MILLICORES_PER_PROCESS * processes}m", **requests}
    limits: dict[str, Any] = dict(front.limits)
    if "memory" not in limits:
        per_process = in_flight_bytes(pcd) + _BASE_MEMORY_BYTES
        limits["memory"] = mebibytes(ceiling_of(pcd).per_pod_bytes + processes * per_process)
    return {"requests": requests, "limits": limits}


def front_image(pcd: PromptCacheDeployment) -> str:
    """The resolved resource's `front.image` (empty, the operator's default filled it)."""
    return filled(pcd.spec.front.image, "spec.front.image")


def front_container(pcd: PromptCacheDeployment, names: Names) -> dict[str, Any]:
    has_salt = salt_secret(pcd, names) is not None
    container: dict[str, Any] = {
        "name": FRONT_CONTAINER,
        "image": front_image(pcd),
        "imagePullPolicy": "IfNotPresent",
        "args": [Command.FRONT.value],
        "ports": [{"name": "http", "containerPort": SERVING_PORT, "protocol": "TCP"}],
        "env": _env(pcd, has_salt),
        "resources": _resources(pcd),
        "livenessProbe": {
            "httpGet": {"path": FRONT_HEALTH_PATH, "port": "http"},
            "periodSeconds": 10,
            "timeoutSeconds": 3,
            "failureThreshold": 3,
        },
        "readinessProbe": {
            "httpGet": {"path": FRONT_READY_PATH, "port": "http"},
            "periodSeconds": 5,
            "timeoutSeconds": 3,
            "failureThreshold": 2,
        },
        "securityContext": container_security_context(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    if has_salt:
        container["volumeMounts"].append(
            {"name": SALT_VOLUME, "mountPath": SALT_KEY_MOUNT_DIR, "readOnly": True}
        )
    return container


def salt_volume(pcd: PromptCacheDeployment, names: Names) -> dict[str, Any] | None:
    secret = salt_secret(pcd, names)
    if secret is None:
        return None
    secret_name, key = secret
    return {
        "name": SALT_VOLUME,
        "secret": {
            "secretName": secret_name,
            "items": [{"key": key, "path": SALT_KEY_SECRET_KEY}],
            # World-readable inside the containers that mount it (the front, the policy
            # step; no other container does): a Secret volume's files belong to root and
            # the pod's fsGroup, and the EPP pod has no fsGroup (nor the model-server pod
            # with `--model-server-user=none`), so 0440 left the image's user 65532 unable
            # to read its key (tests/images found it).
            "defaultMode": 0o444,
        },
    }

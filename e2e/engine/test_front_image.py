"""The cache front *from its image*, as its model-server pod runs it, before the real engine.

The other engine tests run the front from the checkout; this one runs the rendered
`cache-front` container from `localhost/promptcache-front:<version>` (scripts/images) with
the pod's user and fsGroup, a read-only root, every capability dropped, its /tmp emptyDir
and its salt Secret (`harness.images`), so a dependency missing from the `front` extra, a
file the image lacks or a write the read-only root refuses fails here. Only what one host
cannot share changes: its two ports (host network, free ports) and its upstream (the
session engine's address inside its pod, in place of the pod-local 127.0.0.1:8001).
The check is the engine's own: a tenant's repeat hits, another tenant's identical prompt
misses, and the front's usage headers carry the engine's counts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from harness.engine.client import CACHED_HEADER, PROMPT_HEADER, chat_body, post
from harness.engine.pods import SaltSecrets, engine_resource, rendered_pod_spec
from harness.front_process import wait_ready
from harness.images import PodRun, built_image, pod_container
from harness.net import free_port
from promptcache.contract import SALT_KEY_MOUNT_DIR, FrontEnv
from promptcache.render.front import FRONT_CONTAINER

pytestmark = pytest.mark.images

READY_TIMEOUT_S = 240  # torch's first import on a busy 2-core machine, no bytecode cache


async def test_front_image_isolates_tenants_on_the_real_engine(
    engine_model: Path,
    engine_url: str,
    salt_secrets: SaltSecrets,
    http: aiohttp.ClientSession,
    fresh_prompt: Callable[[], str],
    tmp_path: Path,
) -> None:
    spec = rendered_pod_spec(engine_resource(engine_model, name="image-front"))
    pod, front = pod_container(
        [{"kind": "Deployment", "spec": {"template": {"spec": spec}}}], FRONT_CONTAINER
    )
    (salt_mount,) = [m for m in front["volumeMounts"] if m["mountPath"] == SALT_KEY_MOUNT_DIR]
    (secret,) = [v["secret"] for v in pod["volumes"] if v["name"] == salt_mount["name"]]
    port, lifecycle = free_port(), free_port()
    run = PodRun(
        built_image("front").ref,
        pod,
        front,
        tmp_path,
        files={salt_mount["name"]: {i["path"]: salt_secrets.key for i in secret["items"]}},
        env={
            FrontEnv.LISTEN: f"127.0.0.1:{port}",
            FrontEnv.LIFECYCLE_LISTEN: f"127.0.0.1:{lifecycle}",
            FrontEnv.UPSTREAM: engine_url,
        },
        network="host",
    )
    log = tmp_path / "cache-front.log"
    proc = run.start(log)
    try:
        url = f"http://127.0.0.1:{port}"
        await wait_ready(url, proc, log, within_s=READY_TIMEOUT_S)
        prompt = fresh_prompt()
        first = await post(http, url, "/v1/chat/completions", chat_body(prompt), key="tenant-a")
        again = await post(http, url, "/v1/chat/completions", chat_body(prompt), key="tenant-a")
        other = await post(http, url, "/v1/chat/completions", chat_body(prompt), key="tenant-b")
        for answer in (first, again, other):
            assert answer.status == 200, answer.raw[:500]
        assert first.cached == 0
        assert again.cached > 0, "the tenant's repeat must hit its own cache"
        assert other.cached == 0, "another tenant's identical prompt must miss"
        assert again.headers[CACHED_HEADER] == str(again.cached)
        assert again.headers[PROMPT_HEADER] == str(again.usage["prompt_tokens"])
    finally:
        run.remove()
        proc.wait(timeout=60)

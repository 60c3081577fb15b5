"""The operator and a rendered pod that really runs: status from a real engine's metrics.

On the local control plane, the operator reconciles a resource whose model-server pod
kwok schedules and gives an IP; the harness runs that pod's containers (the cache front
and `vllm serve`, exactly as the API server holds them) and writes the readiness its
probes decide. What must hold:

* the pod is not Ready while the engine starts, and the resource says so;
* once the engine is healthy, the pod and the resource are Ready;
* the resource's status reads the engine's own `vllm:cache_config_info` (block size 64,
  the rendered `--block-size`, and the engine's real block count) and its prefix-cache
  counters (the hit ratio rises with real traffic);
* when the engine dies the pod leaves Ready and the resource says why; after the restart
  it is Ready again.

The pod's cache front runs from the front image (`scripts/images`), as the rendered
`cache-front` container says (its user and fsGroup, read-only root, no capability, its
/tmp emptyDir and salt Secret, its env and probes), on the pod's IP before the real engine:
the one model-server pod of the suite whose front is the image a user pulls rather than
the checkout (issue 40).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.engine.client import chat_body, long_text
from harness.engine.cluster_pods import PROCESS_POD_TEMPLATE, run_on_cluster
from harness.engine.pods import engine_resource
from harness.images import built_image
from harness.operator import condition, namespaced_operator, wait_for
from harness.pod import ProcessPod
from harness.pytest_cluster import Cluster
from harness.vllm.server import START_TIMEOUT_S

pytestmark = [pytest.mark.cluster, pytest.mark.images]
NAME = "real"
BLOCK = 64


@pytest.fixture(scope="module")
def env(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with namespaced_operator(cluster, "engine", tmp_path_factory.mktemp("engine-op")) as env:
        yield env


def _status(cluster: Cluster, ns: str) -> dict[str, Any]:
    return dict(cluster.pcd_json(ns, NAME).get("status") or {})


def _pod_ready(cluster: Cluster, ns: str, pod: str) -> str | None:
    obj = cluster.get_json("pod", pod, "-n", ns)
    found = condition(obj, "Ready")
    return None if found is None else str(found["status"])


def _model_pod(cluster: Cluster, ns: str) -> dict[str, Any] | None:
    pods = cluster.get_json("pods", "-n", ns)["items"]
    for pod in pods:
        if pod["status"].get("podIP") and "vllm" in {c["name"] for c in pod["spec"]["containers"]}:
            return dict(pod)
    return None


def _send(pod: ProcessPod, prompt: str, key: str) -> int:
    import json  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    request = urllib.request.Request(
        pod.url() + "/v1/chat/completions",
        data=json.dumps(chat_body(prompt)).encode(),
        headers={"content-type": "application/json", "x-prompt-cache-isolation-key": key},
    )
    with urllib.request.urlopen(request, timeout=300) as resp:
        return int(json.loads(resp.read())["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_status_and_readiness_come_from_the_real_engine(
    cluster: Cluster, env: dict[str, Any], engine_model: Path, tmp_path: Path
) -> None:
    ns, op = env["ns"], env["op"]
    resource = engine_resource(
        engine_model,
        name=NAME,
        engine={"blockSize": BLOCK},
    )
    resource["metadata"]["namespace"] = ns
    resource["spec"]["model"]["podTemplate"] = PROCESS_POD_TEMPLATE
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(resource))
    found = wait_for(
        lambda: _model_pod(cluster, ns), f"a model-server pod in {ns}\n{op.log_tail()}", timeout=120
    )
    name = found["metadata"]["name"]
    assert _pod_ready(cluster, ns, name) == "False", "kwok must leave the pod's readiness to us"

    pod = run_on_cluster(
        cluster, ns, name, tmp_path / "pod", images={"cache-front": built_image("front").ref}
    )
    try:
        # Still loading: neither the pod nor the resource is Ready.
        time.sleep(3)
        if not pod.ready:
            assert _pod_ready(cluster, ns, name) == "False"
            ready = condition(cluster.pcd_json(ns, NAME), "Ready")
            assert ready is None or ready["status"] != "True"
        pod.wait_ready(timeout_s=START_TIMEOUT_S)
        wait_for(
            lambda: _status(cluster, ns).get("readyReplicas") == 1,
            f"readyReplicas 1\n{op.log_tail()}",
            timeout=120,
        )
        wait_for(
            lambda: (_status(cluster, ns).get("prefixCache") or {}).get("blockSize") == BLOCK,
            f"status.prefixCache.blockSize {BLOCK} from the engine\n{op.log_tail()}",
            timeout=120,
        )
        cache = _status(cluster, ns)["prefixCache"]
        engine_metrics = pod.container("vllm")
        assert engine_metrics.running()
        assert cache["effectiveBlockSizeTokens"] == BLOCK
        assert cache["numGpuBlocks"] > 0

        prompt = long_text(4242)
        assert _send(pod, prompt, "t") == 0
        assert _send(pod, prompt, "t") > 0
        assert _send(pod, prompt, "t") > 0
        wait_for(
            lambda: ((_status(cluster, ns).get("prefixCache") or {}).get("hitRatio") or 0) > 0,
            f"a hit ratio above 0 from the engine's counters\n{op.log_tail()}",
            timeout=120,
        )

        # The engine dies: the pod leaves Ready, the resource says why, the kubelet restarts it.
        pod.container("vllm").signal(signal.SIGKILL)
        pod.wait_until(False, timeout_s=60)
        wait_for(
            lambda: _status(cluster, ns).get("readyReplicas", 0) == 0,
            f"readyReplicas 0 after the engine died\n{op.log_tail()}",
            timeout=120,
        )
        ready = condition(cluster.pcd_json(ns, NAME), "Ready")
        assert ready is not None
        assert ready["status"] == "False"
        assert name in ready["message"], ready
        pod.wait_until(True, timeout_s=START_TIMEOUT_S)
        wait_for(
            lambda: _status(cluster, ns).get("readyReplicas") == 1,
            f"readyReplicas 1 after the restart\n{op.log_tail()}",
            timeout=120,
        )
    finally:
        pod.stop()

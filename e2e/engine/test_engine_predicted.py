"""Predicted against delivered on a real engine (issue 39): a rendered model-server pod
(cache front + real `vllm serve`) behind promptcache's real picker, in isolation mode
Shared (which salts nothing; the pod and the picker get the salt key only to sign and check
the prediction).

A chat workload that fits: turns that share a long system prompt, each through the picker
(ext_proc), then exactly what Envoy would send to the picked pod. The picker signs its
prefix match for the pod; the front counts it beside the engine's own `cached_tokens`; the
counters are the sums of what each answer said, and once the prefix is known both the
predicted and the delivered share are well above zero. Each turn's own text is longer than
two of the picker's blocks, so each adds at least one whole block to its prefix index, and
the next turn waits until it has (`index_grows`) instead of pausing. Printed: the two ratios.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.engine.cluster_pods import start_pool_pods
from harness.engine.pods import engine_resource
from harness.epp.binary import find_epp_binary, missing_reason
from harness.epp.extproc import chat_body
from harness.epp.pool import PoolOnCluster
from harness.epp.rendered import Rendered, render_resource
from harness.epp.scenarios import index_grows, unique_text
from harness.extproc_gateway import envoy_applies
from harness.pod import ProcessPod
from harness.pytest_cluster import Cluster
from promptcache.contract import PREDICTED_MATCH_HEADER, PickerTarget
from promptcache.tenancy.prediction import Prediction

pytestmark = pytest.mark.cluster

KV_CACHE_BYTES = 8 << 20
"""8 MiB: 256 blocks of 32 for the tiny model, far more than this workload needs."""
TURNS = 6
TURN_BYTES = 300
"""Each turn's own text: more than two blocks of the picker's 32 tokens at 4 bytes a token,
so at least one whole block of every turn is new to the index, wherever the block
boundaries fall."""


@pytest.fixture(scope="module")
def real_pool(
    cluster: Cluster, engine_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[PoolOnCluster, list[ProcessPod]]]:
    if find_epp_binary(PickerTarget.PROMPTCACHE) is None:
        pytest.fail(missing_reason(PickerTarget.PROMPTCACHE))
    workdir = tmp_path_factory.mktemp("predicted-real")
    resource = engine_resource(
        engine_model,
        name="predicted",
        gateway={"picker": "promptcache"},
        engine={"maxModelLen": 4096},
        prefixCache={"autoTune": True},
        isolation={"mode": "Shared"},
    )
    resource["metadata"]["namespace"] = cluster.create_namespace("predicted-real")
    pool = PoolOnCluster(cluster, Rendered(render_resource(resource)), workdir / "pool")
    try:
        pool.apply()
        pods = start_pool_pods(pool, workdir, KV_CACHE_BYTES)
        try:
            yield pool, pods
        finally:
            for p in pods:
                p.stop()
    finally:
        pool.close()


def _serve(pod: ProcessPod, body: bytes, headers: list[tuple[str, str]]) -> dict[str, Any]:
    skip = {"host", "content-length", "transfer-encoding"}
    req = urllib.request.Request(
        f"{pod.url()}/v1/chat/completions",
        data=body,
        headers={k: v for k, v in headers if not k.startswith(":") and k not in skip},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        usage: dict[str, Any] = json.loads(resp.read())["usage"]
        return usage


def _counters(pod: ProcessPod) -> dict[str, float]:
    with urllib.request.urlopen(f"{pod.url()}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    pattern = r'^(promptcache_front_\w+_total)\{scope="shared"\} (\S+)$'
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.MULTILINE)}


def test_the_front_counts_the_pickers_prediction_beside_the_engines_cached_tokens(
    real_pool: tuple[PoolOnCluster, list[ProcessPod]],
) -> None:
    pool, pods = real_pool
    (pod,) = pods
    pool.start_epp(wait_scraped=False)
    assert pool.epp is not None
    pool.epp.wait_scraped({pod.name: 0.0})
    system = unique_text(1600)
    prompt = predicted = delivered = 0
    with pool.client() as client:
        for turn in range(TURNS):
            with index_grows(pool.epp):  # the next turn must see this one's blocks
                pick = client.pick(
                    chat_body(system + f" turn {turn} " + unique_text(TURN_BYTES), model="tiny")
                )
            headers = envoy_applies(pick.sent_headers, pick.responses)
            (value,) = [v for k, v in headers if k.lower() == PREDICTED_MATCH_HEADER]
            match, total, block = (int(x) for x in value.split(".")[3:6])
            usage = _serve(pod, pick.body, headers)
            prompt += usage["prompt_tokens"]
            predicted += Prediction(match, total, block).tokens(usage["prompt_tokens"])
            delivered += usage["prompt_tokens_details"]["cached_tokens"] or 0
    got = _counters(pod)
    assert got["promptcache_front_accounted_prompt_tokens_total"] == prompt
    assert got["promptcache_front_predicted_tokens_total"] == predicted
    assert got["promptcache_front_delivered_tokens_total"] == delivered
    print(f"real engine: predicted {predicted / prompt:.2f}, delivered {delivered / prompt:.2f}")
    assert predicted / prompt > 0.3, "the picker predicted nothing of a shared system prompt"
    assert delivered / prompt > 0.3, "the engine served nothing of it from cache"

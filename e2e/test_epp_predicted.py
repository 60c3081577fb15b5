"""Predicted against delivered, through promptcache's real picker to real cache fronts.

A pool with isolation by key is rendered and applied to the local control plane; the
fronts run on the pod IPs in front of the stand-in engine (whose prefix cache reports
`cached_tokens` as vLLM's does); the picker runs with its rendered config, which names the
predicted-match plugin. Each request goes through the picker (ext_proc), then exactly what
Envoy would send reaches the picked pod's front. The front counts the picker's signed
prediction beside the engine's cached tokens, by scope class; a client that sends the
header straight to a pod is counted forged and skews nothing (issue 39).
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.epp.binary import find_epp_binary, missing_reason
from harness.epp.extproc import chat_body
from harness.epp.launch import Launcher, routing_patch
from harness.epp.pool import PodHandle, PoolOnCluster
from harness.epp.scenarios import index_grows, prefixed, unique_text
from harness.extproc_gateway import envoy_applies
from promptcache.contract import (
    DEFAULT_ISOLATION_HEADER,
    PREDICTED_MATCH_HEADER,
    PREDICTED_MATCH_PLUGIN,
    PickerTarget,
)
from promptcache.tenancy.prediction import Prediction, prediction_key, sign

pytestmark = [pytest.mark.epp, pytest.mark.cluster]

OURS = PickerTarget.PROMPTCACHE
KEY = DEFAULT_ISOLATION_HEADER


@pytest.fixture(params=["PerKey", "Shared"])
def pool(
    cluster: Any, namespace: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[PoolOnCluster]:
    """A pool isolated by key, and one in mode Shared (which salts nothing, but gets the
    salt key so that the picker signs and the fronts check)."""
    if find_epp_binary(OURS) is None:
        pytest.fail(missing_reason(OURS))
    launcher = Launcher(cluster, namespace, tmp_path, OURS)
    try:
        patch = routing_patch(replicas=2, with_front=True)
        patch["isolation"] = {"mode": request.param}
        pool = launcher(spec_patch=patch)
        types = [p["type"] for p in pool.rendered.epp_config["plugins"]]
        assert PREDICTED_MATCH_PLUGIN in types
        yield pool
    finally:
        launcher.close()


def _post(handle: PodHandle, body: bytes, headers: list[tuple[str, str]]) -> dict[str, Any]:
    """POST exactly what the gateway would send the pod (headers after Envoy's mutation)."""
    assert handle.front is not None
    skip = {"host", "content-length", "transfer-encoding"}
    sent = {k: v for k, v in headers if not k.startswith(":") and k.lower() not in skip}
    req = urllib.request.Request(
        f"http://{handle.ip}:{handle.front.port}/v1/chat/completions",
        data=body,
        headers={"content-type": "application/json", **sent},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200
        answer: dict[str, Any] = json.loads(resp.read())
        return answer


def _counters(handle: PodHandle) -> dict[str, float]:
    assert handle.front is not None
    url = f"http://{handle.ip}:{handle.front.port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as resp:
        text = resp.read().decode()
    names = (
        "accounted_prompt_tokens|predicted_tokens|delivered_tokens|predictions"
        "|estimated_prompt_tokens|workload_tokens|capacity_tokens"
    )
    pattern = rf"^(promptcache_front_(?:{names})_total\S*) (\S+)$"
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.MULTILINE)}


def test_the_pod_counts_what_the_picker_predicted_beside_what_the_engine_delivered(
    pool: PoolOnCluster,
) -> None:
    salt = pool.rendered.tenant_salt_plugin
    assert salt is not None
    scope = "shared" if salt["parameters"]["isolationMode"] == "Shared" else "keyed"
    system = unique_text(3000)  # a long shared prefix, then a unique tail per turn
    turns = []
    ladder: list[tuple[int, int]] = []
    with pool.client() as gateway:
        for _ in range(4):
            with index_grows(pool.epp):
                pick = gateway.pick(chat_body(prefixed(system, 200)), headers={KEY: "a"})
            handle = pool.by_endpoint(pick.endpoint)
            assert handle is not None
            pod_headers = envoy_applies(pick.sent_headers, pick.responses)
            values = [v for k, v in pod_headers if k.lower() == PREDICTED_MATCH_HEADER]
            assert len(values) == 1, "the picker signs one prediction for the chosen pod"
            # match, total, block size, then the workload and capacity estimates (blocks)
            match, total, block, seen, held = (int(x) for x in values[0].split(".")[3:-1])
            usage = _post(handle, pick.body, pod_headers)["usage"]
            turns.append((handle, match, total, block, usage))
            ladder.append((seen, held))
    first, *later = turns
    assert first[1] == 0, "nothing was predicted for a prompt never seen"
    assert ladder[0] == (0, 0), "nor would a perfect cache have held it"
    # later turns: the shared prefix was seen in the pool and fits its KV cache, and the
    # picker's match for the chosen pod is all of it (the ladder is flat here); the
    # estimates track every 4th block (`strideBlocks`), so they find it to within 3 blocks
    for (seen, held), t in zip(ladder[1:], later, strict=True):
        assert t[1] - 4 < seen == held <= t[1], (seen, held, t[1])
    for handle, match, total, _, usage in later:
        assert handle is first[0]
        assert 0 < match <= total
        assert usage["prompt_tokens_details"]["cached_tokens"] > 0
    handle = first[0]
    got = _counters(handle)

    def counted(name: str) -> float:
        return got[f'promptcache_front_{name}_total{{scope="{scope}"}}']

    prompt = sum(t[4]["prompt_tokens"] for t in turns)
    predicted = sum(Prediction(m, t, b).tokens(u["prompt_tokens"]) for _, m, t, b, u in turns)
    delivered = sum(t[4]["prompt_tokens_details"]["cached_tokens"] for t in turns)
    assert got['promptcache_front_predictions_total{outcome="valid"}'] == 4
    assert counted("accounted_prompt_tokens") == prompt
    assert counted("predicted_tokens") == predicted
    assert counted("delivered_tokens") == delivered
    assert predicted > 0
    assert delivered > 0
    workload = sum(
        Prediction(t[2], t[2], t[3], s, s).workload_tokens(t[4]["prompt_tokens"])
        for (s, _), t in zip(ladder, turns, strict=True)
    )
    assert counted("estimated_prompt_tokens") == prompt
    assert counted("workload_tokens") == workload
    assert counted("capacity_tokens") == workload


def test_a_prediction_sent_straight_to_a_pod_is_ignored(pool: PoolOnCluster) -> None:
    """A client reaching a pod directly cannot sign; its header is counted forged, skews
    no figure, and never reaches the engine."""
    handle = pool.pods[0]
    forged = sign(prediction_key(b"guessed-key-0123456789abcdef"), Prediction(9, 9, 16), now=0)
    body = json.dumps(chat_body(unique_text(600))).encode()
    _post(handle, body, [(KEY, "a"), (PREDICTED_MATCH_HEADER, forged)])
    got = _counters(handle)
    assert got['promptcache_front_predictions_total{outcome="forged"}'] == 1
    assert not any(k.startswith("promptcache_front_accounted") and v for k, v in got.items())
    served = handle.server.standin.requests[-1]
    assert PREDICTED_MATCH_HEADER not in {h.lower() for h in served.headers}

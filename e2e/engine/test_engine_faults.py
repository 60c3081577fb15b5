"""The engine dies under load, or stalls, and comes back: what clients and the pod see.

A pod of its own (this test kills its engine): while whole answers and streams are in
flight, `kill -9` takes the whole engine (API server, engine core, worker) down at once.

* every whole answer ends promptly in the front's JSON error, never a hang;
* every stream ends with an error event in the same shape and no `[DONE]`, never a hang
  or a silent truncation;
* the front's readiness follows within one probe period, the pod leaves Ready, and the
  front holds nothing for the dead requests (in-flight gauge back to 0);
* the kubelet restarts the engine; once it is healthy the pod is Ready again, and the
  prompt-embeds payload the front held is still served by reference (the front's cache
  outlives an engine restart; the engine's KV cache does not, so the first hit is a miss);
* an engine that stops answering (SIGSTOP) makes the pod unready until it answers again.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.engine.client import chat_body, long_text, post
from harness.engine.pods import SERVED_NAME, SaltSecrets, engine_resource, process_pod
from harness.pod import ProcessPod
from harness.vllm.server import START_TIMEOUT_S

torch = pytest.importorskip("torch")

from promptcache.embeds import compute_prompt_embeds_id  # noqa: E402
from promptcache.embeds.wire import encode_payload  # noqa: E402

READY_PATH = "/readyz"


@pytest.fixture(scope="module")
def fault_pod(engine_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessPod]:
    resource = engine_resource(engine_model, name="faults")
    pod = process_pod(resource, tmp_path_factory.mktemp("fault-pod"), secrets_=SaltSecrets())
    with pod:
        yield pod


def _long_answer(seed: int, stream: bool) -> dict[str, Any]:
    body = chat_body(long_text(seed, 60), max_tokens=4000, ignore_eos=True)
    if stream:
        body["stream"] = True
    return body


async def _stream_outcome(
    http: aiohttp.ClientSession, url: str, seed: int, started: asyncio.Event
) -> dict[str, Any]:
    """How one stream ended: its last event, whether [DONE] came, and the HTTP status;
    `started` is set at its first event."""
    last: Any = None
    done = False
    events = 0
    async with http.post(
        url + "/v1/chat/completions",
        json=_long_answer(seed, True),
        headers={"x-prompt-cache-isolation-key": "f"},
    ) as resp:
        status = resp.status
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            events += 1
            started.set()
            last = json.loads(line[6:])
    return {"status": status, "last": last, "done": done, "events": events}


async def _readyz(http: aiohttp.ClientSession, url: str) -> int:
    try:
        async with http.get(url + READY_PATH, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            return resp.status
    except (aiohttp.ClientError, TimeoutError):
        return 0


async def _in_flight(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.endswith("_in_flight_requests") and not s.name.startswith("vllm")
    )


async def test_kill_9_under_load_then_restart(
    fault_pod: ProcessPod, http: aiohttp.ClientSession
) -> None:
    url = fault_pod.url()
    embeds = torch.randn(48, 128, generator=torch.Generator().manual_seed(7)) * 0.05
    reference = compute_prompt_embeds_id(embeds)
    upload = {
        "model": SERVED_NAME,
        "prompt_embeds": encode_payload(embeds),
        "max_tokens": 6,
        "temperature": 0,
    }
    before = await post(http, url, "/v1/completions", upload, key="f")
    assert before.status == 200, before.raw[:300]

    wholes = [
        asyncio.ensure_future(
            post(http, url, "/v1/chat/completions", _long_answer(i, False), key="f")
        )
        for i in range(3)
    ]
    started = [asyncio.Event() for _ in range(3)]
    streams = [
        asyncio.ensure_future(_stream_outcome(http, url, 100 + i, started[i])) for i in range(3)
    ]
    # in flight: every stream has started sending (on a busy machine that takes a while)
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), timeout=120)
    assert not any(t.done() for t in wholes + streams), "the answers ended before the kill"
    engine = fault_pod.container("vllm")
    killed_at = time.monotonic()
    engine.signal(signal.SIGKILL)

    results = await asyncio.wait_for(asyncio.gather(*wholes), timeout=30)
    for answer in results:
        assert answer.status in (502, 503), answer.raw[:300]
        assert answer.error_code in ("upstream_failed", "upstream_unavailable"), answer.body
    outcomes = await asyncio.wait_for(asyncio.gather(*streams), timeout=30)
    for outcome in outcomes:
        assert outcome["status"] == 200
        assert outcome["events"] > 1, "the stream had started"
        assert not outcome["done"], "a broken stream must not look complete"
        assert outcome["last"]["error"]["code"] == "upstream_failed", outcome["last"]
    assert time.monotonic() - killed_at < 30

    # The front's readiness follows at once; the pod leaves Ready within its probe budget.
    assert await _readyz(http, url) == 503
    readiness = next(c for c in fault_pod.containers if c.readiness is not None).readiness
    assert readiness is not None
    budget = readiness.period * readiness.threshold + 2
    fault_pod.wait_until(False, timeout_s=budget)
    assert await _in_flight(http, url) == 0, "the front still holds dead requests"

    # The kubelet restarts the engine; Ready again once it is healthy.
    fault_pod.wait_until(True, timeout_s=START_TIMEOUT_S)
    assert engine.restarts >= 1
    assert await _readyz(http, url) == 200
    by_ref = {**upload, "prompt_embeds": reference}
    after = await post(http, url, "/v1/completions", by_ref, key="f")
    assert after.status == 200, "the front's payload cache outlived the engine"
    assert after.text == before.text
    again = await post(http, url, "/v1/completions", by_ref, key="f")
    assert again.cached > 0


async def test_a_stalled_engine_makes_the_pod_unready(
    fault_pod: ProcessPod, http: aiohttp.ClientSession
) -> None:
    fault_pod.wait_until(True, timeout_s=START_TIMEOUT_S)
    engine = fault_pod.container("vllm")
    engine.signal(signal.SIGSTOP)
    try:
        readiness = next(c for c in fault_pod.containers if c.readiness is not None).readiness
        assert readiness is not None
        fault_pod.wait_until(False, timeout_s=readiness.period * readiness.threshold + 10)
        assert await _readyz(http, fault_pod.url()) != 200
    finally:
        engine.signal(signal.SIGCONT)
    fault_pod.wait_until(True, timeout_s=120)
    answer = await post(http, fault_pod.url(), "/v1/chat/completions", chat_body("back"), key="f")
    assert answer.status == 200, answer.raw[:300]

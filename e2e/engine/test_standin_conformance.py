"""The stand-in engine, held to the real one: same requests, same shapes where it matters.

The stand-in (`harness.standin`) plays vLLM where many engines must run at once
(the 8-pod routing bench, scale and chaos tests). What the product depends on must be
the same as on the real engine, so this test sends the same requests to both and
compares: response and usage shapes, the `object` names, streamed chunks (the usage-only
chunk and `[DONE]`), error statuses and bodies, `/v1/models`, and the names and label
names of the metrics the stand-in reports. A difference here is a stand-in bug: fix the
stand-in, not this test.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.engine.client import chat_body, completion_body, long_text
from harness.engine.pods import BLOCK_SIZE, SERVED_NAME
from harness.standin import EngineConfig, StandinUpstream, start_standin


@pytest.fixture
async def standin_url() -> AsyncIterator[str]:
    config = EngineConfig(model_name=SERVED_NAME, block_size=BLOCK_SIZE, served_only=True)
    runner, url = await start_standin(StandinUpstream(config=config, usage_from_engine=True))
    yield url
    await runner.cleanup()


def _shape(value: Any) -> Any:
    """Keys and value types, recursively (lists by their first element)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    return "number" if isinstance(value, int | float) else type(value).__name__


def _covers(real: Any, standin: Any, path: str = "") -> list[str]:
    """Where the stand-in's shape is not a sub-shape of the real one."""
    if isinstance(standin, dict):
        if not isinstance(real, dict):
            return [f"{path}: real is {real}, stand-in an object"]
        out = []
        for key, sub in standin.items():
            if key not in real:
                out.append(f"{path}.{key}: only the stand-in has it")
            else:
                out += _covers(real[key], sub, f"{path}.{key}")
        return out
    if isinstance(standin, list):
        if not isinstance(real, list):
            return [f"{path}: real is {real}, stand-in a list"]
        return _covers(real[0], standin[0], path + "[]") if real and standin else []
    if real != standin and "NoneType" not in (real, standin):
        return [f"{path}: real {real}, stand-in {standin}"]
    return []


async def _call(http: aiohttp.ClientSession, url: str, path: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with http.post(url + path, data=data, headers={"content-type": "application/json"}) as r:
        raw = await r.text()
    if raw.startswith("data: "):
        return r.status, [
            line[6:] if line == "data: [DONE]" else json.loads(line[6:])
            for line in raw.splitlines()
            if line.startswith("data: ")
        ]
    return r.status, json.loads(raw) if raw else None


def _required(answer: Any, route: str) -> list[str]:
    """What the product reads, present: usage and its cached tokens, the text."""
    events = answer if isinstance(answer, list) else [answer]
    usage = [e["usage"] for e in events if isinstance(e, dict) and e.get("usage")]
    problems = [] if usage else [f"{route}: no usage"]
    for u in usage[-1:]:
        if not isinstance((u.get("prompt_tokens_details") or {}).get("cached_tokens"), int):
            problems.append(f"{route}: no prompt_tokens_details.cached_tokens")
    return problems


REQUESTS = {
    "chat": ("/v1/chat/completions", chat_body),
    "completions": ("/v1/completions", completion_body),
    "chat stream": (
        "/v1/chat/completions",
        lambda p: chat_body(p, stream=True, stream_options={"include_usage": True}),
    ),
    "completions stream": (
        "/v1/completions",
        lambda p: completion_body(p, stream=True, stream_options={"include_usage": True}),
    ),
}


@pytest.mark.parametrize("name", sorted(REQUESTS))
async def test_answers_have_the_engines_shape(
    name: str, http: aiohttp.ClientSession, engine_url: str, standin_url: str
) -> None:
    path, make = REQUESTS[name]
    body = make(long_text(777, 80))
    real_status, real = await _call(http, engine_url, path, body)
    fake_status, fake = await _call(http, standin_url, path, body)
    assert (real_status, fake_status) == (200, 200)
    assert _required(real, name) == []
    assert _required(fake, name) == []
    if isinstance(real, list):
        assert real[-1] == fake[-1] == "[DONE]"
        usage_only = [e for e in real[:-1] if e.get("usage")]
        assert [e["choices"] for e in usage_only] == [[]], "vLLM's usage chunk has no choices"
        assert [e["choices"] for e in fake[:-1] if e.get("usage")] == [[]]
        mismatches = _covers(_shape(real[0]), _shape(fake[0]))
        mismatches += _covers(_shape(usage_only[0]), _shape(fake[-2]))
        assert {e["object"] for e in real[:-1]} == {e["object"] for e in fake[:-1]}
    else:
        mismatches = _covers(_shape(real), _shape(fake))
        assert real["object"] == fake["object"]
    assert mismatches == [], mismatches


ERRORS = {
    "not JSON": ("/v1/chat/completions", b"{not json"),
    "bad cache_salt": ("/v1/completions", completion_body("x", cache_salt="a/b")),
    "unknown model": ("/v1/completions", {**completion_body("x"), "model": "no-such-model"}),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
async def test_errors_have_the_engines_status_and_shape(
    name: str, http: aiohttp.ClientSession, engine_url: str, standin_url: str
) -> None:
    path, body = ERRORS[name]
    real_status, real = await _call(http, engine_url, path, body)
    fake_status, fake = await _call(http, standin_url, path, body)
    assert fake_status == real_status, (real, fake)
    assert _covers(_shape(real), _shape(fake)) == [], (real, fake)


async def test_models_health_and_metrics_match(
    http: aiohttp.ClientSession, engine_url: str, standin_url: str
) -> None:
    for url in (engine_url, standin_url):
        async with http.get(url + "/health") as resp:
            assert resp.status == 200
    models = []
    for url in (engine_url, standin_url):
        async with http.get(url + "/v1/models") as resp:
            models.append(await resp.json())
    assert [m["data"][0]["id"] for m in models] == [SERVED_NAME, SERVED_NAME]
    assert _covers(_shape(models[0]), _shape(models[1])) == []

    texts = []
    for url in (engine_url, standin_url):
        async with http.get(url + "/metrics") as resp:
            texts.append(await resp.text())
    real, fake = (
        {
            s.name: set(s.labels)
            for f in text_string_to_metric_families(t)
            for s in f.samples
            if s.name.startswith("vllm:")
        }
        for t in texts
    )
    assert fake, "the stand-in reports no vllm:* series"
    missing = sorted(set(fake) - set(real))
    assert missing == [], f"series only the stand-in reports: {missing}"
    labels = {n: sorted(fake[n] - real[n]) for n in fake if fake[n] - real[n]}
    assert labels == {}, f"labels only the stand-in writes: {labels}"

"""The front forwards `model` as the client wrote it: a LoRA adapter's name reaches vLLM,
which chooses the adapter by it (the front neither reads nor rewrites the field)."""

from __future__ import annotations

import json

import aiohttp
import pytest

from harness.front_app import MakeFront
from harness.standin import StandinUpstream
from promptcache.contract import IsolationMode

Standin = tuple[StandinUpstream, str]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
    ],
)
@pytest.mark.parametrize("model", ["base-model", "qwen-7b-sql", "org/adapter:v2@x+y"])
async def test_an_adapter_name_reaches_the_engine_unchanged(
    standin: Standin,
    make_front: MakeFront,
    http: aiohttp.ClientSession,
    path: str,
    body: dict[str, object],
    model: str,
) -> None:
    upstream, _ = standin
    front = await make_front(isolation_mode=IsolationMode.PER_KEY)
    data = json.dumps({"model": model, **body}).encode()
    headers = {"Content-Type": "application/json", "x-prompt-cache-isolation-key": "tenant-a"}
    async with http.post(front.url + path, data=data, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
    sent = upstream.requests[-1].json()
    assert sent["model"] == model
    assert "cache_salt" in sent, "the tenant's salt applies to adapters like to the base model"

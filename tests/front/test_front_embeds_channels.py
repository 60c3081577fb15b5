"""Every place vLLM 0.33 reads a prompt-embeds payload from, over real sockets, in every
isolation mode: the front verifies a payload there (a bad one is refused with 400
`invalid_prompt_embeds` and never reaches vLLM), resolves a reference there (an unknown one
is 409 `prompt_embeds_not_cached`), and forwards a good one as vLLM would have received it.

The places are derived from vLLM's request models (`tools/vllm_routes.py`; the derivation is
pinned by `test_front_vllm_fields.py`): top-level `prompt_embeds` (completions and their
render route), `{"type": "prompt_embeds", "data": ...}` content parts and message
`reasoning` / `reasoning_content` in every conversation of `messages` or `input` (chat,
batched chat, chat render, tokenize, embeddings, pooling, classify), and `/invocations`,
which vLLM dispatches to the first request model the body validates as, so a body with a
`messages` member that is not a conversation is still read as a completion.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from harness.embeds_objects import seeded_tensor
from harness.front_app import MakeFront
from harness.standin import StandinUpstream
from promptcache.contract import IsolationMode
from promptcache.front.client import EmbedsPayload

Standin = tuple[StandinUpstream, str]
MODES = [IsolationMode.SHARED, IsolationMode.PER_KEY, IsolationMode.REQUIRED]
KEY = {"x-prompt-cache-isolation-key": "tenant-a"}
BAD = "QUJD"  # base64 of b"ABC": not a torch.save archive
MISSING = "blake3:" + "e" * 64


def part(data: str) -> dict[str, Any]:
    return {"type": "prompt_embeds", "data": data}


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


# (name, route, body for a payload or reference X, where X ends up in what vLLM receives)
Case = tuple[str, str, Callable[[str], dict[str, Any]], Callable[[dict[str, Any]], Any]]
CASES: list[Case] = [
    ("completion", "/v1/completions",
     lambda x: {"model": "m", "prompt_embeds": x}, lambda b: b["prompt_embeds"]),
    ("completion render", "/v1/completions/render",
     lambda x: {"model": "m", "prompt_embeds": [x]}, lambda b: b["prompt_embeds"][0]),
    ("chat content part", "/v1/chat/completions",
     lambda x: {"model": "m", "messages": [user([part(x)])]},
     lambda b: b["messages"][0]["content"][0]["data"]),
    ("chat reasoning", "/v1/chat/completions",
     lambda x: {"model": "m", "messages": [
         user("q"), {"role": "assistant", "content": "a", "reasoning": part(x)}, user("r")]},
     lambda b: b["messages"][1]["reasoning"]["data"]),
    ("chat reasoning_content", "/v1/chat/completions",
     lambda x: {"model": "m", "messages": [
         {"role": "assistant", "content": "a", "reasoning_content": part(x)}, user("r")]},
     lambda b: b["messages"][0]["reasoning_content"]["data"]),
    ("batched chat", "/v1/chat/completions/batch",
     lambda x: {"model": "m", "messages": [[user("plain")], [user([part(x)])]]},
     lambda b: b["messages"][1][0]["content"][0]["data"]),
    ("chat render", "/v1/chat/completions/render",
     lambda x: {"model": "m", "messages": [user([part(x)])]},
     lambda b: b["messages"][0]["content"][0]["data"]),
    ("tokenize chat", "/tokenize",
     lambda x: {"model": "m", "messages": [user([part(x)])]},
     lambda b: b["messages"][0]["content"][0]["data"]),
    ("embeddings input conversation", "/v1/embeddings",
     lambda x: {"model": "m", "input": [user([part(x)])]},
     lambda b: b["input"][0]["content"][0]["data"]),
    ("embeddings batched input", "/v1/embeddings",
     lambda x: {"model": "m", "input": [[user("a")], [user([part(x)])]]},
     lambda b: b["input"][1][0]["content"][0]["data"]),
    ("pooling chat", "/pooling",
     lambda x: {"model": "m", "messages": [user([part(x)])]},
     lambda b: b["messages"][0]["content"][0]["data"]),
    ("classify chat", "/classify",
     lambda x: {"model": "m", "messages": [user([part(x)])]},
     lambda b: b["messages"][0]["content"][0]["data"]),
    ("invocations chat", "/invocations",
     lambda x: {"model": "m", "messages": [user([part(x)])]},
     lambda b: b["messages"][0]["content"][0]["data"]),
    ("invocations completion", "/invocations",
     lambda x: {"model": "m", "prompt_embeds": x}, lambda b: b["prompt_embeds"]),
    ("invocations completion despite messages", "/invocations",
     lambda x: {"model": "m", "messages": "not a conversation", "prompt_embeds": x},
     lambda b: b["prompt_embeds"]),
]  # fmt: skip
IDS = [c[0] for c in CASES]


async def post(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json", **KEY}
    async with http.post(url, data=json.dumps(body).encode(), headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
@pytest.mark.parametrize(("route", "build", "where"), [c[1:] for c in CASES], ids=IDS)
async def test_a_bad_payload_is_refused_wherever_vllm_would_read_it(
    standin: Standin,
    make_front: MakeFront,
    http: aiohttp.ClientSession,
    mode: IsolationMode,
    route: str,
    build: Callable[[str], dict[str, Any]],
    where: Callable[[dict[str, Any]], Any],
) -> None:
    upstream, _ = standin
    front = await make_front(isolation_mode=mode)
    status, answer = await post(http, front.url + route, build(BAD))
    assert (status, answer["error"]["code"]) == (400, "invalid_prompt_embeds"), answer
    status, answer = await post(http, front.url + route, build(MISSING))
    assert (status, answer["error"]["code"]) == (409, "prompt_embeds_not_cached"), answer
    assert upstream.requests == []  # neither reached vLLM


@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
@pytest.mark.parametrize(("route", "build", "where"), [c[1:] for c in CASES], ids=IDS)
async def test_a_verified_payload_is_forwarded_and_then_resolved_there(
    standin: Standin,
    make_front: MakeFront,
    http: aiohttp.ClientSession,
    mode: IsolationMode,
    route: str,
    build: Callable[[str], dict[str, Any]],
    where: Callable[[dict[str, Any]], Any],
) -> None:
    upstream, _ = standin
    front = await make_front(isolation_mode=mode)
    payload = EmbedsPayload.from_object(seeded_tensor(7))
    status, answer = await post(http, front.url + route, build(payload.data))
    assert status == 200, answer
    assert where(upstream.requests[-1].json()) == payload.data
    status, answer = await post(http, front.url + route, build(payload.identifier))
    assert status == 200, answer
    assert where(upstream.requests[-1].json()) == payload.data  # the reference, resolved

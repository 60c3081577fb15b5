"""vLLM request controls a tenant must not set: request ids and scheduling priority.

vLLM 0.33.0 takes a request's id from `X-Request-Id` (else the body's
`request_id`): its engine id, its logs, the answer's `id`, the Responses API's
stores, and what it aborts by. It takes the scheduling priority from
`X-Vllm-Priority` (else the body's `priority`), which moves a request ahead of
others under `--scheduling-policy priority`. The front forwards a fresh id of its
own (and returns it), and forwards priorities only when the deployment allows.
Real sockets: a front in front of the recording stand-in.
"""

from __future__ import annotations

import json
import re

import aiohttp
import pytest

from harness.front_app import MakeFront
from harness.standin import StandinUpstream

Standin = tuple[StandinUpstream, str]
CHAT = "/v1/chat/completions"
HEX32 = re.compile(r"[0-9a-f]{32}")


def _chat(**extra: object) -> bytes:
    return json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    ).encode()


async def _metric(http: aiohttp.ClientSession, url: str, control: str) -> float:
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    prefix = f'promptcache_front_client_controls_removed_total{{control="{control}"}}'
    return next(
        (float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix)), 0.0
    )


async def test_client_request_ids_are_replaced_by_a_fresh_one_the_client_gets_back(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front()
    ids = []
    for _ in range(2):
        async with http.post(
            front.url + CHAT,
            data=_chat(request_id="resp_victim"),
            headers={"Content-Type": "application/json", "X-Request-Id": "victim-id"},
        ) as resp:
            assert resp.status == 200
            returned = resp.headers["X-Request-Id"]
        got = upstream.requests[-1]
        forwarded = [v for k, v in got.headers.items() if k.lower() == "x-request-id"]
        assert forwarded == [returned]
        assert HEX32.fullmatch(returned)
        assert "request_id" not in got.json()
        ids.append(returned)
    assert ids[0] != ids[1]
    assert await _metric(http, front.url, "x-request-id") == 2
    assert await _metric(http, front.url, "request_id") == 2


async def test_read_only_routes_get_a_fresh_request_id_too(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front()
    async with http.get(front.url + "/v1/models", headers={"X-Request-Id": "mine"}) as resp:
        assert resp.status == 200
        returned = resp.headers["X-Request-Id"]
    assert returned != "mine"
    got = upstream.requests[-1].headers
    assert [v for k, v in got.items() if k.lower() == "x-request-id"] == [returned]


@pytest.mark.parametrize("value", [0, "0", False, None, 0.0])
async def test_a_priority_that_changes_nothing_is_removed(
    value: object, standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front()
    async with http.post(
        front.url + CHAT,
        data=_chat(priority=value),
        headers={"Content-Type": "application/json", "X-Vllm-Priority": "-100"},
    ) as resp:
        assert resp.status == 200
    got = upstream.requests[-1]
    assert "priority" not in got.json()
    assert "x-vllm-priority" not in {k.lower() for k in got.headers}
    assert await _metric(http, front.url, "x-vllm-priority") == 1


@pytest.mark.parametrize("value", [-100, 5, "-3", True, "high", [1]])
async def test_a_client_priority_is_refused_by_default(
    value: object, standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front()
    async with http.post(
        front.url + CHAT, data=_chat(priority=value), headers={"Content-Type": "application/json"}
    ) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["code"] == "priority_not_allowed"
    assert error["param"] == "priority"
    assert upstream.requests == []


async def test_allowed_client_priorities_are_forwarded_as_sent(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front(allow_client_priority=True)
    async with http.post(
        front.url + CHAT,
        data=_chat(priority=-7),
        headers={"Content-Type": "application/json", "X-Vllm-Priority": "-100"},
    ) as resp:
        assert resp.status == 200
    got = upstream.requests[-1]
    assert got.json()["priority"] == -7
    assert [v for k, v in got.headers.items() if k.lower() == "x-vllm-priority"] == ["-100"]

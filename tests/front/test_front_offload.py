"""A dense body is decided in a worker process (`front.offload`) exactly as the front decides
a small one on its event loop: same status, same error code, same counted policy, same
body forwarded (over real sockets, with the real worker processes, in every mode)."""

from __future__ import annotations

import json
import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from harness.embeds_objects import seeded_tensor
from harness.executors import CountingExecutor
from harness.front_app import MakeFront
from harness.standin import StandinUpstream
from promptcache.contract import IsolationMode
from promptcache.front.client import EmbedsPayload
from promptcache.runtime.spawn import WORKER_NICENESS
from promptcache.tenancy.canonical import LOOP_TOKENS, json_work

Standin = tuple[StandinUpstream, str]
MODES = [IsolationMode.SHARED, IsolationMode.PER_KEY, IsolationMode.REQUIRED]
KEY = "x-prompt-cache-isolation-key"
CHAT = b'"model":"m","messages":[{"role":"user","content":"hi"}]'
PAYLOAD = EmbedsPayload.from_object(seeded_tensor(11))

# (name, route, body without its outer braces, headers)
CASES: list[tuple[str, str, bytes, dict[str, str]]] = [
    ("plain chat", "/v1/chat/completions", CHAT, {KEY: "tenant-a"}),
    ("keyless", "/v1/chat/completions", CHAT, {}),
    ("forged salt", "/v1/chat/completions", CHAT + b',"cache_salt":"forged"', {KEY: "t"}),
    ("key in the body", "/v1/chat/completions", CHAT + b',"prompt_cache_isolation_key":"b"', {}),
    ("stream, usage added", "/v1/chat/completions", CHAT + b',"stream":"true"', {KEY: "t"}),
    ("user as session", "/v1/chat/completions", CHAT + b',"user":"u1"', {KEY: "t"}),
    ("duplicate member", "/v1/chat/completions", CHAT + b',"user":"a","user":"b"', {KEY: "t"}),
    ("case-variant salt", "/v1/chat/completions", CHAT + b',"CACHE_SALT":"x"', {KEY: "t"}),
    ("lone surrogate", "/v1/chat/completions", CHAT + b',"user":"\\ud800"', {KEY: "t"}),
    ("engine state", "/v1/chat/completions", CHAT + b',"kv_transfer_params":{}', {KEY: "t"}),
    ("bad max len", "/v1/completions", b'"prompt":"x","prompt_cache_max_len":-3', {KEY: "t"}),
    ("bad embeds", "/v1/completions", b'"prompt":"x","prompt_embeds":5', {KEY: "t"}),
    (
        "missing embeds",
        "/v1/completions",
        b'"prompt_embeds":"blake3:' + b"0" * 64 + b'"',
        {KEY: "t"},
    ),
]


def padded(inner: bytes, values: int) -> bytes:
    return b'{"pad":[' + b",".join([b"0"] * values) + b"]," + inner + b"}"


COUNTED = ("isolation", "refusals", "salt_removed", "uploads", "controls_removed", "max_len")


def counts(front: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The front's policy and refusal counters, sample by sample."""
    out = {}
    for family in front.state.metrics.registry.collect():
        for sample in family.samples:
            if any(c in sample.name for c in COUNTED) and sample.name.endswith("_total"):
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


async def answer(
    http: aiohttp.ClientSession, url: str, raw: bytes, headers: dict[str, str]
) -> tuple[int, str | None]:
    headers = {"Content-Type": "application/json", **headers}
    async with http.post(url, data=raw, headers=headers) as resp:
        body = await resp.read()
        code = json.loads(body)["error"]["code"] if resp.status >= 400 else None
        return resp.status, code


@pytest.fixture(scope="module")
def workers() -> Iterator[ProcessPoolExecutor]:
    """One set of real worker processes for the module (spawning costs about a second)."""
    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    yield pool
    pool.shutdown()


@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
@pytest.mark.parametrize(
    ("route", "inner", "headers"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
async def test_a_worker_decides_a_dense_body_as_the_loop_decides_a_small_one(
    standin: Standin,
    make_front: MakeFront,
    http: aiohttp.ClientSession,
    workers: ProcessPoolExecutor,
    mode: IsolationMode,
    route: str,
    inner: bytes,
    headers: dict[str, str],
) -> None:
    upstream, _ = standin
    front = await make_front(isolation_mode=mode)
    front.state.json_processes = workers
    small, dense = padded(inner, 3), padded(inner, LOOP_TOKENS + 10)
    assert not json_work(small).off_loop
    assert json_work(dense).off_loop
    outcomes: list[Any] = []
    for raw in (small, dense):
        before, counted = len(upstream.requests), counts(front)
        status, code = await answer(http, front.url + route, raw, headers)
        after = counts(front)
        delta = {k: v - counted.get(k, 0) for k, v in after.items() if v != counted.get(k, 0)}
        sent = upstream.requests[before:]
        forwarded = None
        if sent:
            body = sent[0].json()
            body.pop("pad")
            salt = body.get("cache_salt")
            if salt is not None and salt.startswith("uncacheable"):
                body["cache_salt"] = "uncacheable"  # random per request, by design
            forwarded = (body, {k: v for k, v in sent[0].headers.items() if k == "X-Session"})
        outcomes.append((status, code, forwarded, delta))
    front.state.json_processes = None  # the module's, not this front's to shut down
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][3], "nothing was counted"


async def test_the_front_starts_its_own_workers_on_the_first_dense_body(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    front = await make_front(isolation_mode=IsolationMode.PER_KEY)
    assert front.state.json_processes is None
    status, _ = await answer(
        http, front.url + "/v1/chat/completions", padded(CHAT, LOOP_TOKENS + 10), {KEY: "t"}
    )
    assert status == 200
    assert front.state.json_processes is not None
    # nicer than the loop: on shared cores the loop and small requests go first
    niceness = front.state.json_processes.submit(os.nice, 0).result(timeout=30)
    assert niceness == min(os.nice(0) + WORKER_NICENESS, 19)


async def test_a_large_answer_has_its_usage_read_in_a_worker(
    make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    """A 1 MiB completion (logprobs, echo: a tenant can ask for one) is parsed for its usage
    in a worker process: in a thread the C parser held the loop's GIL for all of it."""
    usage = {
        "prompt_tokens": 7,
        "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": 3},
    }
    answer = json.dumps({"choices": [{"text": "x" * (1 << 20)}], "usage": usage}).encode()

    async def completions(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=answer, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        front = await make_front(
            upstream=f"http://127.0.0.1:{runner.addresses[0][1]}",
            isolation_mode=IsolationMode.SHARED,
        )
        workers = front.state.json_processes = CountingExecutor()
        body = {"model": "m", "prompt": "hi"}
        async with http.post(front.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200
            assert len(await resp.read()) == len(answer)
            assert resp.headers[front.settings.prompt_tokens_header] == "7"
            assert resp.headers[front.settings.cached_prompt_tokens_header] == "3"
        assert workers.jobs == 1
    finally:
        await runner.cleanup()

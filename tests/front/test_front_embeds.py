"""Prompt embeds by reference through the front, over real sockets, with real payloads."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import aiohttp
import pytest
import torch

from harness.embeds_objects import seeded_tensor
from harness.front_app import MakeFront
from harness.standin import StandinUpstream
from promptcache.contract import IsolationMode
from promptcache.embeds.ids import compute_prompt_embeds_id
from promptcache.embeds.turboquant import decode as tq_decode
from promptcache.embeds.turboquant import encode as tq_encode
from promptcache.embeds.wire import encode_payload
from promptcache.front.client import EmbedsPayload, PromptCacheClient

pytestmark = pytest.mark.torch

Standin = tuple[StandinUpstream, str]
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
KEY = "x-prompt-cache-isolation-key"


def _payload(seed: int) -> EmbedsPayload:
    return EmbedsPayload.from_object(seeded_tensor(seed))


async def _post(
    http: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    async with http.post(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    ) as resp:
        return resp.status, await resp.json(content_type=None)


async def test_reference_hit_forwards_bytes_identical_to_the_uncached_path(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front()
    p = _payload(1)
    body = {"model": "m", "prompt_embeds": [p.data], "max_tokens": 4}
    assert (await _post(http, front.url + COMPLETIONS, body))[0] == 200
    uncached = upstream.requests[-1].body
    by_ref = {"model": "m", "prompt_embeds": [p.identifier], "max_tokens": 4}
    assert (await _post(http, front.url + COMPLETIONS, by_ref))[0] == 200
    assert upstream.requests[-1].body == uncached
    assert json.loads(uncached)["prompt_embeds"] == [p.data]


async def test_chat_part_reference_hit_is_byte_identical(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front(isolation_mode=IsolationMode.PER_KEY)

    def chat(data: str, **part: str) -> dict[str, Any]:
        content = [
            {"type": "text", "text": "see:"},
            {"type": "prompt_embeds", "data": data, **part},
        ]
        return {"model": "m", "messages": [{"role": "user", "content": content}]}

    p = _payload(2)
    status, _ = await _post(
        http, front.url + CHAT, chat(p.data, prompt_embeds_id=p.identifier), headers={KEY: "t"}
    )
    assert status == 200
    first = upstream.requests[-1].body
    assert "prompt_embeds_id" not in first.decode()
    assert (await _post(http, front.url + CHAT, chat(p.identifier), headers={KEY: "t"}))[0] == 200
    assert upstream.requests[-1].body == first


async def test_miss_names_exactly_the_missing_identifiers(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front()
    known, unknown1, unknown2 = _payload(3), _payload(4), _payload(5)
    await _post(http, front.url + COMPLETIONS, {"model": "m", "prompt_embeds": known.data})
    sent_before = len(upstream.requests)
    body = {
        "model": "m",
        "prompt_embeds": [
            known.identifier,
            unknown1.identifier,
            unknown2.identifier,
            unknown1.identifier,
        ],
    }
    status, answer = await _post(http, front.url + COMPLETIONS, body)
    assert status == 409
    assert answer["error"] == {
        "message": "2 prompt-embeds identifiers are not cached on this server; send the "
        "payloads for the identifiers in missing_prompt_embeds_ids again",
        "type": "invalid_request_error",
        "code": "prompt_embeds_not_cached",
        "param": "prompt_embeds",
        "missing_prompt_embeds_ids": [unknown1.identifier, unknown2.identifier],
    }
    assert len(upstream.requests) == sent_before


async def test_client_helper_reuploads_only_missing_and_then_references(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front()
    client = PromptCacheClient(http, front.url)
    history = [_payload(10 + i) for i in range(3)]
    # The client believes the server has seen the first two; it has seen none.
    client.known.update(p.identifier for p in history[:2])
    result = await client.post(COMPLETIONS, {"model": "m", "prompt_embeds": history})
    assert result.status == 200
    assert result.attempts == 2
    forwarded = upstream.requests[-1].json()
    assert forwarded["prompt_embeds"] == [p.data for p in history]
    assert "prompt_embeds_ids" not in forwarded
    # Next turn: everything known travels by identifier only.
    turn = _payload(20)
    result = await client.post(COMPLETIONS, {"model": "m", "prompt_embeds": [*history, turn]})
    assert result.status == 200
    assert result.attempts == 1
    assert result.bytes_sent < len(turn.data) + 1000
    assert upstream.requests[-1].json()["prompt_embeds"] == [p.data for p in [*history, turn]]
    assert result.usage_headers["dashflow-prompt-tokens"] == "42"


async def test_named_identifier_mismatch_is_400_and_nothing_is_cached(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front()
    p, other = _payload(30), _payload(31)
    body = {"model": "m", "prompt_embeds": [p.data], "prompt_embeds_ids": [other.identifier]}
    status, answer = await _post(http, front.url + COMPLETIONS, body)
    assert status == 400
    assert answer["error"]["code"] == "prompt_embeds_id_mismatch"
    assert answer["error"]["message"] == (
        f"prompt_embeds[0] hashes to {p.identifier}, not to the identifier the client named "
        f"({other.identifier}); nothing was cached"
    )
    assert front.cache.stats().entries == 0
    assert upstream.requests == []


def _torch_save(obj: object) -> str:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return base64.b64encode(buffer.getvalue()).decode()


BAD_PAYLOADS = [
    (
        "not base64!",
        "prompt_embeds[0] prompt_embeds payload is not valid base64 (standard "
        "alphabet, padded, no whitespace)",
    ),
    (
        base64.b64encode(b"garbage bytes").decode(),
        "prompt_embeds[0] prompt_embeds payload is not what torch.save of a tensor or a "
        "TurboQuant mapping writes: not a zip archive (the legacy format is not accepted)",
    ),
    (
        _torch_save(torch.zeros(4, 8, dtype=torch.int64)),
        "prompt_embeds[0] prompt_embeds payload must be a non-empty floating-point tensor of "
        "shape (num_tokens, hidden_size) or (1, num_tokens, hidden_size), got int64 [4, 8]",
    ),
    (
        _torch_save(torch.zeros(2, 4, 8)),
        "prompt_embeds[0] prompt_embeds payload must be a non-empty floating-point tensor of "
        "shape (num_tokens, hidden_size) or (1, num_tokens, hidden_size), got float32 [2, 4, 8]",
    ),
    (_torch_save({"format": "nope"}), "prompt_embeds[0] invalid prompt_embeds payload: "),
    (
        "blake3:abc",
        "prompt_embeds[0] is not a prompt-embeds identifier: expected 'blake3:' "
        "followed by 64 lowercase hex digits, got 'blake3:abc'",
    ),
    (
        "sha256:" + "0" * 64,
        "prompt_embeds[0] is not a prompt-embeds identifier: expected "
        "'blake3:' followed by 64 lowercase hex digits, got 'sha256:" + "0" * 64 + "'",
    ),
]


@pytest.mark.parametrize(("data", "message"), BAD_PAYLOADS)
async def test_bad_payloads_are_400_with_exact_message(
    standin: Standin,
    make_front: MakeFront,
    http: aiohttp.ClientSession,
    data: str,
    message: str,
) -> None:
    upstream, _ = standin
    front = await make_front()
    status, answer = await _post(
        http, front.url + COMPLETIONS, {"model": "m", "prompt_embeds": [data]}
    )
    assert status == 400
    if message.endswith(": "):
        assert answer["error"]["message"].startswith(message)
    else:
        assert answer["error"]["message"] == message
    assert answer["error"]["param"] == "prompt_embeds[0]"
    assert upstream.requests == []
    assert front.cache.stats().entries == 0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"prompt_embeds": 5}, "prompt_embeds must be a string or a list of strings"),
        (
            {"prompt_embeds": ["a"], "prompt_embeds_ids": ["x", "y"]},
            "prompt_embeds_ids must be a list as long as prompt_embeds (1 entries), with null "
            "where no identifier is named",
        ),
        (
            {"prompt_embeds_ids": ["x"]},
            "prompt_embeds_ids names identifiers but the request has no prompt_embeds",
        ),
        (
            {"prompt_embeds": "QUFB", "prompt_embeds_ids": ["x"]},
            "prompt_embeds_ids must be a string when prompt_embeds is one",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "prompt_embeds"}]}]},
            "messages[0].content[0].data must be a base64 payload or a prompt-embeds identifier",
        ),
    ],
)
async def test_bad_shapes_are_400_with_exact_message(
    make_front: MakeFront, http: aiohttp.ClientSession, body: dict[str, Any], message: str
) -> None:
    front = await make_front()
    path = CHAT if "messages" in body else COMPLETIONS
    status, answer = await _post(http, front.url + path, {"model": "m", **body})
    assert status == 400
    assert answer["error"]["message"] == message


async def test_scopes_follow_the_isolation_key(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    front = await make_front(isolation_mode=IsolationMode.PER_KEY)
    p = _payload(40)
    upload = {"model": "m", "prompt_embeds": p.data}
    ref = {"model": "m", "prompt_embeds": p.identifier}
    assert (await _post(http, front.url + COMPLETIONS, upload, {KEY: "alice"}))[0] == 200
    assert (await _post(http, front.url + COMPLETIONS, ref, {KEY: "alice"}))[0] == 200
    assert (await _post(http, front.url + COMPLETIONS, ref, {KEY: "bob"}))[0] == 409
    assert (await _post(http, front.url + COMPLETIONS, ref))[0] == 409


async def test_uncacheable_request_neither_stores_nor_resolves(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    front = await make_front()
    p = _payload(50)
    body = {"model": "m", "prompt_embeds": p.data, "prompt_cache_max_len": 0}
    assert (await _post(http, front.url + COMPLETIONS, body))[0] == 200
    assert front.cache.stats().entries == 0
    assert (
        await _post(http, front.url + COMPLETIONS, {"model": "m", "prompt_embeds": p.identifier})
    )[0] == 409
    # cached normally, then referenced by an uncacheable request: still a miss
    assert (await _post(http, front.url + COMPLETIONS, {"model": "m", "prompt_embeds": p.data}))[
        0
    ] == 200
    status, _ = await _post(
        http,
        front.url + COMPLETIONS,
        {"model": "m", "prompt_embeds": p.identifier, "prompt_cache_max_len": 0},
    )
    assert status == 409


async def test_disabled_cache_verifies_and_forwards_but_never_resolves(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front(cache_bytes=0)
    p = _payload(60)
    assert (await _post(http, front.url + COMPLETIONS, {"model": "m", "prompt_embeds": p.data}))[
        0
    ] == 200
    assert upstream.requests[-1].json()["prompt_embeds"] == p.data
    assert (
        await _post(http, front.url + COMPLETIONS, {"model": "m", "prompt_embeds": p.identifier})
    )[0] == 409


async def test_turboquant_is_forwarded_dense_and_hits_stay_identical(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front()
    compressed = tq_encode(seeded_tensor(70, rows=8, dim=64), bits=4)
    p = EmbedsPayload.from_object(compressed)
    assert p.identifier == compute_prompt_embeds_id(compressed)
    assert (await _post(http, front.url + COMPLETIONS, {"model": "m", "prompt_embeds": [p.data]}))[
        0
    ] == 200
    first = upstream.requests[-1].body
    forwarded = json.loads(first)["prompt_embeds"][0]
    dense = torch.load(io.BytesIO(base64.b64decode(forwarded)), weights_only=True)
    assert isinstance(dense, torch.Tensor)
    assert torch.equal(dense, tq_decode(compressed))
    assert forwarded == encode_payload(tq_decode(compressed))
    # the cache holds what the client sent (compressed), not the dense form
    assert front.cache.get(p.identifier) == p.data
    assert (
        await _post(http, front.url + COMPLETIONS, {"model": "m", "prompt_embeds": [p.identifier]})
    )[0] == 200
    assert upstream.requests[-1].body == first


async def test_embeds_metrics_count_hits_misses_uploads_and_saved_bytes(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    front = await make_front()
    p = _payload(80)
    await _post(http, front.url + COMPLETIONS, {"model": "m", "prompt_embeds": p.data})
    await _post(http, front.url + COMPLETIONS, {"model": "m", "prompt_embeds": p.identifier})
    await _post(
        http, front.url + COMPLETIONS, {"model": "m", "prompt_embeds": _payload(81).identifier}
    )
    await _post(http, front.url + COMPLETIONS, {"model": "m", "prompt_embeds": "bad!"})
    async with http.get(front.url + "/metrics") as resp:
        text = await resp.text()
    lines = set(text.splitlines())
    assert (
        'promptcache_front_prompt_embeds_id_lookups_total{endpoint="/v1/completions",'
        'result="hit"} 1.0'
    ) in lines
    assert (
        'promptcache_front_prompt_embeds_id_lookups_total{endpoint="/v1/completions",'
        'result="miss"} 1.0'
    ) in lines
    assert 'promptcache_front_prompt_embeds_uploads_total{result="verified"} 1.0' in lines
    assert 'promptcache_front_prompt_embeds_uploads_total{result="rejected"} 1.0' in lines
    saved = float(len(p.data) - len(p.identifier))
    assert f"promptcache_front_prompt_embeds_bytes_saved_total {saved}" in lines
    assert "promptcache_front_prompt_embeds_cache_entries 1.0" in lines
    assert "promptcache_front_prompt_embeds_cache_hits_total 1.0" in lines


async def test_named_reupload_of_a_cached_payload_is_trusted_only_when_identical(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front()
    p, other = _payload(90), _payload(91)
    named = {"model": "m", "prompt_embeds": p.data, "prompt_embeds_ids": p.identifier}
    assert (await _post(http, front.url + COMPLETIONS, named))[0] == 200
    first = upstream.requests[-1].body
    assert (await _post(http, front.url + COMPLETIONS, named))[0] == 200
    assert upstream.requests[-1].body == first
    # different bytes under the cached payload's name: verified in full, and refused
    forged = {"model": "m", "prompt_embeds": other.data, "prompt_embeds_ids": p.identifier}
    status, answer = await _post(http, front.url + COMPLETIONS, forged)
    assert status == 400
    assert answer["error"]["code"] == "prompt_embeds_id_mismatch"
    assert front.cache.get(p.identifier) == p.data


async def test_identical_reupload_is_not_loaded_again_but_a_different_one_is() -> None:
    from promptcache.embeds.cache import PromptEmbedsCache
    from promptcache.front.references import KindIndex, find_slots, resolve
    from promptcache.front.verify import verify_payload

    calls: list[str] = []

    async def verifier(b64: str) -> Any:
        calls.append(b64)
        return verify_payload(b64, max_bytes=1 << 20, dense_dtype="auto")

    cache, kinds = PromptEmbedsCache(1 << 24), KindIndex()
    p, q = _payload(100), _payload(101)
    for _ in range(2):
        body = {"prompt_embeds": [p.data]}
        slots = find_slots("completion", body)
        await resolve(slots, cache=cache, scope=None, verifier=verifier, kinds=kinds)
        assert body["prompt_embeds"] == [p.data]
    assert calls == [p.data]
    # the same text in another scope is not held there: verified again
    await resolve(
        find_slots("completion", {"prompt_embeds": [p.data]}),
        cache=cache,
        scope="other",
        verifier=verifier,
        kinds=kinds,
    )
    await resolve(
        find_slots("completion", {"prompt_embeds": [q.data]}),
        cache=cache,
        scope=None,
        verifier=verifier,
        kinds=kinds,
    )
    assert calls == [p.data, p.data, q.data]


async def _upload_as(
    http: aiohttp.ClientSession, url: str, key: str, data: str
) -> tuple[int, int, bytes]:
    """Upload one payload as tenant `key`; return status, and the metrics text after."""
    body = {"model": "m", "prompt_embeds": data}
    async with http.post(
        url + COMPLETIONS, json=body, headers={"x-prompt-cache-isolation-key": key}
    ) as resp:
        status = resp.status
    async with http.get(url + "/metrics") as resp:
        text = await resp.read()
    return status, len(text), text


def _front_series(text: bytes) -> dict[str, str]:
    """The front's own series (vLLM's part of the scrape is the stand-in's, not compared)."""
    out = {}
    for line in text.decode().splitlines():
        if line.startswith("promptcache_front_") and "_created" not in line:
            name, _, value = line.rpartition(" ")
            out[name] = value
    return out


async def test_metrics_do_not_reveal_whether_another_tenant_sent_a_payload(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    """Tenant B uploads P. Whether tenant A uploaded P before must not change what B's
    request does to /metrics (it used to: B's upload then made a cache lookup)."""
    p = _payload(7)
    fresh = await make_front(isolation_mode=IsolationMode.PER_KEY)
    _, _, before = await _upload_as(http, fresh.url, "tenant-a", _payload(8).data)
    status, _, alone = await _upload_as(http, fresh.url, "tenant-b", p.data)
    assert status == 200

    seen = await make_front(isolation_mode=IsolationMode.PER_KEY)
    await _upload_as(http, seen.url, "tenant-a", p.data)  # A sends P first
    _, _, before_seen = await _upload_as(http, seen.url, "tenant-a", _payload(8).data)
    status, _, after_a = await _upload_as(http, seen.url, "tenant-b", p.data)
    assert status == 200

    def delta(after: bytes, before: bytes) -> dict[str, float]:
        a, b = _front_series(after), _front_series(before)
        return {k: float(v) - float(b.get(k, "0")) for k, v in a.items() if "bytes" not in k}

    # what B's upload changed is the same whether or not A had sent P
    assert delta(alone, before) == delta(after_a, before_seen)

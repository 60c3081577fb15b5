"""Usage headers and prompt embeddings through the real front, against the real engine.

Usage: the `dashflow-*` headers (whole answers) and SSE comment lines (streams) must be
exactly what vLLM's own `usage` said, on every route that carries them (completions,
chat, and `/invocations` dispatched to either); a route with its own usage shape gets
none. Prompt embeddings: inline, by reference after an upload, and TurboQuant-compressed
give the same greedy output where the payloads are the same tensor; the repeat is served
from cache; another tenant's reference is a miss with the identifiers to re-upload.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from harness.engine.client import CACHED_HEADER, PROMPT_HEADER, chat_body, completion_body, post
from harness.engine.pods import SERVED_NAME

torch = pytest.importorskip("torch")  # the `front` extra: always installed by scripts/test

from promptcache.embeds import compute_prompt_embeds_id, turboquant  # noqa: E402
from promptcache.embeds.wire import encode_payload  # noqa: E402

HIDDEN = 128  # the tiny model's hidden size (harness.vllm.models.TinyModel)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", chat_body),
        ("/v1/completions", completion_body),
        # SageMaker's route: vLLM dispatches it by the body's shape, and so do the headers
        ("/invocations", chat_body),
        ("/invocations", completion_body),
    ],
    ids=["chat", "completions", "invocations-chat", "invocations-completions"],
)
async def test_usage_headers_equal_vllm_usage(
    path: str,
    body: Callable[..., dict[str, Any]],
    engine_pod: Any,
    engine_url: str,
    http: aiohttp.ClientSession,
    fresh_prompt: Callable[[], str],
) -> None:
    url, prompt = engine_pod.url(), fresh_prompt()
    for _ in range(2):  # a miss, then a hit: both counts must be the engine's
        answer = await post(http, url, path, body(prompt), key="usage")
        assert answer.status == 200, answer.raw[:300]
        usage = answer.body["usage"]
        assert answer.headers[PROMPT_HEADER] == str(usage["prompt_tokens"])
        assert answer.headers[CACHED_HEADER] == str(usage["prompt_tokens_details"]["cached_tokens"])
    assert int(answer.headers[CACHED_HEADER]) > 0
    direct = await post(http, engine_url, path, body(prompt))
    assert direct.body["usage"]["prompt_tokens"] == usage["prompt_tokens"]
    assert PROMPT_HEADER not in direct.headers  # the engine itself sends none


async def test_routes_with_their_own_usage_shape_get_no_usage_headers(
    engine_pod: Any, http: aiohttp.ClientSession, fresh_prompt: Callable[[], str]
) -> None:
    """Anthropic messages report `input_tokens`, not OpenAI's usage: no dashflow headers
    (docs/cache-front.md, "Usage headers")."""
    body = {
        "model": SERVED_NAME,
        "max_tokens": 4,
        "temperature": 0,
        "messages": [{"role": "user", "content": fresh_prompt()}],
    }
    answer = await post(http, engine_pod.url(), "/v1/messages", body, key="usage")
    assert answer.status == 200, answer.raw[:300]
    assert "input_tokens" in answer.body["usage"]
    assert PROMPT_HEADER not in answer.headers
    assert CACHED_HEADER not in answer.headers


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/chat/completions", chat_body), ("/v1/completions", completion_body)],
)
async def test_stream_usage_comments_equal_vllm_usage(
    path: str,
    body: Callable[..., dict[str, Any]],
    engine_pod: Any,
    http: aiohttp.ClientSession,
    fresh_prompt: Callable[[], str],
) -> None:
    url, prompt = engine_pod.url(), fresh_prompt()
    # The client asks for the usage chunk: the comments must equal what it shows.
    asked = await post(
        http,
        url,
        path,
        body(prompt, stream=True, stream_options={"include_usage": True}),
        key="s",
    )
    assert asked.status == 200, asked.raw[:300]
    assert asked.comments[PROMPT_HEADER] == str(asked.usage["prompt_tokens"])
    assert asked.comments[CACHED_HEADER] == str(
        asked.usage["prompt_tokens_details"]["cached_tokens"]
    )
    assert asked.raw.rstrip().endswith("data: [DONE]")
    # It does not: the front asks vLLM for it, reports it, and hides the chunk again.
    unasked = await post(http, url, path, body(prompt, stream=True), key="s")
    assert not [e for e in unasked.events if e.get("usage")], "the added usage chunk leaked"
    whole = await post(http, url, path, body(prompt), key="s")
    assert unasked.comments[PROMPT_HEADER] == str(whole.body["usage"]["prompt_tokens"])
    assert int(unasked.comments[CACHED_HEADER]) > 0
    assert unasked.text == asked.text == whole.text


def _embeds(seed: int, rows: int = 70) -> Any:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, HIDDEN, generator=generator, dtype=torch.float32) * 0.05


def _completion(embeds: str) -> dict[str, Any]:
    return {"model": SERVED_NAME, "prompt_embeds": embeds, "max_tokens": 6, "temperature": 0}


def _chat(embeds: str) -> dict[str, Any]:
    part = {"type": "prompt_embeds", "data": embeds}
    return {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": [part]}],
        "max_tokens": 6,
        "temperature": 0,
    }


_seeds = iter(range(1000, 1 << 30))


@pytest.mark.parametrize("shape", ["completion", "chat"])
async def test_prompt_embeds_inline_reference_and_turboquant(
    shape: str, engine_pod: Any, http: aiohttp.ClientSession
) -> None:
    make = _completion if shape == "completion" else _chat
    path = "/v1/completions" if shape == "completion" else "/v1/chat/completions"
    url, tensor = engine_pod.url(), _embeds(next(_seeds))
    inline = encode_payload(tensor)
    reference = compute_prompt_embeds_id(tensor)

    first = await post(http, url, path, make(inline), key="emb-a")
    assert first.status == 200, first.raw[:500]
    assert first.cached == 0
    by_ref = await post(http, url, path, make(reference), key="emb-a")
    assert by_ref.status == 200, by_ref.raw[:500]
    assert by_ref.text == first.text, "a reference must give what its payload gave"
    assert by_ref.cached > 0, "the repeat is served from the engine's cache"

    stolen = await post(http, url, path, make(reference), key="emb-b")
    assert stolen.status == 409, stolen.raw[:300]
    assert stolen.error_code == "prompt_embeds_not_cached"
    assert reference in stolen.raw, "the miss lists exactly what to re-upload"
    other_tenant = await post(http, url, path, make(inline), key="emb-b")
    assert other_tenant.status == 200
    assert other_tenant.cached == 0, "the same embeddings never hit another tenant's blocks"

    compressed = turboquant.encode(tensor, bits=4)
    dense = turboquant.decode(compressed)
    quantised = await post(http, url, path, make(encode_payload(compressed)), key="emb-q")
    assert quantised.status == 200, quantised.raw[:500]
    as_dense = await post(http, url, path, make(encode_payload(dense)), key="emb-q")
    assert as_dense.status == 200, as_dense.raw[:500]
    assert as_dense.text == quantised.text, "a TurboQuant payload is served as its dense form"
    assert as_dense.cached > 0, "and shares its blocks within the tenant"
    q_ref = await post(http, url, path, make(compute_prompt_embeds_id(compressed)), key="emb-q")
    assert q_ref.status == 200, q_ref.raw[:500]
    assert q_ref.text == quantised.text

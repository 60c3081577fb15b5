"""Tenant isolation, judged by the engine's own cached-token counts (vLLM's usage).

The front turns an isolation key into `cache_salt = HMAC(secret, key)`; vLLM mixes the
salt into block 0's hash, so a different salt can never hit. What must hold, on every
salted route the CPU build serves with a generative model (chat, completions, both
streamed, Anthropic messages, responses):

* a tenant's repeated prompt is served from cache;
* another tenant's identical prompt gets 0 cached tokens;
* keyless requests share one scope in PerKey, and it is not any tenant's;
* Required refuses keyless requests with the front's error;
* a client's own `cache_salt` is never honoured (even the right tenant's salt value);
* `prompt_cache_max_len: 0` gets 0 cached tokens on its own repeat;
* Shared mode shares across tenants (the baseline that shows the counts are real).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from harness.engine.client import Answer, chat_body, completion_body, post
from harness.engine.pods import SERVED_NAME, FrontFor, SaltSecrets
from promptcache.tenancy.salt import derive_salt


def _stream(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "stream": True, "stream_options": {"include_usage": True}}


ROUTES: dict[str, tuple[str, Callable[[str], dict[str, Any]]]] = {
    "chat": ("/v1/chat/completions", chat_body),
    "completions": ("/v1/completions", completion_body),
    "chat-stream": ("/v1/chat/completions", lambda p: _stream(chat_body(p))),
    "completions-stream": ("/v1/completions", lambda p: _stream(completion_body(p))),
}


def _cached(answer: Answer) -> int:
    assert answer.status == 200, answer.raw[:500]
    return answer.cached


@pytest.mark.parametrize("route", sorted(ROUTES))
async def test_tenants_never_share_and_repeat_hits(
    route: str, engine_pod: Any, http: aiohttp.ClientSession, fresh_prompt: Callable[[], str]
) -> None:
    path, body = ROUTES[route]
    url, prompt = engine_pod.url(), fresh_prompt()
    first = await post(http, url, path, body(prompt), key="tenant-a")
    again = await post(http, url, path, body(prompt), key="tenant-a")
    other = await post(http, url, path, body(prompt), key="tenant-b")
    keyless = await post(http, url, path, body(prompt))
    keyless_again = await post(http, url, path, body(prompt))
    assert _cached(first) == 0
    assert _cached(again) > 0, "the tenant's repeat must hit its own cache"
    assert _cached(other) == 0, "another tenant's identical prompt must miss"
    assert _cached(keyless) == 0, "the keyless scope is nobody's tenant scope"
    assert _cached(keyless_again) > 0, "keyless requests share one scope in PerKey"
    # Greedy decoding: the cache changes the cost, never the answer.
    assert first.text == again.text == other.text


async def test_client_cache_salt_is_never_honoured(
    engine_pod: Any,
    http: aiohttp.ClientSession,
    salt_secrets: SaltSecrets,
    fresh_prompt: Callable[[], str],
) -> None:
    """Even tenant A's real salt, sent by a keyless client or by tenant B, reaches nothing
    of A's: the front replaces or removes every client `cache_salt`."""
    url = engine_pod.url()
    for forged_salt in (derive_salt(salt_secrets.key, "a"), "a", "tenant-a"):
        prompt = fresh_prompt()
        assert _cached(await post(http, url, *_chat(prompt), key="a")) == 0
        assert _cached(await post(http, url, *_chat(prompt), key="a")) > 0
        forged = chat_body(prompt, cache_salt=forged_salt)
        as_b = await post(http, url, "/v1/chat/completions", forged, key="b")
        assert _cached(as_b) == 0, forged_salt
        keyless = await post(http, url, "/v1/chat/completions", forged)
        assert _cached(keyless) == 0, forged_salt


async def test_max_len_zero_is_never_cached(
    engine_pod: Any, http: aiohttp.ClientSession, fresh_prompt: Callable[[], str]
) -> None:
    url, prompt = engine_pod.url(), fresh_prompt()
    for path, body in (ROUTES["chat"], ROUTES["completions"]):
        uncacheable = {**body(prompt), "prompt_cache_max_len": 0}
        for _ in range(2):
            assert _cached(await post(http, url, path, uncacheable, key="a")) == 0
        assert _cached(await post(http, url, path, body(prompt), key="a")) == 0, (
            "an uncacheable request leaves nothing the tenant could hit"
        )


async def test_required_refuses_keyless_and_isolates_keys(
    front_for: FrontFor, http: aiohttp.ClientSession, fresh_prompt: Callable[[], str]
) -> None:
    url, prompt = front_for("Required"), fresh_prompt()
    for path, body in ROUTES.values():
        refused = await post(http, url, path, body(prompt))
        assert refused.status == 400, refused.raw[:300]
        assert refused.error_code == "isolation_key_required", refused.body
    assert _cached(await post(http, url, *_chat(prompt), key="a")) == 0
    assert _cached(await post(http, url, *_chat(prompt), key="a")) > 0
    assert _cached(await post(http, url, *_chat(prompt), key="b")) == 0


def _chat(prompt: str) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", chat_body(prompt)


async def test_shared_mode_shares_across_tenants(
    front_for: FrontFor, http: aiohttp.ClientSession, fresh_prompt: Callable[[], str]
) -> None:
    """The control: without isolation the same counts show a hit across tenants."""
    url, prompt = front_for("Shared"), fresh_prompt()
    assert _cached(await post(http, url, *_chat(prompt), key="a")) == 0
    assert _cached(await post(http, url, *_chat(prompt), key="b")) > 0


async def test_other_salted_generation_routes(
    engine_pod: Any, http: aiohttp.ClientSession, fresh_prompt: Callable[[], str]
) -> None:
    """Anthropic messages and responses: salted like chat, isolated like chat."""
    url = engine_pod.url()
    for path, make in (
        ("/v1/messages", _messages_body),
        ("/v1/responses", _responses_body),
    ):
        prompt = fresh_prompt()
        first = await post(http, url, path, make(prompt), key="a")
        assert first.status == 200, (path, first.raw[:500])
        again = await post(http, url, path, make(prompt), key="a")
        other = await post(http, url, path, make(prompt), key="b")
        assert _cached_any(again) > 0, (path, again.body)
        assert _cached_any(other) == 0, (path, other.body)


def _messages_body(prompt: str) -> dict[str, Any]:
    return {
        "model": SERVED_NAME,
        "max_tokens": 6,
        "temperature": 0,
        "system": prompt,
        "messages": [{"role": "user", "content": "go"}],
    }


def _responses_body(prompt: str) -> dict[str, Any]:
    return {
        "model": SERVED_NAME,
        "max_output_tokens": 6,
        "temperature": 0,
        "instructions": prompt,
        "input": "go",
        "store": False,
    }


def _cached_any(answer: Answer) -> int:
    """Cached tokens in any of the usage shapes vLLM writes (OpenAI, Anthropic, responses)."""
    usage = answer.body.get("usage") or {}
    if "cache_read_input_tokens" in usage:
        return int(usage["cache_read_input_tokens"] or 0)
    for details in ("prompt_tokens_details", "input_tokens_details"):
        if isinstance(usage.get(details), dict):
            return int(usage[details].get("cached_tokens") or 0)
    raise AssertionError(f"no cached-token count in {usage}")

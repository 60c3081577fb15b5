"""The front over real sockets: isolation, max_len, session, usage headers, errors, metrics."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from harness.front_app import SECRET, MakeFront
from harness.net import free_port
from harness.standin import StandinUpstream
from harness.waiting import eventually
from promptcache.contract import IsolationMode
from promptcache.front.client import parse_usage_comments
from promptcache.tenancy.salt import derive_salt, is_valid_vllm_salt

Standin = tuple[StandinUpstream, str]
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


KEY_A = {"x-prompt-cache-isolation-key": "a"}
KEY_B = {"x-prompt-cache-isolation-key": "b"}
KEY_C = {"x-prompt-cache-isolation-key": "c"}


def _chat(**extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


async def _post(
    http: aiohttp.ClientSession, url: str, body: object, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, object] | str, aiohttp.typedefs.LooseHeaders]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with http.post(
        url, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    ) as resp:
        text = await resp.text()
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = text
        return resp.status, parsed, resp.headers


# --- isolation ---------------------------------------------------------------------------


async def test_shared_mode_removes_forged_salt_and_isolation_field(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front(isolation_mode=IsolationMode.SHARED)
    status, _, _ = await _post(
        http,
        front.url + CHAT,
        _chat(cache_salt="attacker", prompt_cache_isolation_key="tenant-a"),
    )
    assert status == 200
    sent = upstream.requests[-1].json()
    assert "cache_salt" not in sent
    assert "prompt_cache_isolation_key" not in sent


async def test_per_key_header_becomes_hmac_salt_and_never_reaches_vllm(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front(isolation_mode=IsolationMode.PER_KEY)
    status, _, _ = await _post(
        http,
        front.url + CHAT,
        _chat(cache_salt="forged"),
        headers={"x-prompt-cache-isolation-key": "tenant-a"},
    )
    assert status == 200
    recorded = upstream.requests[-1]
    assert recorded.json()["cache_salt"] == derive_salt(SECRET, "tenant-a")
    assert "x-prompt-cache-isolation-key" not in {k.lower() for k in recorded.headers}


async def test_per_key_body_field_and_header_agree_on_one_salt(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front(isolation_mode=IsolationMode.PER_KEY)
    await _post(
        http,
        front.url + COMPLETIONS,
        {"model": "m", "prompt": "x", "prompt_cache_isolation_key": "tenant-b"},
    )
    by_field = upstream.requests[-1].json()
    await _post(
        http,
        front.url + COMPLETIONS,
        {"model": "m", "prompt": "x"},
        headers={"x-prompt-cache-isolation-key": "tenant-b"},
    )
    by_header = upstream.requests[-1].json()
    assert by_field["cache_salt"] == by_header["cache_salt"] == derive_salt(SECRET, "tenant-b")
    assert "prompt_cache_isolation_key" not in by_field


async def test_per_key_without_key_shares_the_unsalted_scope(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front(isolation_mode=IsolationMode.PER_KEY)
    status, _, _ = await _post(http, front.url + CHAT, _chat(cache_salt="forged"))
    assert status == 200
    assert "cache_salt" not in upstream.requests[-1].json()


async def test_required_mode_refuses_a_request_without_key(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front(isolation_mode=IsolationMode.REQUIRED)
    status, body, _ = await _post(http, front.url + CHAT, _chat(cache_salt="forged"))
    assert status == 400
    assert isinstance(body, dict)
    assert body["error"] == {
        "message": "this deployment requires an isolation key: send the "
        "x-prompt-cache-isolation-key header or the prompt_cache_isolation_key field with "
        "a string that names who may share cached prompts",
        "type": "invalid_request_error",
        "code": "isolation_key_required",
        "param": "prompt_cache_isolation_key",
    }
    assert upstream.requests == []


async def test_custom_isolation_names_are_honoured(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front(
        isolation_mode=IsolationMode.REQUIRED,
        isolation_header="x-tenant",
        isolation_field="tenant",
    )
    status, _, _ = await _post(http, front.url + CHAT, _chat(tenant="t1"))
    assert status == 200
    sent = upstream.requests[-1].json()
    assert sent["cache_salt"] == derive_salt(SECRET, "t1")
    assert "tenant" not in sent


# --- prompt_cache_max_len ----------------------------------------------------------------


async def test_max_len_zero_gets_a_fresh_salt_every_time(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front(isolation_mode=IsolationMode.SHARED)
    salts = []
    for _ in range(3):
        status, _, _ = await _post(http, front.url + CHAT, _chat(prompt_cache_max_len=0))
        assert status == 200
        sent = upstream.requests[-1].json()
        assert "prompt_cache_max_len" not in sent
        salts.append(sent["cache_salt"])
    assert len(set(salts)) == 3
    assert all(is_valid_vllm_salt(s) for s in salts)


async def test_positive_max_len_is_accepted_stripped_and_counted(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front()
    status, _, _ = await _post(http, front.url + CHAT, _chat(prompt_cache_max_len=128))
    assert status == 200
    sent = upstream.requests[-1].json()
    assert "prompt_cache_max_len" not in sent
    assert "cache_salt" not in sent
    async with http.get(front.url + "/metrics") as resp:
        text = await resp.text()
    assert "promptcache_front_prompt_cache_max_len_not_enforced_total 1.0" in text


async def test_max_len_ignored_when_not_honoured(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front(honor_prompt_cache_max_len=False)
    await _post(http, front.url + CHAT, _chat(prompt_cache_max_len=0))
    sent = upstream.requests[-1].json()
    assert "cache_salt" not in sent
    assert "prompt_cache_max_len" not in sent


# --- session affinity ------------------------------------------------------------------


async def test_user_field_is_copied_into_absent_session_header(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front()
    await _post(http, front.url + CHAT, _chat(user="alice"))
    assert upstream.requests[-1].headers.get("x-session-affinity") == "alice"
    await _post(
        http, front.url + CHAT, _chat(user="alice"), headers={"x-session-affinity": "explicit"}
    )
    assert upstream.requests[-1].headers.get("x-session-affinity") == "explicit"


# --- usage headers ---------------------------------------------------------------------


async def test_non_streaming_response_carries_usage_headers(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    upstream.prompt_tokens, upstream.cached_tokens = 1234, 1024
    front = await make_front(prompt_tokens_header="x-pt", cached_prompt_tokens_header="x-cpt")
    status, _, headers = await _post(http, front.url + CHAT, _chat())
    assert status == 200
    assert headers["x-pt"] == "1234"
    assert headers["x-cpt"] == "1024"


async def test_cached_header_absent_when_vllm_does_not_report_it(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    upstream.cached_tokens = None
    front = await make_front()
    _, _, headers = await _post(http, front.url + COMPLETIONS, {"model": "m", "prompt": "x"})
    assert headers["dashflow-prompt-tokens"] == "42"
    assert "dashflow-cached-prompt-tokens" not in headers


async def _stream_text(http: aiohttp.ClientSession, url: str, body: object) -> tuple[int, str]:
    async with http.post(url, json=body) as resp:
        return resp.status, await resp.text()


async def test_stream_usage_requested_by_front_is_stripped_and_sent_as_comments(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    upstream.prompt_tokens, upstream.cached_tokens = 77, 64
    front = await make_front()
    status, text = await _stream_text(http, front.url + CHAT, _chat(stream=True))
    assert status == 200
    assert upstream.requests[-1].json()["stream_options"] == {"include_usage": True}
    events = [e for e in text.split("\n\n") if e]
    datas = [e for e in events if e.startswith("data: ")]
    assert datas[-1] == "data: [DONE]"
    assert all('"usage"' not in d for d in datas), "the client did not ask for usage"
    assert len(datas) == upstream.chunks + 1
    assert parse_usage_comments(text) == {
        "dashflow-prompt-tokens": "77",
        "dashflow-cached-prompt-tokens": "64",
    }
    # the comment comes right before [DONE]
    assert text.endswith(
        ": dashflow-prompt-tokens: 77\n: dashflow-cached-prompt-tokens: 64\n\ndata: [DONE]\n\n"
    )


async def test_stream_usage_requested_by_client_is_kept(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    front = await make_front()
    body = {"model": "m", "prompt": "x", "stream": True, "stream_options": {"include_usage": True}}
    _, text = await _stream_text(http, front.url + COMPLETIONS, body)
    usage_events = [e for e in text.split("\n\n") if '"usage"' in e]
    assert len(usage_events) == 1
    assert parse_usage_comments(text)["dashflow-prompt-tokens"] == "42"


async def test_stream_is_passed_on_before_vllm_finishes(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    upstream.chunks, upstream.chunk_delay = 3, 1.0
    front = await make_front()
    loop = asyncio.get_running_loop()
    async with http.post(front.url + CHAT, json=_chat(stream=True)) as resp:
        start = loop.time()
        first = await resp.content.readuntil(b"\n\n")
        first_at = loop.time() - start
        await resp.read()
        total = loop.time() - start
    assert first.startswith(b"data: ")
    # the first event arrives while vLLM is still producing the rest (>= 2 s more)
    assert total - first_at >= 1.5


# --- errors --------------------------------------------------------------------------


async def test_malformed_json_is_400(
    make_front: MakeFront, http: aiohttp.ClientSession, standin: Standin
) -> None:
    front = await make_front()
    status, body, _ = await _post(http, front.url + CHAT, b'{"model": ')
    assert status == 400
    assert isinstance(body, dict)
    assert body["error"]["code"] == "invalid_json"
    assert body["error"]["message"] == (
        "the request body is not valid JSON: Expecting value: line 1 column 11 (char 10)"
    )
    assert standin[0].requests == []


async def test_json_array_body_is_400(make_front: MakeFront, http: aiohttp.ClientSession) -> None:
    front = await make_front()
    status, body, _ = await _post(http, front.url + CHAT, [1, 2])
    assert status == 400
    assert isinstance(body, dict)
    assert body["error"]["message"] == "the request body must be a JSON object, got a JSON list"


async def test_oversized_body_is_413(
    make_front: MakeFront, http: aiohttp.ClientSession, standin: Standin
) -> None:
    front = await make_front(max_body_bytes=2048)
    data = json.dumps(_chat(pad="x" * 4096)).encode()
    status, body, _ = await _post(http, front.url + CHAT, data)
    assert status == 413
    assert isinstance(body, dict)
    assert body["error"]["code"] == "request_too_large"
    assert body["error"]["message"] == (
        f"the request body has at least {len(data)} bytes; this server accepts at most 2048. "
        "Send prompt embeddings the server has seen by identifier instead of inline"
    )
    assert standin[0].requests == []


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "prompt_cache_max_len",
            -1,
            "prompt_cache_max_len must be a non-negative integer "
            "(0 disables caching for this request), got -1",
        ),
        (
            "prompt_cache_max_len",
            "0",
            "prompt_cache_max_len must be a non-negative integer "
            "(0 disables caching for this request), got '0'",
        ),
        (
            "prompt_cache_max_len",
            True,
            "prompt_cache_max_len must be a non-negative integer "
            "(0 disables caching for this request), got True",
        ),
        ("prompt_cache_isolation_key", 5, "prompt_cache_isolation_key must be a string, got int"),
        (
            "prompt_cache_isolation_key",
            "k" * 4097,
            "the isolation key has 4097 characters; at most 4096 are allowed",
        ),
    ],
)
async def test_bad_policy_fields_are_400_with_exact_message(
    make_front: MakeFront, http: aiohttp.ClientSession, field: str, value: object, message: str
) -> None:
    front = await make_front(isolation_mode=IsolationMode.PER_KEY)
    status, body, _ = await _post(http, front.url + CHAT, _chat(**{field: value}))
    assert status == 400
    assert isinstance(body, dict)
    assert body["error"]["message"] == message


async def test_conflicting_isolation_keys_are_400(
    make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    front = await make_front(isolation_mode=IsolationMode.PER_KEY)
    status, body, _ = await _post(
        http,
        front.url + CHAT,
        _chat(prompt_cache_isolation_key="a"),
        headers={"x-prompt-cache-isolation-key": "b"},
    )
    assert status == 400
    assert isinstance(body, dict)
    assert body["error"]["code"] == "invalid_isolation_key"


async def test_upstream_error_keeps_status_and_body(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    payload = b'{"error":{"message":"prompt too long","type":"BadRequestError","code":400}}'
    upstream.fail_next = (400, payload)
    front = await make_front()
    async with http.post(front.url + CHAT, json=_chat()) as resp:
        assert resp.status == 400
        assert await resp.read() == payload
        assert "dashflow-prompt-tokens" not in resp.headers


async def test_upstream_down_is_503_with_message(
    make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    front = await make_front(upstream=f"http://127.0.0.1:{free_port()}")
    status, body, headers = await _post(http, front.url + CHAT, _chat())
    assert status == 503
    assert isinstance(body, dict)
    assert body["error"]["code"] == "upstream_unavailable"
    assert body["error"]["message"].startswith("the model server is not accepting connections")
    assert headers["Retry-After"] == "1"
    async with http.get(front.url + "/readyz") as resp:
        assert resp.status == 503
    async with http.get(front.url + "/healthz") as resp:
        assert resp.status == 200


async def test_upstream_timeout_is_504(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    upstream.response_delay = 5
    front = await make_front(upstream_timeout_seconds=0.5)
    status, body, _ = await _post(http, front.url + CHAT, _chat())
    assert status == 504
    assert isinstance(body, dict)
    assert body["error"]["message"] == "the model server sent nothing for 0.5 seconds"


async def test_admin_paths_are_forbidden(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    front = await make_front()
    async with http.post(front.url + "/reset_prefix_cache") as resp:
        assert resp.status == 403
        assert (await resp.json())["error"]["code"] == "path_forbidden"
    assert standin[0].requests == []


async def test_other_paths_pass_through_unchanged(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front()
    async with http.get(front.url + "/v1/models?x=1") as resp:
        assert resp.status == 200
    assert upstream.requests[-1].path == "/v1/models"
    async with http.post(front.url + "/tokenize", json={"prompt": "a", "cache_salt": "f"}) as r:
        assert r.status == 200
    assert json.loads(upstream.requests[-1].body) == {"prompt": "a"}


async def test_client_disconnect_cancels_upstream_request(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    upstream.response_delay = 30
    front = await make_front()
    task = asyncio.create_task(_post(http, front.url + CHAT, _chat()))
    await asyncio.wait_for(upstream.started.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    cancelled = await eventually(
        lambda: upstream.cancelled, "the upstream request cancelled", within_s=10
    )
    assert cancelled == 1


async def test_in_flight_cap_answers_503(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    upstream.response_delay = 2
    front = await make_front(max_in_flight=2)  # one client may hold one of the two
    first = asyncio.create_task(_post(http, front.url + CHAT, _chat(), headers=KEY_A))
    other = asyncio.create_task(_post(http, front.url + CHAT, _chat(), headers=KEY_C))
    await eventually(
        lambda: front.state.in_flight,
        "front.state.in_flight == 2",
        until=lambda got: got == 2,
        within_s=30,
    )
    status, body, _ = await _post(http, front.url + CHAT, _chat(), headers=KEY_B)
    assert status == 503  # another client, holding nothing: the process is full
    assert isinstance(body, dict)
    assert body["error"]["code"] == "front_overloaded"
    status, body, _ = await _post(http, front.url + CHAT, _chat(), headers=KEY_A)
    assert status == 429  # the client holding the slot: over its share
    assert isinstance(body, dict)
    assert body["error"]["code"] == "tenant_share_exceeded"
    assert (await first)[0] == 200
    assert (await other)[0] == 200


# --- metrics and probes ----------------------------------------------------------------


async def test_metrics_merge_vllm_and_front_series(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    upstream.waiting = 7
    front = await make_front(isolation_mode=IsolationMode.PER_KEY)
    await _post(http, front.url + CHAT, _chat(), headers={"x-prompt-cache-isolation-key": "k"})
    await _post(http, front.url + CHAT, _chat(cache_salt="forged"))
    async with http.get(front.url + "/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    assert 'vllm:num_requests_waiting{engine="0",model_name="standin"} 7' in text
    assert 'vllm:cache_config_info{block_size="16"' in text
    assert 'promptcache_front_isolation_decisions_total{decision="keyed",mode="PerKey"} 1.0' in text
    assert (
        'promptcache_front_isolation_decisions_total{decision="unkeyed",mode="PerKey"} 1.0' in text
    )
    assert "promptcache_front_client_cache_salt_removed_total 1.0" in text
    assert "promptcache_front_prompt_embeds_cache_capacity_bytes 6.7108864e+07" in text
    assert "promptcache_front_upstream_metrics_up 1.0" in text


async def test_metrics_survive_upstream_down(
    make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    front = await make_front(upstream=f"http://127.0.0.1:{free_port()}")
    async with http.get(front.url + "/metrics") as resp:
        text = await resp.text()
    assert "promptcache_front_upstream_metrics_up 0.0" in text
    assert "vllm:" not in text


async def test_readyz_follows_upstream_health(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front()
    async with http.get(front.url + "/readyz") as resp:
        assert resp.status == 200
    upstream.healthy = False
    async with http.get(front.url + "/readyz") as resp:
        assert resp.status == 503
        assert (await resp.json())["reason"] == "model server /health answered 503"


async def test_required_mode_refuses_uncacheable_request_without_key(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    front = await make_front(isolation_mode=IsolationMode.REQUIRED)
    status, body, _ = await _post(http, front.url + CHAT, _chat(prompt_cache_max_len=0))
    assert status == 400
    assert isinstance(body, dict)
    assert body["error"]["code"] == "isolation_key_required"


async def test_empty_usage_header_names_switch_usage_off_and_leave_streams_alone(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    front = await make_front(
        prompt_tokens_header="", cached_prompt_tokens_header="", session_header=""
    )
    _, _, headers = await _post(http, front.url + CHAT, _chat(user="u"))
    assert "dashflow-prompt-tokens" not in headers
    assert "x-session-affinity" not in upstream.requests[-1].headers
    status, text = await _stream_text(http, front.url + CHAT, _chat(stream=True))
    assert status == 200
    assert "stream_options" not in upstream.requests[-1].json()
    assert parse_usage_comments(text) == {}


async def test_request_that_can_never_fit_the_byte_budget_is_413(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    front = await make_front(max_body_bytes=4096, max_in_flight_bytes=8192)
    data = json.dumps(_chat(pad="x" * 3400)).encode()
    status, body, _ = await _post(http, front.url + CHAT, data)
    assert status == 413
    assert isinstance(body, dict)
    assert body["error"]["message"].startswith("the request needs about ")
    # one client's share of the 8192-byte budget (half by default)
    assert body["error"]["message"].endswith("this server gives one client at most 4096")
    assert standin[0].requests == []


async def test_byte_budget_full_answers_503_and_frees_after(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    upstream.response_delay = 2
    # one request is charged its body, its parse and its forwarded copy: ~10 KB of 16 KB
    # (shares off: the process-wide budget alone; tests/front/test_front_shares.py has them)
    front = await make_front(
        max_body_bytes=4096, max_in_flight_bytes=16384, tenant_share_percent=100
    )
    body = _chat(pad="x" * 1800)
    first = asyncio.create_task(_post(http, front.url + CHAT, body))
    await asyncio.wait_for(upstream.started.wait(), 10)
    status, answer, _ = await _post(http, front.url + CHAT, body)
    assert status == 503
    assert isinstance(answer, dict)
    assert answer["error"]["code"] == "memory_budget_exhausted"
    assert answer["error"]["message"] == (
        "the cache front's memory budget for requests in flight is in use; retry shortly"
    )
    assert (await first)[0] == 200
    upstream.response_delay = 0
    assert (await _post(http, front.url + CHAT, body))[0] == 200


async def test_client_leaving_a_stream_cancels_the_upstream_stream(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    upstream.chunks, upstream.chunk_delay = 20, 0.5
    front = await make_front()
    async with http.post(front.url + CHAT, json=_chat(stream=True)) as resp:
        first = await resp.content.readuntil(b"\n\n")
        assert first.startswith(b"data: ")
        resp.close()  # drop the connection mid-stream
    cancelled = await eventually(
        lambda: upstream.cancelled, "the upstream request cancelled", within_s=10
    )
    assert cancelled == 1


async def test_usage_is_counted_for_the_cached_token_share(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    """The dashboard's cached-token share is cached / prompt tokens from the usage the front
    reports, whole or streamed; a usage without cached tokens adds prompt tokens only."""
    upstream, _ = standin
    front = await make_front()
    upstream.prompt_tokens, upstream.cached_tokens = 100, 64
    await _post(http, front.url + CHAT, _chat())
    upstream.prompt_tokens, upstream.cached_tokens = 50, 32
    await _stream_text(http, front.url + CHAT, _chat(stream=True))
    upstream.prompt_tokens, upstream.cached_tokens = 10, None
    await _post(http, front.url + COMPLETIONS, {"model": "m", "prompt": "x"})
    async with http.get(front.url + "/metrics") as resp:
        text = await resp.text()
    assert "promptcache_front_usage_prompt_tokens_total 160.0" in text
    assert "promptcache_front_usage_cached_prompt_tokens_total 96.0" in text


@pytest.mark.parametrize(
    ("mode", "status", "code"),
    [
        (IsolationMode.SHARED, 400, "prompt_cache_max_len_not_supported"),
        (IsolationMode.PER_KEY, 403, "route_not_isolated"),
    ],
)
async def test_uncacheable_is_refused_where_no_salt_can_carry_it(
    standin: Standin,
    make_front: MakeFront,
    http: aiohttp.ClientSession,
    mode: IsolationMode,
    status: int,
    code: str,
) -> None:
    """`/cohere/v2/chat` has no `cache_salt`: `prompt_cache_max_len: 0` cannot keep its prompt
    out of the shared cache, so it is refused, never silently cached."""
    upstream, _ = standin
    front = await make_front(isolation_mode=mode)
    got, body, _ = await _post(http, front.url + "/cohere/v2/chat", _chat(prompt_cache_max_len=0))
    assert got == status
    assert isinstance(body, dict)
    assert body["error"]["code"] == code
    assert upstream.requests == []


async def test_an_empty_key_is_no_key_in_every_mode(
    standin: Standin, make_front: MakeFront, http: aiohttp.ClientSession
) -> None:
    upstream, _ = standin
    per_key = await make_front(isolation_mode=IsolationMode.PER_KEY)
    required = await make_front(isolation_mode=IsolationMode.REQUIRED)
    empty = {"x-prompt-cache-isolation-key": ""}
    status, _, _ = await _post(http, per_key.url + CHAT, _chat(), headers=empty)
    assert status == 200
    assert "cache_salt" not in upstream.requests[-1].json()  # the shared scope
    status, _, _ = await _post(http, per_key.url + CHAT, _chat(prompt_cache_isolation_key=""))
    assert status == 200
    assert "cache_salt" not in upstream.requests[-1].json()
    status, body, _ = await _post(http, required.url + CHAT, _chat(), headers=empty)
    assert status == 400
    assert isinstance(body, dict)
    assert body["error"]["code"] == "isolation_key_required"

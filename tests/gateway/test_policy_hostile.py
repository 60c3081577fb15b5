"""The policy step as a boundary of its own: a hostile corpus over real gRPC sockets, in
every isolation mode, against the recording stand-in picker.

Every case is either refused by the step with the front's status and error code (and the
picker is never asked), or forwarded decided. Nothing the front would refuse reaches the
picker, no failure inside the step ends a stream without a verdict, and every refusal is
counted by code.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from harness.extproc_gateway import GatewayPolicyFactory, Upstream, body_msg
from promptcache.contract import IsolationMode
from promptcache.contract.front import VLLM_ENGINE_STATE_FIELDS
from promptcache.gateway import policy_step

SECRET = b"h" * 32
MODES = [IsolationMode.SHARED, IsolationMode.PER_KEY, IsolationMode.REQUIRED]
KEY = "x-prompt-cache-isolation-key"
CHAT = b'"messages":[{"role":"user","content":"hi"}]'


def raw_headers(entries: list[tuple[str, bytes]], end_of_stream: bool = False) -> Any:
    base = [(":method", b"POST"), (":path", b"/v1/chat/completions")]
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=k, raw_value=v) for k, v in base + entries]
            ),
            end_of_stream=end_of_stream,
        )
    )


JSON = [("content-type", b"application/json")]
KEYED = [*JSON, (KEY, b"tenant-a")]

# (name, messages after the stream opens, the refusal code, or None when forwarded)
CASES: list[tuple[str, list[Any], str | None]] = [
    ("lone surrogate", [raw_headers(KEYED), body_msg(b'{"model":"\\ud800",' + CHAT + b"}")],
     "invalid_unicode"),
    ("huge integer", [raw_headers(KEYED), body_msg(b'{"n":' + b"9" * 5000 + b"," + CHAT + b"}")],
     "invalid_json"),
    ("deep nesting", [raw_headers(KEYED), body_msg(b'{"x":' + b"[" * 50_000 + b"]" * 50_000 + b"}")],
     "json_too_deep"),
    ("NaN", [raw_headers(KEYED), body_msg(b'{"t":NaN,' + CHAT + b"}")], "invalid_json"),
    ("BOM", [raw_headers(KEYED), body_msg(b"\xef\xbb\xbf{" + CHAT + b"}")], "invalid_json"),
    ("UTF-16", [raw_headers(KEYED), body_msg(("{" + CHAT.decode() + "}").encode("utf-16"))],
     "invalid_json"),
    ("invalid byte", [raw_headers(KEYED), body_msg(b'{"model":"\xff",' + CHAT + b"}")],
     "invalid_json"),
    ("case-variant salt", [raw_headers(KEYED), body_msg(b'{"CACHE_SALT":"f",' + CHAT + b"}")],
     "ambiguous_field"),
    ("long-s salt", [raw_headers(KEYED), body_msg('{"cache_\u017falt":"f",'.encode() + CHAT + b"}")],
     "ambiguous_field"),
    ("duplicate key field",
     [raw_headers(JSON),
      body_msg(b'{"prompt_cache_isolation_key":"a","prompt_cache_isolation_key":null,' + CHAT + b"}")],
     "duplicate_field"),
    ("two different keys", [raw_headers([*JSON, (KEY, b"a"), (KEY, b"b")]), body_msg(b"{" + CHAT + b"}")],
     "invalid_isolation_key"),
    ("non-UTF-8 header", [raw_headers([*KEYED, ("x-note", b"\xff")]), body_msg(b"{" + CHAT + b"}")],
     "invalid_header"),
    ("gzip", [raw_headers([*KEYED, ("content-encoding", b"gzip")]), body_msg(b"{" + CHAT + b"}")],
     "unsupported_content_encoding"),
    ("no content type", [raw_headers([(KEY, b"tenant-a")]), body_msg(b"{" + CHAT + b"}")],
     "unsupported_media_type"),
    ("two content types",
     [raw_headers([*KEYED, ("content-type", b"text/plain")]), body_msg(b"{" + CHAT + b"}")],
     "duplicate_header"),
    ("headers only", [raw_headers(KEYED, end_of_stream=True)], "invalid_json"),
    ("protocol violation",
     [raw_headers(KEYED), body_msg(b"{", end_of_stream=False),
      pb.ProcessingRequest(response_headers=pb.HttpHeaders())], "internal_error"),
    ("half-closed mid-body", [raw_headers(KEYED), body_msg(b"{" + CHAT, end_of_stream=False)],
     "invalid_json"),
    ("ended by trailers",
     [raw_headers(KEYED), body_msg(b"{" + CHAT + b"}", end_of_stream=False),
      pb.ProcessingRequest(request_trailers=pb.HttpTrailers())], None),
    ("same key twice", [raw_headers([*JSON, (KEY, b"a"), (KEY, b"a")]), body_msg(b"{" + CHAT + b"}")],
     None),
    ("keyless", [raw_headers(JSON), body_msg(b"{" + CHAT + b"}")], "isolation_key_required"),
]  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("name", "messages", "code"), CASES, ids=[c[0] for c in CASES])
async def test_hostile_case(
    make_gateway_policy: GatewayPolicyFactory,
    upstream: Upstream,
    gateway_for: Any,
    mode: IsolationMode,
    name: str,
    messages: list[Any],
    code: str | None,
) -> None:
    if name == "keyless" and mode is not IsolationMode.REQUIRED:
        code = None  # only Required refuses a keyless request
    shim = await make_gateway_policy(isolation_mode=mode, secret=SECRET)
    responses = await gateway_for(shim).exchange(*messages)
    if code is None:
        (stream,) = upstream.fake.streams
        kinds = [m.WhichOneof("request") for m in stream.received]
        assert kinds[0] == "request_headers"
        assert "request_body" in kinds
        return
    (only,) = responses
    assert only.WhichOneof("response") == "immediate_response", name
    answer = only.immediate_response
    body = json.loads(answer.body)
    assert body["error"]["code"] == code, (name, body)
    assert answer.status.code == {"internal_error": 500}.get(
        code, 415 if "unsupported" in code else 400
    )
    assert upstream.fake.streams == []  # the picker is never asked
    assert shim.servicer.metrics.value("promptcache_gateway_policy_refusals_total", code=code) == 1
    assert shim.servicer.budget.used == 0


@pytest.mark.parametrize("mode", MODES)
async def test_a_failure_inside_the_step_is_a_refusal(
    make_gateway_policy: GatewayPolicyFactory,
    upstream: Upstream,
    gateway_for: Any,
    mode: IsolationMode,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Fail closed: an exception is the front's 500, logged and counted, never a stream
    that ends without a verdict (which the gateway's failure mode would decide)."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(policy_step, "decide", broken)
    shim = await make_gateway_policy(isolation_mode=mode, secret=SECRET)
    responses = await gateway_for(shim).exchange(raw_headers(KEYED), body_msg(b"{" + CHAT + b"}"))
    (only,) = responses
    answer = only.immediate_response
    assert answer.status.code == 500
    assert json.loads(answer.body)["error"]["code"] == "internal_error"
    assert b"boom" not in answer.body
    assert upstream.fake.streams == []
    assert shim.servicer.metrics.value("promptcache_gateway_policy_internal_errors_total") == 1
    assert "failed on a request" in caplog.text


async def test_a_stalled_body_is_cut_after_the_body_timeout(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any
) -> None:
    shim = await make_gateway_policy(body_timeout_seconds=0.5)
    call = gateway_for(shim).open()
    await call.write(raw_headers(JSON))
    await call.write(body_msg(b'{"messages":[', end_of_stream=False))
    responses = [r async for r in call]  # the gateway never sends the rest
    (only,) = responses
    assert only.immediate_response.status.code == 408
    assert json.loads(only.immediate_response.body)["error"]["code"] == "body_timeout"
    assert shim.servicer.budget.used == 0
    assert upstream.fake.streams == []


STATE_ROUTES = [
    ("/v1/chat/completions/batch", b'"messages":[[{"role":"user","content":"hi"}]]'),
    ("/invocations", CHAT),
    ("/invocations", b'"prompt":"hi"'),
    ("/v1/completions/render", b'"prompt":"hi"'),
    ("/v1/chat/completions/render", CHAT),
    ("/v1/embeddings", b'"input":[{"role":"user","content":"hi"}]'),
    ("/tokenize", CHAT),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("field", sorted(VLLM_ENGINE_STATE_FIELDS))
@pytest.mark.parametrize(
    ("path", "rest"), STATE_ROUTES, ids=[f"{p} {r[:12]!r}" for p, r in STATE_ROUTES]
)
async def test_engine_state_is_refused_on_every_route_that_reads_it(
    make_gateway_policy: GatewayPolicyFactory,
    upstream: Upstream,
    gateway_for: Any,
    mode: IsolationMode,
    field: str,
    path: str,
    rest: bytes,
) -> None:
    """The routes whose vLLM request models read chat messages or prompt embeds (derived in
    `tests/front/test_front_vllm_fields.py`) refuse engine state at the step as the front
    does, before the picker is asked, in every mode."""
    shim = await make_gateway_policy(isolation_mode=mode, secret=SECRET)
    headers = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=k, raw_value=v)
                    for k, v in [(":method", b"POST"), (":path", path.encode()), *KEYED]
                ]
            )
        )
    )
    body = b"{" + rest + b',"' + field.encode() + b'":{"x":1}}'
    (only,) = await gateway_for(shim).exchange(headers, body_msg(body))
    assert only.WhichOneof("response") == "immediate_response"
    assert json.loads(only.immediate_response.body)["error"]["code"] == "field_not_allowed"
    assert upstream.fake.streams == []

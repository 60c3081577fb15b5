"""The gateway policy step over real gRPC on loopback, in front of a recording stand-in EPP.

What the gateway and the EPP must see: the session header added from `user` only when
the client sent none, every other byte unchanged and in order, messages streamed (not
collected) both ways, bounded buffering, and the EPP's failures reaching the gateway as
gRPC statuses rather than hanging streams.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import grpc.aio
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from hypothesis import given
from hypothesis import strategies as st

from harness.extproc_gateway import (
    JSON,
    SESSION,
    TIMEOUT,
    Gateway,
    GatewayPolicyFactory,
    Upstream,
    body_msg,
    canonical,
    chat,
    echoed,
    headers_msg,
    read_rest,
    start_upstream,
)
from harness.waiting import eventually
from promptcache.contract.session import MAX_SESSION_ID_CHARS
from promptcache.gateway.decision import (
    decide,
    decide_cost,
    session_from_body,
)
from promptcache.tenancy.settings import PolicySettings

BAD_USERS: list[Any] = [
    "",
    "   ",
    "x" * (MAX_SESSION_ID_CHARS + 1),
    "evil\r\nx-injected: 1",
    "tab\there",
    "del\x7f",
    "nul\x00",
    42,
    None,
    ["alice"],
    {"id": "alice"},
    True,
]


async def test_user_becomes_the_session_header(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any
) -> None:
    gw: Gateway = gateway_for(await make_gateway_policy())
    raw = chat("alice")
    responses = await gw.exchange(headers_msg({"x-request-id": "r1"}), body_msg(raw))
    (stream,) = upstream.fake.streams
    assert stream.session() == ["alice"]
    assert ("x-request-id", "r1") in stream.headers()
    kinds = [m.WhichOneof("request") for m in stream.received]
    assert kinds == ["request_headers", "request_body"]
    # the body is the canonical encoding of what the client sent (no salt in Shared mode)
    assert stream.received[1].request_body.body == canonical(raw)
    assert echoed(responses) == "alice"  # the EPP's answer reaches the gateway


async def test_user_is_trimmed(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any
) -> None:
    gw = gateway_for(await make_gateway_policy())
    await gw.exchange(headers_msg({}), body_msg(chat("  bob  ")))
    assert upstream.fake.streams[0].session() == ["bob"]


async def test_explicit_header_wins(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any
) -> None:
    gw = gateway_for(await make_gateway_policy())
    sent = headers_msg({SESSION: "bob"})
    responses = await gw.exchange(sent, body_msg(chat("alice")))
    (stream,) = upstream.fake.streams
    assert stream.session() == ["bob"]
    assert stream.received[0] == sent  # forwarded as sent, not rebuilt
    assert echoed(responses) == "bob"


async def test_empty_header_is_replaced_by_user(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any
) -> None:
    gw = gateway_for(await make_gateway_policy())
    await gw.exchange(headers_msg({SESSION: ""}), body_msg(chat("alice")))
    assert upstream.fake.streams[0].session() == ["alice"]  # one entry, not two


@pytest.mark.parametrize("user", BAD_USERS, ids=repr)
async def test_unusable_user_is_ignored(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any, user: Any
) -> None:
    """Never a session; either passed on (headers as sent, the body in its canonical
    encoding), or refused with the error the front itself gives that body (e.g. control
    characters in `user`)."""
    gw = gateway_for(await make_gateway_policy())
    raw = json.dumps({"model": "m", "user": user}).encode()
    sent = [headers_msg({}), body_msg(raw)]
    responses = await gw.exchange(*sent)
    decision = decide(
        "POST", "/v1/chat/completions", JSON, raw, policy=PolicySettings(), secret=None,
        session_header="", user_field="user",
    )  # fmt: skip
    if decision.refusal is not None:
        (answer,) = responses
        assert answer.immediate_response.body == decision.refusal.body_bytes()
        assert upstream.fake.streams == []
        return
    (stream,) = upstream.fake.streams
    assert stream.received[0] == sent[0]  # the headers exactly as the gateway sent them
    assert stream.received[1].request_body.body == canonical(raw)
    assert echoed(responses) == "-"


@pytest.mark.parametrize(
    "raw", [b"", b"not json", b"\xff\xfe{", b"[1, 2]", b'"alice"', b'{"user": "al', b"{" * 5000]
)
async def test_unreadable_body_is_refused_as_the_front_refuses_it(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any, raw: bytes
) -> None:
    """A body the front would refuse never reaches the picker undecided (it would route
    without the tenant's salt): the front's status and error body, at the gateway."""
    shim = await make_gateway_policy()
    gw = gateway_for(shim)
    status, body = refusal(await gw.exchange(headers_msg({}), body_msg(raw)))
    assert status == 400
    assert body["error"]["code"] in {"invalid_json", "body_not_object", "json_too_deep"}
    assert upstream.fake.streams == []
    assert (
        shim.servicer.metrics.value(
            "promptcache_gateway_policy_refusals_total", code=body["error"]["code"]
        )
        == 1
    )


async def test_another_field_can_be_configured(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any
) -> None:
    gw = gateway_for(await make_gateway_policy(user_field="session", session_header="x-sid"))
    await gw.exchange(headers_msg({}), body_msg(b'{"session": "s1", "user": "u"}'))
    assert ("x-sid", "s1") in upstream.fake.streams[0].headers()


async def test_body_in_chunks_is_joined_and_forwarded_in_order(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any
) -> None:
    gw = gateway_for(await make_gateway_policy())
    raw = chat("carol", pad=3000)
    parts = [raw[:1000], raw[1000:2000], raw[2000:]]
    chunks = [body_msg(p, end_of_stream=i == 2) for i, p in enumerate(parts)]
    responses = await gw.exchange(headers_msg({}), *chunks)
    (stream,) = upstream.fake.streams
    assert stream.session() == ["carol"]
    (forwarded,) = stream.received[1:]  # decided whole, forwarded as one canonical body
    assert forwarded.request_body.body == canonical(raw)
    assert forwarded.request_body.end_of_stream
    assert echoed(responses) == "carol"


async def test_body_without_end_of_stream_is_refused_on_half_close(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any
) -> None:
    """A request whose body never ended is not forwarded undecided."""
    gw = gateway_for(await make_gateway_policy())
    sent = [headers_msg({}), body_msg(chat("dave"), end_of_stream=False)]
    status, body = refusal(await gw.exchange(*sent))
    assert (status, body["error"]["code"]) == (400, "invalid_json")
    assert upstream.fake.streams == []


async def test_request_without_body_is_not_held(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any
) -> None:
    gw = gateway_for(await make_gateway_policy())
    call = gw.open()
    sent = headers_msg({":method": "GET", ":path": "/v1/models"}, end_of_stream=True)
    await call.write(sent)
    first = await asyncio.wait_for(call.read(), TIMEOUT)  # answered before any half-close
    assert first.WhichOneof("response") == "request_headers"
    assert upstream.fake.streams[0].received == [sent]
    await call.done_writing()
    assert await read_rest(call) == []


def refusal(responses: list[Any]) -> tuple[int, dict[str, Any]]:
    """The (status, JSON body) of the one immediate response the step answered with."""
    (only,) = responses
    assert only.WhichOneof("response") == "immediate_response"
    answer = only.immediate_response
    return int(answer.status.code), json.loads(answer.body)


async def test_body_over_the_cap_gets_the_fronts_413_never_passes_unread(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any
) -> None:
    """A body the step cannot read would route without its salt or session: refused, with
    the front's own error, and the picker is never asked."""
    shim = await make_gateway_policy(max_body_bytes=100, max_buffered_bytes=1000)
    gw = gateway_for(shim)
    raw = chat("erin", pad=300)
    call = gw.open()
    await call.write(headers_msg({}))
    await call.write(body_msg(raw[:150], end_of_stream=False))
    await call.done_writing()
    status, body = refusal([r async for r in call])
    assert status == 413
    assert body["error"]["code"] == "request_too_large"
    assert "accepts at most 100" in body["error"]["message"]
    assert upstream.fake.streams == []
    assert shim.servicer.budget.used == 0


async def test_shared_budget_bounds_all_streams(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any
) -> None:
    raw_a = chat("alice", pad=200)
    need_a = len(raw_a) + decide_cost(raw_a)  # its bytes, then deciding on them
    # shares off: the step-wide budget alone (tests/gateway/test_policy_shares.py has them)
    shim = await make_gateway_policy(
        max_body_bytes=need_a, max_buffered_bytes=need_a, tenant_share_percent=100
    )
    gw = gateway_for(shim)
    raw_b = chat("bob", pad=need_a - 200)
    assert 250 + len(raw_b) > need_a >= len(raw_b)
    a = gw.open()
    await a.write(headers_msg({}))
    await a.write(body_msg(raw_a[:250], end_of_stream=False))  # held: budget partly used
    await eventually(
        lambda: shim.servicer.budget.used,
        "shim.servicer.budget.used == 250",
        until=lambda got: got == 250,
        within_s=30,
    )
    b = gw.open()
    await b.write(headers_msg({}))
    await b.write(body_msg(raw_b))  # does not fit beside a's bytes: 503, retryable
    await b.done_writing()
    status, body = refusal([r async for r in b])
    assert status == 503
    assert body["error"]["type"] == "overloaded_error"
    await a.write(body_msg(raw_a[250:]))
    await a.done_writing()
    assert echoed([r async for r in a]) == "alice"
    assert shim.servicer.budget.used == 0


async def test_streaming_both_ways(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any
) -> None:
    """Each response-phase message is answered before the next is sent: nothing is collected."""
    gw = gateway_for(await make_gateway_policy())
    call = gw.open()
    await call.write(headers_msg({}))
    await call.write(body_msg(chat("frank")))
    kinds = []
    for _ in range(2):
        kinds.append((await asyncio.wait_for(call.read(), TIMEOUT)).WhichOneof("response"))
    assert kinds == ["request_headers", "request_body"]
    await call.write(pb.ProcessingRequest(response_headers=pb.HttpHeaders()))
    got = await asyncio.wait_for(call.read(), TIMEOUT)
    assert got.WhichOneof("response") == "response_headers"
    for i in range(5):
        chunk = pb.ProcessingRequest(
            response_body=pb.HttpBody(body=f"data: {i}\n\n".encode(), end_of_stream=i == 4)
        )
        await call.write(chunk)
        got = await asyncio.wait_for(call.read(), TIMEOUT)
        assert got.WhichOneof("response") == "response_body"
        assert upstream.fake.streams[0].received[-1] == chunk
    await call.done_writing()
    assert await read_rest(call) == []
    assert await call.code() == grpc.StatusCode.OK


async def test_call_metadata_reaches_the_epp(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any
) -> None:
    gw = gateway_for(await make_gateway_policy())
    call = gw.open(metadata=(("x-envoy-tag", "gw-1"),))
    await call.write(headers_msg({}))
    await call.write(body_msg(chat("gina")))
    await call.done_writing()
    _ = [r async for r in call]
    assert upstream.fake.streams[0].metadata.get("x-envoy-tag") == "gw-1"


async def test_epp_status_reaches_the_gateway(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any
) -> None:
    upstream.fake.abort_after_body = (grpc.StatusCode.RESOURCE_EXHAUSTED, "pool saturated")
    gw = gateway_for(await make_gateway_policy())
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await gw.exchange(headers_msg({}), body_msg(chat("hal")))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert caught.value.details() == "pool saturated"


async def test_epp_failing_at_once_fails_the_gateway_stream(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any
) -> None:
    """While the shim still writes, grpc-python may report the EPP's status as INTERNAL;
    either way the gateway gets a failed stream (and its failure mode), never a hang."""
    upstream.fake.abort_with = (grpc.StatusCode.RESOURCE_EXHAUSTED, "pool saturated")
    shim = await make_gateway_policy()
    gw = gateway_for(shim)
    for _ in range(5):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(gw.exchange(headers_msg({}), body_msg(chat("hal"))), TIMEOUT)
        assert caught.value.code() in {
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.INTERNAL,
        }
    await eventually(
        lambda: shim.servicer.budget.used,
        "shim.servicer.budget.used == 0",
        until=lambda got: got == 0,
        within_s=30,
    )


async def test_gateway_going_away_frees_what_was_held(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any
) -> None:
    shim = await make_gateway_policy()
    gw = gateway_for(shim)
    call = gw.open()
    await call.write(headers_msg({}))
    await call.write(body_msg(b'{"user": "ivy", "messages": [', end_of_stream=False))
    await eventually(
        lambda: shim.servicer.budget.used,
        "shim.servicer.budget.used > 0",
        until=lambda got: got > 0,
        within_s=30,
    )  # the body is held, not yet sent
    call.cancel()
    # The held bytes are freed, and the picker was never asked about a request that never
    # arrived whole.
    await eventually(
        lambda: shim.servicer.budget.used,
        "shim.servicer.budget.used == 0",
        until=lambda got: got == 0,
        within_s=30,
    )
    assert upstream.fake.streams == []


async def test_gateway_going_away_mid_answer_cancels_the_epp_stream(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any
) -> None:
    shim = await make_gateway_policy()
    gw = gateway_for(shim)
    call = gw.open()
    await call.write(headers_msg({}))
    await call.write(body_msg(chat("ivy")))
    await eventually(
        lambda: len(upstream.fake.streams),
        "len(upstream.fake.streams) == 1",
        until=lambda got: got == 1,
        within_s=30,
    )
    call.cancel()
    # The picker's stream ends too: no stream left open per departed client.
    await asyncio.wait_for(upstream.fake.streams[0].ended.wait(), TIMEOUT)
    await eventually(
        lambda: shim.servicer.budget.used,
        "shim.servicer.budget.used == 0",
        until=lambda got: got == 0,
        within_s=30,
    )


async def test_epp_down_fails_the_stream_cleanly_and_recovers(
    make_gateway_policy: GatewayPolicyFactory, gateway_for: Any
) -> None:
    probe = await start_upstream()
    port = probe.port
    await probe.server.stop(0)  # a port where nothing listens now
    shim = await make_gateway_policy(upstream=f"127.0.0.1:{port}")
    gw = gateway_for(shim)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(gw.exchange(headers_msg({}), body_msg(chat("jo"))), TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert shim.servicer.budget.used == 0
    # The EPP comes back (same port): the same shim serves again.
    back = await start_upstream(port)
    codes: set[grpc.StatusCode] = set()
    try:
        for _ in range(50):
            try:
                responses = await gw.exchange(headers_msg({}), body_msg(chat("jo")))
                break
            except grpc.aio.AioRpcError as error:
                codes.add(error.code())
                await asyncio.sleep(0.2)  # the channel's reconnect backoff, not a sync point
        else:
            pytest.fail("the shim never reached the restarted EPP")
        assert echoed(responses) == "jo"
        assert codes <= {grpc.StatusCode.UNAVAILABLE}
    finally:
        await back.server.stop(0)


async def test_stop_refuses_new_streams_and_lets_open_ones_finish(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any
) -> None:
    shim = await make_gateway_policy()
    gw = gateway_for(shim)
    call = gw.open()
    await call.write(headers_msg({}))
    await call.write(body_msg(chat("kim")))
    assert (await asyncio.wait_for(call.read(), TIMEOUT)).WhichOneof("response")
    stopping = asyncio.create_task(shim.stop(grace_s=TIMEOUT))
    await call.write(pb.ProcessingRequest(response_headers=pb.HttpHeaders()))
    await call.done_writing()
    rest = [r.WhichOneof("response") for r in await read_rest(call)]
    assert rest == ["request_body", "response_headers"]
    await asyncio.wait_for(stopping, TIMEOUT)
    late = Gateway(shim.target)
    try:
        with pytest.raises(grpc.aio.AioRpcError):
            await asyncio.wait_for(late.exchange(headers_msg({})), TIMEOUT)
    finally:
        await late.close()


# ---------------------------------------------------------------- session_from_body


@given(st.text(max_size=300))
def test_session_is_the_trimmed_user_or_nothing(user: str) -> None:
    session = session_from_body(json.dumps({"user": user}).encode())
    stripped = user.strip()
    usable = 0 < len(stripped) <= MAX_SESSION_ID_CHARS and all(
        ord(c) >= 0x20 and ord(c) != 0x7F for c in stripped
    )
    assert session == (stripped if usable else None)


@given(st.binary(max_size=200))
def test_any_bytes_never_raise(raw: bytes) -> None:
    session = session_from_body(raw)
    assert session is None or 0 < len(session) <= MAX_SESSION_ID_CHARS


async def test_a_second_shim_cannot_share_the_port(
    make_gateway_policy: GatewayPolicyFactory,
) -> None:
    """No SO_REUSEPORT: a leftover process must fail loudly, not take half the streams."""
    first = await make_gateway_policy()
    with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{first.port}"):
        await make_gateway_policy(listen=f"127.0.0.1:{first.port}")


async def test_a_gateway_without_a_deadline_is_served(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream
) -> None:
    """Envoy keeps ext_proc streams open without a gRPC deadline; none is invented."""
    shim = await make_gateway_policy()
    async with grpc.aio.insecure_channel(shim.target) as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process()
        await call.write(headers_msg({}))
        await call.write(body_msg(chat("lee")))
        await call.done_writing()
        assert echoed(await read_rest(call)) == "lee"

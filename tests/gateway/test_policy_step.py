"""The gateway's policy step: the tenant's salt before routing, with the front's function.

Over real gRPC sockets, against a stand-in picker that records what it received: the body
the picker hashes carries exactly the salt the cache front derives (same HMAC, same
secret), never the client's own, and a request the front would refuse is refused here with
the front's status and error body, before the picker is asked. Sessions come from the
header, `prompt_cache_key`, then `user`; a session never becomes an isolation key.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from harness.executors import CountingExecutor
from harness.extproc_gateway import (
    JSON,
    SESSION,
    GatewayPolicyFactory,
    Upstream,
    body_msg,
    headers_msg,
)
from promptcache.contract import IsolationMode
from promptcache.gateway.decision import decide
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.policy import apply_policy
from promptcache.tenancy.routes import check_route
from promptcache.tenancy.salt import derive_salt
from promptcache.tenancy.settings import PolicySettings

SECRET = b"s" * 32
CHAT = check_route("POST", "/v1/chat/completions")
KEY_HEADER = "x-prompt-cache-isolation-key"


def sent_body(upstream: Upstream, index: int = -1) -> dict[str, Any]:
    stream = upstream.fake.streams[index]
    bodies = [
        m.request_body.body for m in stream.received if m.WhichOneof("request") == "request_body"
    ]
    result: dict[str, Any] = json.loads(b"".join(bodies))
    return result


def request(**fields: Any) -> bytes:
    return json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    ).encode()


async def test_the_picker_hashes_the_fronts_salt_and_never_the_clients(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any
) -> None:
    gw = gateway_for(await make_gateway_policy(isolation_mode=IsolationMode.PER_KEY, secret=SECRET))
    await gw.exchange(headers_msg({KEY_HEADER: "tenant-a"}), body_msg(request(cache_salt="forged")))
    assert sent_body(upstream)["cache_salt"] == derive_salt(SECRET, "tenant-a")
    # The key in the body field gives the same salt; the field stays for the front.
    await gw.exchange(headers_msg({}), body_msg(request(prompt_cache_isolation_key="tenant-a")))
    body = sent_body(upstream)
    assert body["cache_salt"] == derive_salt(SECRET, "tenant-a")
    assert body["prompt_cache_isolation_key"] == "tenant-a"
    # No key in PerKey: the shared scope, and a forged salt is dropped, not forwarded; the
    # content-length the picker sees is the rewritten body's.
    forged = request(cache_salt="tenant-b-forged")
    await gw.exchange(headers_msg({"content-length": str(len(forged))}), body_msg(forged))
    assert "cache_salt" not in sent_body(upstream)
    headers = dict(upstream.fake.streams[-1].headers())
    stream = upstream.fake.streams[-1]
    sent = b"".join(m.request_body.body for m in stream.received[1:])
    assert int(headers["content-length"]) == len(sent) < len(forged)


async def test_required_refuses_keyless_with_the_fronts_error(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any
) -> None:
    gw = gateway_for(
        await make_gateway_policy(isolation_mode=IsolationMode.REQUIRED, secret=SECRET)
    )
    (answer,) = await gw.exchange(headers_msg({}), body_msg(request()))
    refused = answer.immediate_response
    front = PolicySettings(isolation_mode=IsolationMode.REQUIRED)
    try:
        apply_policy(CHAT, CIMultiDict(), json.loads(request()), front, SECRET)
    except FrontError as error:
        expected = error
    assert refused.status.code == expected.status == 400
    assert refused.body == expected.body_bytes()
    assert upstream.fake.streams == []  # the picker was never asked
    await gw.exchange(headers_msg({KEY_HEADER: "t"}), body_msg(request()))
    assert sent_body(upstream)["cache_salt"] == derive_salt(SECRET, "t")


async def test_sessions_from_prompt_cache_key_then_user_never_isolation(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any
) -> None:
    gw = gateway_for(await make_gateway_policy(isolation_mode=IsolationMode.PER_KEY, secret=SECRET))
    await gw.exchange(headers_msg({}), body_msg(request(prompt_cache_key="conv-1", user="u")))
    assert upstream.fake.streams[-1].session() == ["conv-1"]
    assert "cache_salt" not in sent_body(upstream)  # a session is routing, never isolation
    await gw.exchange(headers_msg({}), body_msg(request(user="u")))
    assert upstream.fake.streams[-1].session() == ["u"]
    await gw.exchange(headers_msg({SESSION: "h"}), body_msg(request(prompt_cache_key="k")))
    assert upstream.fake.streams[-1].session() == ["h"]


async def test_large_bodies_keep_their_session_and_salt(
    make_gateway_policy: GatewayPolicyFactory, upstream: Upstream, gateway_for: Any
) -> None:
    """A body bigger than the old 4 MiB inspection cap is read, not passed on unnamed."""
    gw = gateway_for(await make_gateway_policy(isolation_mode=IsolationMode.PER_KEY, secret=SECRET))
    raw = request(user="big", padding="x" * (5 * 1024**2))
    chunks = [raw[i : i + 1024**2] for i in range(0, len(raw), 1024**2)]
    messages = [headers_msg({KEY_HEADER: "t"})]
    messages += [body_msg(c, end_of_stream=i == len(chunks) - 1) for i, c in enumerate(chunks)]
    await gw.exchange(*messages)
    assert upstream.fake.streams[-1].session() == ["big"]
    assert sent_body(upstream)["cache_salt"] == derive_salt(SECRET, "t")


async def test_the_decide_workers_run_nicer_than_the_loop(
    make_gateway_policy: GatewayPolicyFactory,
) -> None:
    """On the cores the step shares, its loop (every tenant's routing) goes before the
    workers deciding large or dense bodies."""
    shim = await make_gateway_policy(isolation_mode=IsolationMode.PER_KEY, secret=SECRET)
    niceness = shim.servicer._pool().submit(os.nice, 0).result(timeout=30)
    assert niceness > os.nice(0)


async def test_a_dense_body_is_decided_off_the_event_loop_however_small(
    make_gateway_policy: GatewayPolicyFactory,
    upstream: Upstream,
    gateway_for: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """40 KiB of `[1,1,...]` is cheap by its bytes but not by its values (255 KiB of it
    held the loop for ~270 ms, every other tenant's routing waiting): it goes to a worker;
    a plain small body is decided on the loop, where that is cheaper than a worker."""
    shim = await make_gateway_policy(isolation_mode=IsolationMode.PER_KEY, secret=SECRET)
    workers = CountingExecutor()
    monkeypatch.setattr(shim.servicer, "_pool", lambda: workers)
    gw = gateway_for(shim)
    try:
        await gw.exchange(headers_msg({KEY_HEADER: "t"}), body_msg(request()))
        assert workers.jobs == 0
        dense = request(prompt=[1] * 20_000)
        await gw.exchange(headers_msg({KEY_HEADER: "t"}), body_msg(dense))
        assert workers.jobs == 1
        assert sent_body(upstream)["cache_salt"] == derive_salt(SECRET, "t")
    finally:
        workers.shutdown()


@settings(max_examples=200, deadline=None)
@given(
    key=st.one_of(st.none(), st.text(min_size=1, max_size=40)),
    forged=st.one_of(st.none(), st.text(max_size=40)),
    mode=st.sampled_from(list(IsolationMode)),
)
def test_decide_matches_the_front_for_any_key_and_forged_salt(
    key: str | None, forged: str | None, mode: IsolationMode
) -> None:
    """Whatever the client sends, the picker sees exactly the salt the front forwards."""
    front = PolicySettings(isolation_mode=mode)
    headers = JSON if key is None or "\x00" in key else {**JSON, KEY_HEADER: key}
    fields: dict[str, Any] = {} if forged is None else {"cache_salt": forged}
    raw = request(**fields)
    decision = decide(
        "POST", "/v1/chat/completions", headers, raw, policy=front, secret=SECRET,
        session_header="", user_field="user",
    )  # fmt: skip
    try:
        plan = apply_policy(CHAT, CIMultiDict(headers), json.loads(raw), front, SECRET)
    except FrontError as error:
        refused: FrontError | None = error
    else:
        refused = None
    if refused is not None:
        assert decision.refusal is not None
        assert decision.refusal.body_bytes() == refused.body_bytes()
        return
    assert decision.refusal is None
    seen = json.loads(decision.body) if decision.body is not None else json.loads(raw)
    assert seen.get("cache_salt") == plan.salt


def test_a_client_priority_is_decided_as_the_front_decides() -> None:
    """Refused before routing unless the deployment allows client priorities, like the front."""
    raw = request(priority=-100)
    for allowed in (False, True):
        front = PolicySettings(isolation_mode=IsolationMode.SHARED, allow_client_priority=allowed)
        decision = decide(
            "POST", "/v1/chat/completions", JSON, raw, policy=front, secret=None,
            session_header="", user_field="user",
        )  # fmt: skip
        if allowed:
            assert decision.refusal is None
        else:
            assert decision.refusal is not None
            assert decision.refusal.code == "priority_not_allowed"

"""The policy step meters each key's decoding work as the front does, over real gRPC.

The step serves a whole pool, so one tenant's dense bodies must not take the step from
the others: a key over its share (while another key is active) waits before its next
body is read, the other key is never held back, and past `MAX_WAITERS` waiting streams
the key gets the front's 429 `fair_share_exceeded`. Alone, a key is never slowed; with
isolation by account, the key is the account header the gateway's authentication set.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager as AsyncContextManager
from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from harness.busy import kept_asking
from harness.extproc_gateway import Gateway, GatewayPolicyFactory, body_msg, headers_msg
from harness.waiting import eventually
from promptcache.contract import IsolationMode
from promptcache.gateway.server import RunningGatewayPolicy
from promptcache.tenancy import errors
from promptcache.tenancy.fair_share import MAX_WAITERS
from promptcache.tenancy.shares import identity_key

SECRET = b"h" * 32
RATE = 64 * 1024
KEY = "x-prompt-cache-isolation-key"
SMALL = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
DENSE = json.dumps({"model": "m", "prompt": [1] * 3000}).encode()
"""About 150 KiB of parse: 1 s of burst and ~1.4 s of debt at `RATE`."""
HEAVY = json.dumps({"model": "m", "prompt": [1] * 9000}).encode()
"""About 450 KiB of parse: ~6 s of debt, so the waiters still wait however slowly
the machine lets the test line them up."""
MODES = [IsolationMode.SHARED, IsolationMode.PER_KEY, IsolationMode.REQUIRED]
GatewayFor = Callable[[RunningGatewayPolicy], Gateway]


def decided(responses: list[Any]) -> bool:
    return any(r.WhichOneof("response") == "request_body" for r in responses)


async def ask_step(gateway: Gateway, headers: dict[str, str], body: bytes) -> list[Any]:
    responses: list[Any] = await gateway.exchange(headers_msg(headers), body_msg(body))
    return responses


def another_tenant(
    gateway: Gateway, headers: dict[str, str] | None = None
) -> AsyncContextManager[list[float]]:
    """Another tenant asking throughout the block (the step is contended), timed."""

    async def ask() -> None:
        assert decided(await ask_step(gateway, headers or {KEY: "b"}, SMALL))

    return kept_asking(ask)


@pytest.mark.parametrize("mode", MODES)
async def test_a_key_over_its_share_waits_and_the_others_do_not(
    make_gateway_policy: GatewayPolicyFactory, gateway_for: GatewayFor, mode: IsolationMode
) -> None:
    shim = await make_gateway_policy(
        isolation_mode=mode, secret=SECRET, fair_share_bytes_per_second=RATE
    )
    async with another_tenant(gateway_for(shim)) as b_latencies:
        a = gateway_for(shim)
        assert decided(await ask_step(a, {KEY: "a"}, DENSE))
        owed = shim.servicer.share.owed_seconds(
            identity_key(account=None, isolation_key="a", credential="", source="")
        )
        assert owed > 0.8, owed
        before_wait = len(b_latencies)
        started = time.monotonic()
        assert decided(await ask_step(a, {KEY: "a"}, SMALL))
        waited = time.monotonic() - started
        assert waited >= owed - 0.2, (waited, owed)
        assert len(b_latencies) - before_wait >= 5
        assert max(b_latencies) < 1.0, max(b_latencies)
        metrics = shim.servicer.metrics
        assert metrics.value("promptcache_gateway_policy_fair_share_waits_total") == 1


async def test_a_key_alone_is_never_held_back(
    make_gateway_policy: GatewayPolicyFactory, gateway_for: GatewayFor
) -> None:
    shim = await make_gateway_policy(
        isolation_mode=IsolationMode.PER_KEY, secret=SECRET, fair_share_bytes_per_second=RATE
    )
    a = gateway_for(shim)
    started = time.monotonic()
    for _ in range(6):
        assert decided(await ask_step(a, {KEY: "a"}, DENSE))
    assert time.monotonic() - started < 10
    assert shim.servicer.metrics.value("promptcache_gateway_policy_fair_share_waits_total") == 0


async def test_past_the_waiters_cap_a_key_gets_429(
    make_gateway_policy: GatewayPolicyFactory, gateway_for: GatewayFor
) -> None:
    shim = await make_gateway_policy(
        isolation_mode=IsolationMode.PER_KEY, secret=SECRET, fair_share_bytes_per_second=RATE
    )
    async with another_tenant(gateway_for(shim)):
        assert decided(await ask_step(gateway_for(shim), {KEY: "a"}, HEAVY))
        a = identity_key(account=None, isolation_key="a", credential="", source="")
        waiting = [
            asyncio.create_task(ask_step(gateway_for(shim), {KEY: "a"}, SMALL))
            for _ in range(MAX_WAITERS)
        ]
        await eventually(
            lambda: shim.servicer.share.waiting(a),
            "shim.servicer.share.waiting(a) == MAX_WAITERS",
            until=lambda got: got == MAX_WAITERS,
            within_s=30,
        )
        (only,) = await ask_step(gateway_for(shim), {KEY: "a"}, SMALL)
        answer = only.immediate_response
        assert answer.status.code == 429
        assert json.loads(answer.body)["error"]["code"] == errors.FAIR_SHARE_EXCEEDED
        headers = {h.header.key: h.header.raw_value for h in answer.headers.set_headers}
        assert int(headers["retry-after"]) >= 1
        assert all(decided(r) for r in await asyncio.gather(*waiting))
        assert shim.servicer.budget.used == 0


async def test_with_accounts_the_key_is_the_account(
    make_gateway_policy: GatewayPolicyFactory, gateway_for: GatewayFor
) -> None:
    """Two requests of one account under different isolation keys share one debt."""
    shim = await make_gateway_policy(
        isolation_mode=IsolationMode.PER_KEY,
        secret=SECRET,
        identity_header="x-account",
        fair_share_bytes_per_second=RATE,
    )
    async with another_tenant(gateway_for(shim), {"x-account": "someone-else"}):
        assert decided(await ask_step(gateway_for(shim), {"x-account": "acme", KEY: "k1"}, DENSE))
        share = shim.servicer.share
        assert (
            share.owed_seconds(
                identity_key(account=b"acme", isolation_key="", credential="", source="")
            )
            > 0.8
        )
        assert (
            share.owed_seconds(
                identity_key(account=None, isolation_key="k1", credential="", source="")
            )
            == 0
        )


def _raw_headers(extra: list[tuple[str, bytes]]) -> Any:
    """Request headers with values as raw bytes (`headers_msg` encodes text), a body to come."""
    base = [
        (":method", b"POST"),
        (":path", b"/v1/completions"),
        ("content-type", b"application/json"),
    ]
    values = [base_pb2.HeaderValue(key=k, raw_value=v) for k, v in base + extra]
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=values))
    )


@pytest.mark.parametrize(
    "extra",
    [
        [(KEY, b"\xff\xfe-not-utf-8")],
        [("authorization", b"Bearer \xc3\x28")],
        [("content-encoding", b"gzip")],
    ],
    ids=["key-not-utf-8", "token-not-utf-8", "gzip"],
)
async def test_a_head_the_front_refuses_is_refused_before_its_body(
    make_gateway_policy: GatewayPolicyFactory,
    gateway_for: GatewayFor,
    extra: list[tuple[str, bytes]],
) -> None:
    """As the front (`tests/front/test_front_fair_share.py`): a request refused for its
    head gets the front's refusal as soon as its headers arrive, holds no body bytes, and
    leaves no key behind in the meter."""
    shim = await make_gateway_policy(
        isolation_mode=IsolationMode.PER_KEY, secret=SECRET, fair_share_bytes_per_second=RATE
    )
    async with another_tenant(gateway_for(shim)) as b_latencies:
        await eventually(
            lambda: len(b_latencies), "len(b_latencies) > 0", until=lambda got: got > 0, within_s=30
        )  # B's key is in the meter
        remembered = shim.servicer.share.remembered()
        call = gateway_for(shim).open()
        await call.write(_raw_headers(extra))  # no body sent: the answer cannot wait for it
        first = await asyncio.wait_for(call.read(), 10)
        answer = first.immediate_response
        assert answer.status.code in (400, 415), answer
        code = json.loads(answer.body)["error"]["code"]
        assert code in (errors.INVALID_HEADER, errors.UNSUPPORTED_CONTENT_ENCODING), code
        await call.done_writing()
        assert shim.servicer.share.remembered() == remembered
        assert shim.servicer.budget.used == 0

"""No client identity can hold the gateway's policy step while others want some (issue
43), over real gRPC.

The step holds each request's headers and body until the body has ended, charged to its
byte budget. One hostile tenant opens streams that send part of a body and stop (or only
the headers): before shares, two such streams of a few MiB held the rendered budget and
every other tenant got 503 until they closed. Now the attacker, arriving alone, holds at
most all but the reserve (a sixteenth of the budget; the share binds only while another
identity holds something, `tenancy.shares`), the stream into the reserve is refused 429
`tenant_share_exceeded` with `Retry-After`, and a well-behaved tenant's requests are all
decided (forwarded to the picker), each within `SERVED_WITHIN` seconds, while the attack
holds. Once the well-behaved tenant holds something, the attacker cannot take past its
share even where the budget is free. The same with the attack spread over several
isolation keys of one account. With a short body deadline, every stalled stream is
refused 408 when it fires, frees what it held, and is counted.

The step's other direction (the picker's answers) holds nothing of the budget: a request
is released from it once decided, so a gateway that stops reading answers is gRPC's flow
control's business, not a share's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from harness.extproc_gateway import Gateway, GatewayPolicyFactory, body_msg, headers_msg
from harness.waiting import eventually
from promptcache.contract import IsolationMode
from promptcache.gateway.decision import FORWARDED_FOR, step_identity
from promptcache.gateway.server import RunningGatewayPolicy
from promptcache.gateway.settings import GatewayPolicySettings
from promptcache.tenancy.shares import identity_key

SECRET = b"h" * 32
KEY = "x-prompt-cache-isolation-key"
ACCOUNT = "x-account"
N = 8
"""Streams the attack opens: twice what its share of the budget holds."""
PIECE = (1 << 20) - 64
"""What each stalled stream sends of its body: about 1 MiB."""
BUDGET = 8 << 20
"""The step's budget: the attacker's share (half, 4 MiB) holds four pieces; its reserve (a
sixteenth, 512 KiB) leaves an attacker alone seven."""
HELD = 4
"""Pieces in the attacker's share."""
HELD_ALONE = 7
"""Pieces an attacker alone holds: all the budget but the reserve."""
SERVED_WITHIN = 10.0
ASKS = 12
HOLD = 25.0
"""The body deadline while the attack holds: longer than the test (gRPC calls end at 30 s)."""
SMALL = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
GatewayFor = Callable[[RunningGatewayPolicy], Gateway]
Headers = Callable[[int], dict[str, str]]


def one_key(i: int) -> dict[str, str]:
    return {KEY: "mallory"}


def keys_of_one_account(i: int) -> dict[str, str]:
    """A key of its own per stream, one account (the header the gateway's auth sets)."""
    return {KEY: f"mallory-{i}", ACCOUNT: "mallory"}


ATTACKERS: dict[str, Headers] = {"one key": one_key, "keys of one account": keys_of_one_account}


async def _step(make: GatewayPolicyFactory, **overrides: Any) -> RunningGatewayPolicy:
    settings: dict[str, Any] = {
        "isolation_mode": IsolationMode.PER_KEY,
        "identity_header": ACCOUNT,
        "max_body_bytes": 2 << 20,
        "max_buffered_bytes": BUDGET,
        "body_timeout_seconds": HOLD,
        **overrides,
    }
    return await make(secret=SECRET, **settings)


async def stalled(gateway: Gateway, headers: dict[str, str], piece: int) -> Any:
    """A stream that sends its headers and `piece` bytes of body (none: headers only, a
    half-sent request), then nothing."""
    call = gateway.open()
    await call.write(headers_msg(headers))
    if piece:
        await call.write(body_msg(b'{"messages":[' + b" " * (piece - 13), end_of_stream=False))
    return call


async def answered(calls: list[Any], within: float) -> list[Any | None]:
    """Each call's first answer within `within` seconds, or None while it is held. The reads
    still pending are left running, not cancelled (cancelling a read cancels the call, which
    would free what it holds)."""
    reads = [asyncio.ensure_future(call.read()) for call in calls]
    await asyncio.wait(reads, timeout=within)
    return [r.result() if r.done() and r.result() is not grpc.aio.EOF else None for r in reads]


def status_and_code(answer: Any) -> tuple[int, str]:
    immediate = answer.immediate_response
    return immediate.status.code, json.loads(immediate.body)["error"]["code"]


def retry_after(answer: Any) -> str:
    headers = {
        h.header.key: h.header.raw_value for h in answer.immediate_response.headers.set_headers
    }
    return headers["retry-after"].decode()


async def well_behaved(gateway: Gateway) -> list[tuple[bool, float]]:
    """`ASKS` small requests of another tenant, two at a time: (decided, seconds) of each."""

    async def ask() -> tuple[bool, float]:
        started = time.monotonic()
        responses = await gateway.exchange(
            headers_msg({KEY: "alice", ACCOUNT: "alice"}), body_msg(SMALL)
        )
        decided = any(r.WhichOneof("response") == "request_body" for r in responses)
        return decided, time.monotonic() - started

    results: list[tuple[bool, float]] = []
    for _ in range(ASKS // 2):
        results += await asyncio.gather(ask(), ask())
    return results


def _served(results: list[tuple[bool, float]]) -> None:
    assert all(decided for decided, _ in results), results
    assert max(seconds for _, seconds in results) < SERVED_WITHIN, results


@contextlib.asynccontextmanager
async def cancelling(calls: list[Any]) -> AsyncIterator[list[Any]]:
    try:
        yield calls
    finally:
        for call in calls:
            call.cancel()


@pytest.mark.parametrize("attacker", list(ATTACKERS), ids=list(ATTACKERS))
async def test_stalled_bodies_hold_at_most_their_share_of_the_budget_while_others_hold(
    make_gateway_policy: GatewayPolicyFactory, gateway_for: GatewayFor, attacker: str
) -> None:
    step = await _step(make_gateway_policy)
    gateway = gateway_for(step)
    headers = ATTACKERS[attacker]
    budget, metrics = step.servicer.budget, step.servicer.metrics

    def refusals() -> float:
        return metrics.value(
            "promptcache_gateway_policy_tenant_share_refusals_total", resource="memory"
        )

    calls = [await stalled(gateway, headers(i), PIECE) for i in range(N)]
    async with cancelling(calls):
        await eventually(
            refusals,
            "refusals() == N - HELD_ALONE",
            until=lambda got: got == N - HELD_ALONE,
            within_s=30,
        )
        answers = await answered(calls, 5.0)
        refused = [a for a in answers if a is not None]
        assert len(refused) == N - HELD_ALONE, answers
        assert all(status_and_code(a) == (429, "tenant_share_exceeded") for a in refused)
        assert all(retry_after(a) == "1" for a in refused)
        assert budget.used == HELD_ALONE * PIECE  # all but the reserve, no more
        _served(await well_behaved(gateway))

        # once the well-behaved tenant holds part of a body, the attacker, down to its
        # share, is refused every further piece though the budget has room for it
        calls.append(await stalled(gateway, {KEY: "alice", ACCOUNT: "alice"}, 1024))
        await eventually(
            lambda: budget.used,
            "budget.used == HELD_ALONE * PIECE + 1024",
            until=lambda got: got == HELD_ALONE * PIECE + 1024,
            within_s=30,
        )
        held = [call for call, answer in zip(calls, answers, strict=False) if answer is None]
        for call in held[HELD:]:
            call.cancel()
        await eventually(
            lambda: budget.used,
            "budget.used == HELD * PIECE + 1024",
            until=lambda got: got == HELD * PIECE + 1024,
            within_s=30,
        )
        more = [await stalled(gateway, headers(N + i), PIECE) for i in range(2)]
        calls += more
        await eventually(
            refusals,
            "refusals() == N - HELD_ALONE + len(more)",
            until=lambda got: got == N - HELD_ALONE + len(more),
            within_s=30,
        )
        answers = await answered(more, 5.0)
        assert all(
            a is not None and status_and_code(a) == (429, "tenant_share_exceeded") for a in answers
        ), answers
        assert budget.used == HELD * PIECE + 1024
        _served(await well_behaved(gateway))


async def test_a_client_over_its_share_is_refused_on_its_headers_before_any_body(
    make_gateway_policy: GatewayPolicyFactory, gateway_for: GatewayFor
) -> None:
    """A stream whose client, while another client holds some of the budget, would pass its
    share with the body its Content-Length announces is refused on its headers: it never
    has to send (nor the step receive and parse) a body that would be refused. Under the
    hostile load bench each refused retry used to carry 4 MiB. Without a Content-Length
    (nothing announced) it is held until its body comes, as is another client's stream
    announcing as much, and the well-behaved tenant is decided beside them."""
    step = await _step(make_gateway_policy)
    gateway = gateway_for(step)
    budget, metrics = step.servicer.budget, step.servicer.metrics
    calls = [await stalled(gateway, {KEY: "alice", ACCOUNT: "alice"}, 1024)]
    calls += [await stalled(gateway, {KEY: "mallory"}, PIECE) for _ in range(HELD)]
    async with cancelling(calls):
        await eventually(
            lambda: budget.used,
            "budget.used == HELD * PIECE + 1024",
            until=lambda got: got == HELD * PIECE + 1024,
            within_s=30,
        )
        announced = {"content-length": str(PIECE)}
        over = [await stalled(gateway, {KEY: "mallory", **announced}, 0) for _ in range(3)]
        within = [
            await stalled(gateway, {KEY: "mallory"}, 0),
            await stalled(gateway, {KEY: "bob", **announced}, 0),
        ]
        calls += over + within
        answers = await answered(over, 5.0)
        assert all(
            a is not None and status_and_code(a) == (429, "tenant_share_exceeded") for a in answers
        ), answers
        assert all(retry_after(a) == "1" for a in answers if a is not None)
        assert await answered(within, 0.5) == [None, None]  # held, not refused
        assert budget.used == HELD * PIECE + 1024
        assert (
            metrics.value(
                "promptcache_gateway_policy_tenant_share_refusals_total", resource="memory"
            )
            == 3
        )
        _served(await well_behaved(gateway))


async def test_half_sent_requests_hold_nothing_another_tenant_needs(
    make_gateway_policy: GatewayPolicyFactory, gateway_for: GatewayFor
) -> None:
    """Streams that send their headers and no body hold a stream each, no budget: the
    well-behaved tenant is decided beside four times as many as the attack's body streams."""
    step = await _step(make_gateway_policy)
    gateway = gateway_for(step)
    calls = [await stalled(gateway, {KEY: "mallory"}, 0) for _ in range(4 * N)]
    async with cancelling(calls):
        _served(await well_behaved(gateway))
        assert step.servicer.budget.used == 0


async def test_the_body_deadline_frees_every_stalled_stream_and_is_counted(
    make_gateway_policy: GatewayPolicyFactory, gateway_for: GatewayFor
) -> None:
    step = await _step(make_gateway_policy, body_timeout_seconds=1.0)
    gateway = gateway_for(step)
    calls = [await stalled(gateway, {KEY: "mallory"}, PIECE) for _ in range(HELD)]
    calls += [await stalled(gateway, {KEY: "mallory"}, 0) for _ in range(HELD)]
    async with cancelling(calls):
        answers = await answered(calls, 15.0)
        assert all(a is not None and status_and_code(a) == (408, "body_timeout") for a in answers)
        metrics = step.servicer.metrics
        assert (
            metrics.value("promptcache_gateway_policy_deadlines_total", deadline="body") == 2 * HELD
        )
        assert step.servicer.budget.used == 0
        _served(await well_behaved(gateway))


def test_the_step_counts_a_request_under_account_key_credential_or_source() -> None:
    """The account header first (repeated: the first value, as the front reads it), then the
    isolation key, then Authorization, then the source the gateway appended last to
    X-Forwarded-For (what the client wrote there itself comes earlier and is not used)."""
    policy = GatewayPolicySettings(
        isolation_mode=IsolationMode.PER_KEY, identity_header=ACCOUNT
    ).policy()

    def of(*entries: tuple[str, bytes]) -> bytes:
        return step_identity(list(entries), policy)

    def key(**sources: Any) -> bytes:
        return identity_key(
            account=sources.get("account"),
            isolation_key=sources.get("key", b""),
            credential=sources.get("credential", b""),
            source=sources.get("source", b""),
        )

    assert of((ACCOUNT, b"acme"), (ACCOUNT, b"other"), (KEY, b"k")) == key(account=b"acme")
    assert of((KEY, b"k1"), ("authorization", b"Bearer t")) == key(key=b"k1")
    assert of(("authorization", b"Bearer t"), (FORWARDED_FOR, b"1.1.1.1")) == key(
        credential=b"Bearer t"
    )
    spoofed = of((FORWARDED_FOR, b"6.6.6.6, 10.0.0.7"))
    assert spoofed == of((FORWARDED_FOR, b"10.0.0.7")) == key(source=b"10.0.0.7")
    assert of() == key()

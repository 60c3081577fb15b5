"""Fixtures: the real gateway policy step in front of a recording stand-in Endpoint Picker
(`harness.extproc_gateway`), started on kernel-chosen loopback ports."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from harness.extproc_gateway import Gateway, GatewayPolicyFactory, Upstream, start_upstream
from promptcache.gateway.server import RunningGatewayPolicy, start
from promptcache.gateway.settings import GatewayPolicySettings


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    up = await start_upstream()
    try:
        yield up
    finally:
        await up.server.stop(0)


@pytest.fixture
async def make_gateway_policy(upstream: Upstream) -> AsyncIterator[GatewayPolicyFactory]:
    running: list[RunningGatewayPolicy] = []

    async def factory(secret: bytes | None = None, **overrides: Any) -> RunningGatewayPolicy:
        settings = GatewayPolicySettings(
            **{"listen": "127.0.0.1:0", "upstream": upstream.target, **overrides}
        )
        shim = await start(settings, secret)
        running.append(shim)
        return shim

    try:
        yield factory
    finally:
        for shim in running:
            await shim.stop(grace_s=0)
        await _rpc_tasks_ended()


_GRPC_RPC_TASKS = ("_handle_exceptions", "_schedule_rpc_coro")


async def _rpc_tasks_ended() -> None:
    """A server stopped with no grace cancels the RPCs it still runs, but their tasks end
    only when the loop next runs them: a test whose stream the step had just ended could
    return with them pending (the leak guard's error, once in a CI run). Wait for them."""
    current = asyncio.current_task()
    left = [
        t
        for t in asyncio.all_tasks()
        if t is not current and getattr(t.get_coro(), "__qualname__", "") in _GRPC_RPC_TASKS
    ]
    if left:
        await asyncio.wait(left, timeout=10)


@pytest.fixture
async def gateway_for() -> AsyncIterator[Callable[[RunningGatewayPolicy], Gateway]]:
    opened: list[Gateway] = []

    def factory(shim: RunningGatewayPolicy) -> Gateway:
        gw = Gateway(shim.target)
        opened.append(gw)
        return gw

    try:
        yield factory
    finally:
        for gw in opened:
            await gw.close()

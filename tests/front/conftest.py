"""Fixtures for the cache front: a recording stand-in vLLM and fronts in front of it.

Everything listens on 127.0.0.1 with a kernel-chosen port and talks over real
sockets; only the model server is a stand-in (the system boundary).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from harness.front_app import SECRET, Front, MakeFront, start_front_app
from harness.standin import StandinUpstream, start_standin
from promptcache.embeds.cache import PromptEmbedsCache
from promptcache.front.http_server import FrontRunner
from promptcache.front.settings import FrontSettings


@pytest.fixture
async def standin() -> AsyncIterator[tuple[StandinUpstream, str]]:
    upstream = StandinUpstream()
    runner, url = await start_standin(upstream)
    yield upstream, url
    await runner.cleanup()


@pytest.fixture
async def make_front(
    standin: tuple[StandinUpstream, str],
) -> AsyncIterator[MakeFront]:
    runners: list[FrontRunner] = []

    async def make(
        *,
        upstream: str | None = None,
        secret: bytes | None = SECRET,
        cache_bytes: int = 64 << 20,
        **overrides: Any,
    ) -> Front:
        settings = FrontSettings(upstream=upstream or standin[1], **overrides)
        cache = PromptEmbedsCache(cache_bytes)
        runner, url = await start_front_app(
            settings, secret if settings.needs_salt_key else None, cache
        )
        runners.append(runner)
        return Front(url, settings, cache, runner.front.state)

    yield make
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session

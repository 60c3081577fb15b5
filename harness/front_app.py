"""The cache front inside the test's own event loop (not a process: `harness.front_process`
runs one), on a kernel-chosen loopback port, with the handles tests read its state through.
The `make_front` fixture of tests/front builds on it."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

from aiohttp import web

from promptcache.embeds.cache import PromptEmbedsCache
from promptcache.front.http_server import FrontRunner, create_runner
from promptcache.front.settings import FrontSettings
from promptcache.front.state import FrontState

SECRET = b"0123456789abcdef0123456789abcdef"


@dataclasses.dataclass
class Front:
    """A running front: its URL, settings, cache and shared state."""

    url: str
    settings: FrontSettings
    cache: PromptEmbedsCache
    state: FrontState


async def start_front_app(
    settings: FrontSettings, secret: bytes | None, cache: PromptEmbedsCache
) -> tuple[FrontRunner, str]:
    """A front on 127.0.0.1 (port chosen by the kernel): its runner and its URL."""
    runner = create_runner(settings, secret=secret, cache=cache)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


MakeFront = Callable[..., Awaitable[Front]]
"""The `make_front` fixture: settings overrides in, a running `Front` out."""

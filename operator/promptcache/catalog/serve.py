"""Running the responder: the API client, the watch, both servers, until a signal."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from aiohttp import web

from promptcache.catalog.app import SERVER_OPTIONS, Catalog, CatalogServer, health_app
from promptcache.catalog.watch import ResourceCache
from promptcache.controller.kube import Kube, load_config
from promptcache.controller.server import stop_on_signal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CatalogOptions:
    namespaces: tuple[str, ...]
    """Empty: every namespace."""
    bind_address: str
    port: int
    health_port: int


def catalog_of(cache: ResourceCache) -> Catalog:
    return Catalog(
        resources=cache.resources,
        created=cache.created,
        version=lambda: cache.version,
        ready=cache.synced.is_set,
    )


async def start(
    cache: ResourceCache, options: CatalogOptions
) -> tuple[list[web.BaseRunner], asyncio.Task[None]]:
    """The watch task and both servers, started (port 0: any free port)."""
    watching = asyncio.create_task(cache.run(), name="promptcache-catalog-watch")
    runners: list[web.BaseRunner] = []
    serving = web.ServerRunner(CatalogServer(catalog_of(cache), **SERVER_OPTIONS))
    health = web.AppRunner(health_app(cache.synced.is_set), access_log=None)
    for runner, port in ((serving, options.port), (health, options.health_port)):
        await runner.setup()
        await web.TCPSite(runner, options.bind_address, port).start()
        runners.append(runner)
    return runners, watching


async def serve(options: CatalogOptions) -> int:
    kube = Kube(load_config())
    cache = ResourceCache(kube, options.namespaces)
    runners, watching = await start(cache, options)
    stop = stop_on_signal(runners, log)
    try:
        await stop.wait()
        return 0
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
        for runner in runners:
            await runner.cleanup()
        await kube.close()

"""Health and metrics endpoints: `/healthz` and `/readyz` for probes, `/metrics` for Prometheus.

Served by aiohttp on the operator's own event loop, so a `/healthz` answer
proves the loop is not blocked. They run from process start, before the
Lease is won: a standby replica is healthy, just not leading.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from promptcache.controller.metrics import OperatorMetrics
from promptcache.stopping import stop_event


@dataclass
class HealthState:
    leading: bool = False
    operator: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        """Dead when kopf's task ended by itself while we still meant to lead."""
        return not (self.leading and self.operator is not None and self.operator.done())


def _health_app(state: HealthState) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        if state.alive:
            return web.Response(text="ok\n")
        return web.Response(status=503, text="operator stopped\n")

    async def readyz(_: web.Request) -> web.Response:
        role = "leader" if state.leading else "standby"
        return web.Response(text=f"{role}\n")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


def _metrics_app(metrics: OperatorMetrics) -> web.Application:
    async def handler(_: web.Request) -> web.Response:
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", handler)
    return app


async def start_servers(
    host: str, health_port: int, metrics_port: int, state: HealthState, metrics: OperatorMetrics
) -> list[web.AppRunner]:
    """Start both servers (port 0 = any free port); return the runners to clean up."""
    runners = []
    for app, port in ((_health_app(state), health_port), (_metrics_app(metrics), metrics_port)):
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        runners.append(runner)
    return runners


def stop_on_signal(runners: Iterable[web.BaseRunner], log: logging.Logger) -> asyncio.Event:
    """Log where each server listens and return an event set by SIGINT or SIGTERM.

    Both long-running processes of the control plane (the operator and the catalog
    responder) start the same way, so a kubelet's SIGTERM ends either one by the same
    path: the caller's `finally` cleans up, nothing is cut off mid-write."""
    for runner in runners:
        for address in runner.addresses:
            log.info("listening on %s", address)
    return stop_event()

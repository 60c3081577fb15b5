"""Running the operator: client, servers, leader election, then kopf.

Order matters: the health and metrics servers start first (a standby replica
must pass its probes), then the Lease is won, then kopf runs until a signal, or
until the Lease is lost, in which case the process exits non-zero so that
Kubernetes restarts it as a clean standby.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from typing import Any

import aiohttp
import kopf

from promptcache.controller.cache import Caches
from promptcache.controller.handlers import HandlerSettings, build_registry
from promptcache.controller.kube import Kube, by_kind, load_config
from promptcache.controller.leader import LeaderElector, LeadershipLostError
from promptcache.controller.metrics import OperatorMetrics
from promptcache.controller.options import OperatorOptions, ReconcileSettings
from promptcache.controller.reconcile import Reconciler
from promptcache.controller.server import HealthState, start_servers, stop_on_signal
from promptcache.render.names import MANAGED_BY, Component


def dump_tasks() -> None:
    """`kill -USR2 <pid>`: every asyncio task and the chain of awaits it waits in, to
    stderr (USR1 shows only threads, and a stuck reconcile waits in a task)."""
    for task in asyncio.all_tasks():
        print(f"--- {task.get_name()}", file=sys.stderr)
        coro: Any = task.get_coro()
        while coro is not None:
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
            if frame is not None:
                code = frame.f_code
                print(f"    {code.co_filename}:{frame.f_lineno} {code.co_name}", file=sys.stderr)
            coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
    sys.stderr.flush()


def build_caches(kube: Kube, namespaces: tuple[str, ...], metrics: OperatorMetrics) -> Caches:
    """The informers the reconciler reads: resources, children (label-selected) and the
    model-server pods (by their selector labels)."""
    return Caches(
        kube,
        namespaces,
        resource=by_kind("PromptCacheDeployment"),
        pod=by_kind("Pod"),
        child_selector=f"app.kubernetes.io/managed-by={MANAGED_BY}",
        pod_selector=",".join(
            f"{k}={v}"
            for k, v in (
                ("app.kubernetes.io/name", "promptcache"),
                ("app.kubernetes.io/component", Component.MODEL_SERVER),
            )
        ),
        on_error=lambda reason: metrics.watch_errors.labels(reason).inc(),
    )


log = logging.getLogger(__name__)

EXIT_LOST_LEADERSHIP = 3
LEADER_TIMEOUT_S = 5.0


async def _wait_or_stop(coro: asyncio.Future[None], stop: asyncio.Event) -> bool:
    """Await `coro` unless `stop` is set first; True when `coro` finished."""
    stopper: asyncio.Future[None] = asyncio.ensure_future(_until(stop))
    done, _ = await asyncio.wait({coro, stopper}, return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    if coro in done:
        coro.result()
        return True
    coro.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await coro
    return False


async def _until(event: asyncio.Event) -> None:
    await event.wait()


async def serve(options: OperatorOptions) -> int:
    config = load_config()
    metrics = OperatorMetrics()
    kube = Kube(config, on_request=metrics.count_request, on_throttle=metrics.throttled)
    http = aiohttp.ClientSession()
    namespaces = () if options.all_namespaces else options.namespaces
    reconciler = Reconciler(
        kube,
        build_caches(kube, namespaces, metrics),
        http,
        metrics,
        ReconcileSettings(
            scrape_port=options.scrape_port,
            scrape_timeout_s=options.scrape_timeout_s,
            status_window_s=options.status_window_s,
            defaults=options.defaults,
            scrape_interval_s=options.resync_s / 2,
        ),
    )
    state = HealthState()
    runners = await start_servers(
        options.bind_address, options.health_port, options.metrics_port, state, metrics
    )
    stop = stop_on_signal(runners, log)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR2, dump_tasks)
    elector = (
        LeaderElector(
            # Its own client, with a timeout well inside the renew deadline: a renewal
            # must not wait behind the reconciler's requests or for a minute.
            Kube(config, on_request=metrics.count_request, timeout_s=LEADER_TIMEOUT_S),
            options.lease_namespace,
            options.lease_name,
            options.identity,
            lease_s=options.lease_s,
            renew_s=max(1.0, options.lease_s / 3),
        )
        if options.leader_election
        else None
    )
    code = 0
    try:
        if elector is not None and not await _wait_or_stop(
            asyncio.ensure_future(elector.acquire()), stop
        ):
            return 0
        state.leading = True
        metrics.leader.set(1)
        registry = build_registry(
            reconciler,
            HandlerSettings(
                resync_s=options.resync_s,
                posting=options.events,
                instance=options.identity,
            ),
        )
        operator = asyncio.create_task(
            kopf.operator(
                registry=registry,
                clusterwide=options.all_namespaces,
                namespaces=list(options.namespaces),
                standalone=True,
                stop_flag=stop,
            )
        )
        state.operator = operator
        waiters: set[asyncio.Task[None]] = {operator}
        holder = asyncio.create_task(elector.hold()) if elector is not None else None
        if holder is not None:
            waiters.add(holder)
        done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        if holder is not None and holder in done:
            error = holder.exception()
            log.error(
                "stopping: %s", error if isinstance(error, LeadershipLostError) else "lease lost"
            )
            code = EXIT_LOST_LEADERSHIP
            stop.set()
            state.leading = False
            await operator
        elif holder is not None:
            holder.cancel()
        operator.result()
        return code
    finally:
        metrics.leader.set(0)
        if elector is not None and state.leading and code == 0:
            await elector.release()
        if elector is not None:
            await elector.kube.close()
        await http.close()
        await kube.close()
        for runner in runners:
            await runner.cleanup()

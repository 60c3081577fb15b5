"""The model-server pods as the status reads them: why any is not ready, what the ready
ones report of their prefix cache (lifetime and over a recent window), and which adapters
each serves.

It holds what outlives a reconcile: each resource's hit window, its last scrape (a burst
of child events during a rollout reuses it instead of scraping again) and the adapters
each engine start listed (asked once per start). Pods come from the pod informer; only the
pods themselves are asked, over HTTP, never the API server.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import aiohttp

from promptcache.controller.adapters import (
    ServedModelsCache,
    adapter_failures,
    adapter_status,
    ready_pods,
)
from promptcache.controller.cache import Caches
from promptcache.controller.diagnose import diagnose
from promptcache.controller.kube import by_kind
from promptcache.controller.ladder import Rungs, rungs
from promptcache.controller.metrics import OperatorMetrics
from promptcache.controller.scope import Scope
from promptcache.controller.scrape import (
    LADDER,
    PodMetrics,
    ScrapedPrefixCache,
    aggregate,
    ready_pod_ips,
    scrape_by_ip,
    selected,
    served_models_by_ip,
)
from promptcache.controller.window import HitWindow, WindowedRatio
from promptcache.render.names import Component, selector_labels

if TYPE_CHECKING:
    from promptcache.controller.options import ReconcileSettings

POD = by_kind("Pod")
SCRAPES_AT_ONCE = 16
"""Pods scraped (or asked for their models) at once, across all resources."""


class PodObserver:
    """Per-resource observation state and the scrapes that fill it."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        caches: Caches,
        metrics: OperatorMetrics,
        settings: ReconcileSettings,
    ) -> None:
        self.http = http
        self.caches = caches
        self.metrics = metrics
        self.settings = settings
        self.scrape_gate = asyncio.Semaphore(SCRAPES_AT_ONCE)
        self.windows: dict[str, HitWindow] = {}
        self.ladders: dict[str, HitWindow] = {}
        """Per resource: the fronts' ladder counters inside the window (`controller.ladder`)."""
        self.scraped: dict[str, tuple[float, dict[str, PodMetrics]]] = {}
        """Per resource: when its pods were last scraped and what they said, by IP."""
        self.served = ServedModelsCache()

    def _window(self) -> HitWindow:
        return HitWindow(window_s=self.settings.status_window_s)

    def forget(self, uid: str) -> None:
        self.windows.pop(uid, None)
        self.ladders.pop(uid, None)
        self.scraped.pop(uid, None)
        self.served.forget(uid)

    async def observe(self, scope: Scope) -> tuple[ScrapedPrefixCache, WindowedRatio]:
        """Why pods are not ready (into `obs.pods`); the pods' prefix-cache reports, lifetime
        and over the recent window."""
        names = scope.names
        informer = await self.caches.synced(POD)
        pods = selected(
            informer.by_instance(names.namespace, names.instance),
            selector_labels(names, Component.MODEL_SERVER),
        )
        scope.obs.pods = diagnose(pods)
        ips = ready_pod_ips(pods)
        await self.observe_adapters(scope, pods)
        if not ips:
            return ScrapedPrefixCache(), WindowedRatio(None, 0.0, 0.0)
        window = self.windows.setdefault(scope.uid, self._window())
        last = self.scraped.get(scope.uid)
        if (
            last is not None
            and time.monotonic() - last[0] < self.settings.scrape_interval_s
            and set(last[1]) == set(ips)
        ):
            return aggregate(list(last[1].values())), window.ratio()
        started = time.monotonic()
        results = await scrape_by_ip(
            self.http,
            ips,
            port=self.settings.scrape_port,
            timeout_s=self.settings.scrape_timeout_s,
            limit=self.scrape_gate,
        )
        self.metrics.scrape_duration.observe(time.monotonic() - started)
        self.metrics.scrapes.labels("ok").inc(len(results))
        self.metrics.scrapes.labels("failed").inc(len(ips) - len(results))
        self.scraped[scope.uid] = (started, results)
        now = time.monotonic()
        recent = window.add(now, {ip: (m.hits, m.queries) for ip, m in results.items()})
        ladder = self.ladders.setdefault(scope.uid, self._window())
        ladder.record(now, {ip: m.ladder for ip, m in results.items()})
        return aggregate(list(results.values())), recent

    def ladder(self, scope: Scope) -> Rungs | None:
        """The hit-ratio ladder over the recent window (None: too few predicted requests)."""
        window = self.ladders.get(scope.uid)
        if window is None:
            return None
        increases, span = window.increases(len(LADDER))
        return rungs(increases, span)

    async def observe_adapters(self, scope: Scope, pods: list[dict[str, Any]]) -> None:
        """Per adapter: the ready pods that serve it (each engine start's `/v1/models`, read
        once), and what stopped engines said of it (termination messages, no request)."""
        adapters = scope.pcd.spec.model.adapters
        if not adapters:
            self.served.forget(scope.uid)
            return
        ready = ready_pods(pods)
        unknown = [p for p in ready if self.served.get(scope.uid, p.key) is None]
        fetched = await served_models_by_ip(
            self.http,
            [p.ip for p in unknown],
            port=self.settings.scrape_port,
            timeout_s=self.settings.scrape_timeout_s,
            limit=self.scrape_gate,
        )
        known: dict[tuple[str, int], dict[str, str]] = {}
        served: dict[str, dict[str, str]] = {}
        for p in ready:
            models = self.served.get(scope.uid, p.key) or fetched.get(p.ip)
            if models is not None:
                known[p.key] = models
                # by the source the pod was started with: vLLM's `root` is that path as
                # the engine resolved it, which need not be the string of the spec
                served[p.ip] = {n: p.sources.get(n, root) for n, root in models.items()}
        self.served.replace(scope.uid, known)
        scope.obs.adapters = adapter_status(adapters, served, adapter_failures(pods, adapters))

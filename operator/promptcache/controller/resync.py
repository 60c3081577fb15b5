"""The periodic resync: level-triggered, independent of any watch, no finalizer.

Every `period_s` the resyncer reconciles every PromptCacheDeployment it serves
(drift, status, metrics scrape), reading them from the resource informer
(`cache.py`: one LIST, then a WATCH that resumes from its resourceVersion, so no
event is missed and no request is sent per period); a poke (one of a resource's
Deployments changed, or any of its children was deleted) reconciles that one
resource after a short debounce. It is one task for all resources, not a kopf
daemon per resource: kopf gives every object with a daemon a finalizer, which
would block deletion (and namespace deletion) whenever the operator is down, and
cost a write per resource.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from promptcache.controller.errors import ApiError
from promptcache.controller.kube import by_kind
from promptcache.controller.reconcile import Reconciler
from promptcache.controller.scope import Outcome

log = logging.getLogger(__name__)
PCD = by_kind("PromptCacheDeployment")


class Resyncer:
    def __init__(
        self,
        reconciler: Reconciler,
        *,
        period_s: float,
        debounce_s: float = 1.0,
        concurrency: int = 8,
        on_outcome: Callable[[Mapping[str, Any], Outcome], Awaitable[None]] | None = None,
    ) -> None:
        self.reconciler = reconciler
        self.period_s = period_s
        self.debounce_s = debounce_s
        self.on_outcome = on_outcome
        self._gate = asyncio.Semaphore(concurrency)
        self._wake = asyncio.Event()
        self._poked: set[tuple[str, str]] = set()
        self._failing: set[str] = set()

    def poke(self, namespace: str, name: str) -> None:
        self._poked.add((namespace, name))
        self._wake.set()

    def requeue(self, body: Mapping[str, Any], outcome: Outcome) -> None:
        """Poke the resource again when its reconcile asked to be run again soon."""
        if outcome.requeue_after_s is None:
            return
        meta = body.get("metadata", {})
        asyncio.get_running_loop().call_later(
            outcome.requeue_after_s, self.poke, str(meta.get("namespace")), str(meta.get("name"))
        )

    async def _list(self) -> list[dict[str, Any]]:
        informer = await self.reconciler.caches.synced(PCD)
        return list(informer.items())

    async def _one(self, body: dict[str, Any]) -> None:
        meta = body.get("metadata", {})
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        async with self._gate:
            try:
                outcome = await self.reconciler.reconcile(body, trigger="resync")
            except (ApiError, OSError) as error:
                if key not in self._failing:
                    log.warning("resync of %s failed: %s (retried every resync)", key, error)
                self._failing.add(key)
                return
            except Exception:  # a bug must not end the resync of every other resource
                log.exception("resync of %s failed", key)
                return
        if key in self._failing:
            log.info("resync of %s recovered", key)
            self._failing.discard(key)
        self.requeue(body, outcome)
        if self.on_outcome is not None:
            await self.on_outcome(body, outcome)

    async def run(self) -> None:
        """Forever (until cancelled): full resync every period, pokes in between.

        Each full LIST sets `promptcache_resources` (what this replica serves); 0 once it
        stops (a standby serves nothing)."""
        try:
            await self._loop()
        finally:
            self.reconciler.metrics.managed.set(0)

    async def _loop(self) -> None:
        next_full = time.monotonic() + self.period_s
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), max(0.0, next_full - time.monotonic()))
                await asyncio.sleep(self.debounce_s)  # a rollout's burst of events: one reconcile
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                if time.monotonic() >= next_full:
                    next_full = time.monotonic() + self.period_s
                    self._poked.clear()
                    bodies = await self._list()
                    self.reconciler.metrics.managed.set(len(bodies))
                    for kind, (count, size) in self.reconciler.caches.sizes().items():
                        self.reconciler.metrics.cache_objects.labels(kind).set(count)
                        self.reconciler.metrics.cache_bytes.labels(kind).set(size)
                else:
                    keys, self._poked = self._poked, set()
                    informer = await self.reconciler.caches.synced(PCD)
                    fetched = [informer.get(ns, name) for ns, name in sorted(keys)]
                    bodies = [b for b in fetched if b is not None]
            except (ApiError, OSError) as error:
                log.warning("listing PromptCacheDeployments failed: %s", error)
                continue
            await asyncio.gather(*(self._one(body) for body in bodies))

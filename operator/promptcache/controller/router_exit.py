"""The router-map phase: a body-based router mapping leaves the router before it goes.

bbr v1.5.0 never sees a deleted mapping ConfigMap, so a mapping the resource no longer
renders, or one whose resource is being deleted, is first unlabelled, left to settle and
only then released and deleted (the steps are planned, purely, in `router_map.py`). The
resource holds `MAPPING_FINALIZER` while it renders a mapping, so its deletion waits for
this. The mapping is read from the ConfigMap informer, never with a request.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from promptcache.api import KIND
from promptcache.controller.cache import Caches
from promptcache.controller.children import controller_uid
from promptcache.controller.errors import ApiError, NotFoundError
from promptcache.controller.kube import Kube, by_kind
from promptcache.controller.router_map import hold_finalizer, plan_exit, release_finalizer
from promptcache.controller.scope import Outcome, Scope
from promptcache.render import Names

CONFIG_MAP = by_kind("ConfigMap")
PCD_KIND = by_kind(KIND)


class RouterExit:
    """The phase, with the API client it writes through and the cache it reads."""

    def __init__(self, kube: Kube, caches: Caches) -> None:
        self.kube = kube
        self.caches = caches

    async def phase(self, scope: Scope) -> None:
        """The body-based router's mapping (controller/router_map.py): the resource holds
        `MAPPING_FINALIZER` while it renders one; a mapping it no longer renders, or one
        being deleted, leaves the router's map (unlabelled, settled) before it goes."""
        names = scope.names
        wanted = scope.plan.renders("ConfigMap", names.model_map)
        if wanted:
            await self._patch_resource(scope.raw, hold_finalizer(scope.raw), scope.outcome)
        if scope.fresh:
            return
        live = (await self.caches.synced(CONFIG_MAP)).get(names.namespace, names.model_map)
        if live is not None and controller_uid(live) != scope.uid:
            live = None  # not this resource's: not ours to take out
        out = await self._exit_mapping(names.namespace, live, wanted, scope.outcome)
        if out and not wanted:
            await self._patch_resource(scope.raw, release_finalizer(scope.raw), scope.outcome)

    async def leave(self, raw: dict[str, Any], outcome: Outcome) -> None:
        """A resource being deleted: its mapping leaves the router, then it may go."""
        meta = raw["metadata"]
        names = Names(instance=str(meta["name"]), namespace=str(meta["namespace"]))
        live = (await self.caches.synced(CONFIG_MAP)).get(names.namespace, names.model_map)
        if live is not None and controller_uid(live) != str(meta["uid"]):
            live = None
        if await self._exit_mapping(names.namespace, live, False, outcome):
            await self._patch_resource(raw, release_finalizer(raw), outcome)

    async def _exit_mapping(
        self,
        namespace: str,
        live: Mapping[str, Any] | None,
        wanted: bool,
        outcome: Outcome,
    ) -> bool:
        """One step of a mapping's way out; True once the router no longer maps it."""
        step = plan_exit(live, wanted=wanted, now=datetime.datetime.now(datetime.UTC))
        if live is None:
            return step.done
        name = str(live["metadata"]["name"])
        try:
            for ops in step.patches:
                await self.kube.patch_json(CONFIG_MAP, namespace, name, ops)
            if step.delete:
                await self.kube.delete(CONFIG_MAP, namespace, name)
        except NotFoundError:
            return True
        except ApiError as error:
            if error.transient or error.code not in (409, 422):
                raise
            outcome.requeue(1.0)  # it changed meanwhile: read again
            return False
        if step.requeue_after_s is not None:
            outcome.requeue(step.requeue_after_s)
        return step.done

    async def _patch_resource(
        self, raw: Mapping[str, Any], ops: list[dict[str, Any]] | None, outcome: Outcome
    ) -> None:
        """A conditional patch of the resource's own metadata (its finalizers)."""
        if ops is None:
            return
        meta = raw["metadata"]
        try:
            await self.kube.patch_json(PCD_KIND, meta["namespace"], meta["name"], ops)
        except NotFoundError:
            return
        except ApiError as error:
            if error.transient or error.code not in (409, 422):
                raise
            outcome.requeue(1.0)

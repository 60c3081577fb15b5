"""The kopf handlers, registered into a registry built at start-up (never at import).

- create / update / resume: reconcile now; a transient API failure becomes
  `kopf.TemporaryError` so kopf retries with back-off.
- the resyncer (resync.py, one task started at startup): the periodic drift/status
  check of every resource, woken early when one of its Deployments changes or one
  of its children is deleted (seen by the child informers of cache.py, started with
  it: they watch label-selected, where a kopf event handler would watch every
  Deployment of the cluster).
- delete (optional: no kopf finalizer): children go with the garbage collector via
  their ownerReferences; the handler only forgets in-memory state, and pokes a resource
  that a router mapping still holds (its own finalizer, controller/router_map.py).
- one startup handler holds every kopf setting.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from promptcache.api import GROUP, PLURAL, VERSION
from promptcache.api.status import ConditionType
from promptcache.contract.router import MAPPING_FINALIZER
from promptcache.controller.children import owning_resource
from promptcache.controller.diagnose import NOT_READY_WARNINGS
from promptcache.controller.errors import ApiError, TooManyRequestsError
from promptcache.controller.events import post_event
from promptcache.controller.kube import Kube
from promptcache.controller.options import DEFAULT_MAX_CONCURRENT, DEFAULT_RESYNC_SECONDS
from promptcache.controller.reconcile import Reconciler
from promptcache.controller.resync import Resyncer
from promptcache.controller.scope import Outcome

log = logging.getLogger(__name__)

ANNOTATION_PREFIX = GROUP
DEBOUNCE_S = 1.0
"""A burst of child events (a rollout) becomes one reconcile."""


@dataclass
class HandlerSettings:
    resync_s: float = DEFAULT_RESYNC_SECONDS
    debounce_s: float = DEBOUNCE_S
    posting: bool = True
    instance: str = field(
        default_factory=lambda: os.environ.get("POD_NAME") or socket.gethostname()
    )


async def _post_events(
    kube: Kube, instance: str, body: Mapping[str, Any], outcome: Outcome
) -> None:
    for cond in outcome.transitions:
        bad = (
            (cond["type"] == ConditionType.DEGRADED and cond["status"] == "True")
            or (cond["type"] == ConditionType.GATEWAY_READY and cond["status"] == "False")
            or (cond["type"] == ConditionType.READY and cond["reason"] in NOT_READY_WARNINGS)
        )
        await post_event(
            kube,
            body,
            type_="Warning" if bad else "Normal",
            reason=cond["reason"],
            message=f"{cond['type']}={cond['status']}: {cond.get('message', '')}",
            instance=instance,
        )


def build_registry(  # noqa: PLR0915, C901 - one small closure per handler, kept together
    reconciler: Reconciler, options: HandlerSettings
) -> kopf.OperatorRegistry:
    """Every handler, bound to one reconciler; kopf.operator(registry=...) runs them."""
    registry = kopf.OperatorRegistry()
    tasks: list[asyncio.Task[None]] = []

    async def events(body: Mapping[str, Any], outcome: Outcome) -> None:
        if options.posting:
            await _post_events(reconciler.kube, options.instance, body, outcome)

    resyncer = (
        Resyncer(
            reconciler,
            period_s=options.resync_s,
            debounce_s=options.debounce_s,
            on_outcome=events,
        )
        if options.resync_s > 0
        else None
    )
    resource = (GROUP, VERSION, PLURAL)

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # Progress and the last-handled spec go to annotations: the status schema is the
        # operator's own, and unknown status fields (kopf's) would be pruned by the API server.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
            prefix=ANNOTATION_PREFIX
        )
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
        )
        settings.persistence.finalizer = f"{ANNOTATION_PREFIX}/finalizer"
        # Events are posted by events.py (from every reconcile path); kopf posts none.
        settings.posting.enabled = False
        # One replica acts through the Lease (leader.py); kopf's peering stays off.
        settings.peering.standalone = True
        # Resources are known up front; no CRD scanning (and no RBAC on CRDs) needed.
        settings.scanning.disabled = True
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.watching.connect_timeout = 10
        settings.networking.request_timeout = 60
        settings.execution.max_workers = 4  # only for sync handlers; ours are all async
        # kopf keeps one worker task per object with pending events, and a worker lingers
        # `idle_timeout` after its last event. The reconciler admits DEFAULT_MAX_CONCURRENT at
        # once anyway; the limit only bounds the bodies held, and with kopf's 5 s linger a
        # limit of 64 would cap creations and restarts at ~13 resources per second.
        settings.queueing.worker_limit = 16 * DEFAULT_MAX_CONCURRENT
        settings.queueing.idle_timeout = 1.0
        # Started here so they run in kopf's context (kopf.event needs it) and only while
        # kopf runs, which is only while this replica leads.
        reconciler.caches.on_child_change = child_changed
        reconciler.caches.start()
        if resyncer is not None:
            tasks.append(asyncio.create_task(resyncer.run(), name="promptcache-resync"))

    @kopf.on.cleanup(registry=registry)
    async def stop_resync(**_: Any) -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await reconciler.caches.stop()

    def child_changed(kind: str, event: str, body: Mapping[str, Any]) -> None:
        """A Deployment changed (a rollout, a hand edit) or any child went: reconcile its
        owner soon (debounced). Other changes wait for the resync."""
        if event != "DELETED" and kind != "Deployment":
            return
        owner = owning_resource(body)
        if owner is not None and resyncer is not None:
            resyncer.poke(str((body.get("metadata") or {}).get("namespace")), owner)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A private registry has none of kopf's default login handlers: in-cluster
        # ServiceAccount first, then KUBECONFIG, the same order as the operator's own client.
        info = kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
        return info

    async def _reconcile(body: kopf.Body, trigger: str) -> None:
        try:
            outcome = await reconciler.reconcile(body, trigger=trigger)
        except TooManyRequestsError as error:
            raise kopf.TemporaryError(str(error), delay=error.retry_after_s or 10) from error
        except ApiError as error:
            if error.transient:
                raise kopf.TemporaryError(str(error), delay=10) from error
            raise kopf.TemporaryError(str(error), delay=30) from error
        except OSError as error:
            raise kopf.TemporaryError(f"API server unreachable: {error}", delay=10) from error
        if resyncer is not None:
            resyncer.requeue(body, outcome)
        await events(body, outcome)

    @kopf.on.resume(*resource, registry=registry)
    async def on_resume(body: kopf.Body, **_: Any) -> None:
        await _reconcile(body, "resume")

    @kopf.on.create(*resource, registry=registry)
    async def on_create(body: kopf.Body, retry: int = 0, **_: Any) -> None:
        # Only the first attempt may skip reading the children (none can exist yet); a
        # retry after a failed apply reads them, and applies only what is missing.
        await _reconcile(body, "create" if retry == 0 else "create-retry")

    @kopf.on.update(*resource, registry=registry)
    async def on_update(body: kopf.Body, **_: Any) -> None:
        await _reconcile(body, "update")

    @kopf.on.delete(*resource, registry=registry, optional=True)
    async def on_delete(body: kopf.Body, meta: kopf.Meta, **_: Any) -> None:
        reconciler.forget(str(meta.get("uid")))
        if MAPPING_FINALIZER in (meta.get("finalizers") or []) and resyncer is not None:
            # held until its router mapping has left the router (router_map.py)
            resyncer.poke(str(meta.get("namespace")), str(meta.get("name")))
            return
        log.info("%s/%s deleted; its children go with it", meta.get("namespace"), meta.get("name"))

    return registry

"""The kopf handlers, registered into a registry built at start-up (never at import).

- create / update / resume: reconcile now; a transient API failure becomes
  `kopf.TemporaryError` so kopf retries with back-off.
- a daemon per resource: the periodic resync (drift, status, metrics scrape),
  woken early when one of its Deployments changes (readiness, a hand edit).
- delete (optional: no finalizer): children go with the garbage collector via
  their ownerReferences; the handler only forgets in-memory state.
- an event handler on Deployments managed by promptcache: pokes the owner's
  daemon. It never writes.
- one startup handler holds every kopf setting.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import kopf

from promptcache.api import GROUP, PLURAL, VERSION
from promptcache.api.status import ConditionType
from promptcache.controller.children import owning_resource
from promptcache.controller.kube import ApiError
from promptcache.controller.reconcile import Outcome, Reconciler
from promptcache.render.names import MANAGED_BY

log = logging.getLogger(__name__)

ANNOTATION_PREFIX = "serving.promptcache.io"
DEBOUNCE_S = 1.0
"""A burst of child events (a rollout) becomes one reconcile."""


@dataclass
class HandlerSettings:
    resync_s: float = 60.0
    debounce_s: float = DEBOUNCE_S
    posting: bool = True
    instance: str = field(
        default_factory=lambda: os.environ.get("POD_NAME") or socket.gethostname()
    )


@dataclass
class Pokes:
    """One wake-up event per resource, shared by the child watcher and the daemon."""

    events: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)

    def get(self, namespace: str, name: str) -> asyncio.Event:
        return self.events.setdefault((namespace, name), asyncio.Event())

    def poke(self, namespace: str, name: str) -> None:
        event = self.events.get((namespace, name))
        if event is not None:
            event.set()

    def forget(self, namespace: str, name: str) -> None:
        self.events.pop((namespace, name), None)


def _post_events(body: kopf.Body, outcome: Outcome) -> None:
    for cond in outcome.transitions:
        bad = (cond["type"] == ConditionType.DEGRADED and cond["status"] == "True") or (
            cond["type"] == ConditionType.GATEWAY_READY and cond["status"] == "False"
        )
        message = f"{cond['type']}={cond['status']}: {cond.get('message', '')}"
        kopf.event(
            body, type="Warning" if bad else "Normal", reason=cond["reason"], message=message
        )


def build_registry(  # noqa: PLR0915 - one closure per handler, kept together
    reconciler: Reconciler, options: HandlerSettings, pokes: Pokes | None = None
) -> kopf.OperatorRegistry:
    """Every handler, bound to one reconciler; kopf.operator(registry=...) runs them."""
    registry = kopf.OperatorRegistry()
    pokes = pokes or Pokes()
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
        settings.posting.enabled = options.posting
        settings.posting.reporting_component = "promptcache-operator"
        settings.posting.reporting_instance = options.instance
        settings.posting.level = logging.INFO
        settings.posting.loggers = False  # only explicit kopf.event() calls: no event per log line
        # One replica acts through the Lease (leader.py); kopf's peering stays off.
        settings.peering.standalone = True
        # Resources are known up front; no CRD scanning (and no RBAC on CRDs) needed.
        settings.scanning.disabled = True
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.watching.connect_timeout = 10
        settings.networking.request_timeout = 60
        settings.execution.max_workers = 4  # only for sync handlers; ours are all async

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A private registry has none of kopf's default login handlers: in-cluster
        # ServiceAccount first, then KUBECONFIG, the same order as the operator's own client.
        info = kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
        return info

    async def _reconcile(body: kopf.Body, trigger: str) -> None:
        try:
            outcome = await reconciler.reconcile(body, trigger=trigger)
        except ApiError as error:
            if error.transient:
                raise kopf.TemporaryError(str(error), delay=10) from error
            raise kopf.TemporaryError(str(error), delay=30) from error
        except OSError as error:
            raise kopf.TemporaryError(f"API server unreachable: {error}", delay=10) from error
        _post_events(body, outcome)

    @kopf.on.resume(*resource, registry=registry)
    async def on_resume(body: kopf.Body, **_: Any) -> None:
        await _reconcile(body, "resume")

    @kopf.on.create(*resource, registry=registry)
    async def on_create(body: kopf.Body, **_: Any) -> None:
        await _reconcile(body, "create")

    @kopf.on.update(*resource, registry=registry)
    async def on_update(body: kopf.Body, **_: Any) -> None:
        await _reconcile(body, "update")

    @kopf.on.delete(*resource, registry=registry, optional=True)
    async def on_delete(body: kopf.Body, meta: kopf.Meta, **_: Any) -> None:
        reconciler.forget(str(meta.get("uid")))
        pokes.forget(str(meta.get("namespace")), str(meta.get("name")))
        log.info("%s/%s deleted; its children go with it", meta.get("namespace"), meta.get("name"))

    @kopf.daemon(*resource, registry=registry, cancellation_timeout=2.0)
    async def resync(
        body: kopf.Body, meta: kopf.Meta, stopped: kopf.DaemonStopped, **_: Any
    ) -> None:
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        wake = pokes.get(namespace, name)
        reconciler.metrics.managed.inc()
        failures = 0
        try:
            while not stopped:
                try:
                    await asyncio.wait_for(wake.wait(), timeout=options.resync_s)
                    await asyncio.sleep(options.debounce_s)
                except TimeoutError:
                    pass
                wake.clear()
                if stopped:
                    break
                try:
                    outcome = await reconciler.reconcile(body, trigger="resync")
                    _post_events(body, outcome)
                    failures = 0
                except (ApiError, OSError) as error:
                    failures += 1
                    delay = min(300.0, 5.0 * 2 ** min(failures, 6))
                    log.warning(
                        "resync of %s/%s failed (%s); next try in %.0fs",
                        namespace,
                        name,
                        error,
                        delay,
                    )
                    await asyncio.sleep(delay)
        finally:
            reconciler.metrics.managed.dec()

    @kopf.on.event(
        "apps",
        "v1",
        "deployments",
        labels={"app.kubernetes.io/managed-by": MANAGED_BY},
        registry=registry,
    )
    async def child_changed(body: kopf.Body, meta: kopf.Meta, **_: Any) -> None:
        owner = owning_resource(body)
        if owner is not None:
            pokes.poke(str(meta.get("namespace")), owner)

    return registry

"""One reconcile of one PromptCacheDeployment, as a sequence of named phases.

    render → ensure secrets → check → discover → router map → apply → prune → observe → status

`plan` (render, `controller/plan.py`) is pure: the resource parsed, resolved against
the operator-wide defaults (`render.resolved`), named and rendered into owned
children. Every later phase reads that one resolved resource through the `Scope`, so
what the status says is what render deployed. A resource that cannot be rendered
skips to the status (`Degraded`), with nothing applied. Prune follows one table of
the kinds a render can drop (`children.PRUNABLE`); the conditions are built in
`conditions.py`; API refusals are the types of `errors.py`. A resource being deleted only
takes its body-based router mapping out of the router (`router_exit.py`). The types the
phases share are in `scope.py`; the pods' observation, which keeps state between
reconciles (hit windows, last scrapes, served adapters), is `pod_observer.py`.

The same function serves every trigger (create, update, resume, the periodic
resync, a watched child changing), so behaviour cannot drift between them.
Reconciles of one resource are serialised by a lock; different resources run
concurrently, at most `max_concurrent` at once whatever the trigger (a burst of
2,000 creations must not become 2,000 reconciles racing for the API server).
Children and pods are read from the watch-fed caches (`cache.py`), never with a
request: an idle reconcile sends nothing. Nothing here blocks the event loop.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp

from promptcache.api import (
    API_VERSION,
    KIND,
    ceiling_of,
)
from promptcache.api.status import ConditionType, Reason
from promptcache.controller import conditions
from promptcache.controller.cache import Caches
from promptcache.controller.checks import (
    GatewayApis,
    NodeCache,
    gpu_nodes_present,
    gpu_shortfall,
    missing_secret,
)
from promptcache.controller.children import PRUNABLE, controller_uid
from promptcache.controller.compare import needs_apply
from promptcache.controller.conditions import Desired, now_rfc3339, transitions
from promptcache.controller.errors import ApiError, NotFoundError
from promptcache.controller.gateway_status import gateway_view, route_parents
from promptcache.controller.kube import Kube, by_kind, kind_of
from promptcache.controller.ladder import delivering
from promptcache.controller.ladder import status as ladder_status
from promptcache.controller.metrics import OperatorMetrics
from promptcache.controller.observation import Observation, Problem
from promptcache.controller.options import ReconcileSettings
from promptcache.controller.plan import PlanMemo
from promptcache.controller.pod_observer import PodObserver
from promptcache.controller.router_exit import RouterExit
from promptcache.controller.salt import ensure_salt_secret
from promptcache.controller.scope import Outcome, Scope, degrade, label_of
from promptcache.controller.status import (
    compute_status,
    prefix_cache_status,
    selector_string,
    status_differs,
)
from promptcache.render import (
    GATEWAY_KINDS,
    MONITORING_KINDS,
)
from promptcache.render.model_server import gpu_resource, node_selector
from promptcache.render.monitoring import MONITORING_API, monitoring_enabled
from promptcache.render.names import Component, selector_labels

log = logging.getLogger(__name__)

_APPLIED_LAST: frozenset[str] = frozenset({"RoleBinding"})
"""Kinds applied after the others: they name another child that must exist first."""

POD = by_kind("Pod")
POOL = by_kind("InferencePool")
ROUTE = by_kind("HTTPRoute")
GATEWAY = by_kind("Gateway")
POD_MONITOR = by_kind("PodMonitor")
CONFIG_MAP = by_kind("ConfigMap")
PCD_KIND = by_kind(KIND)
OPTIONAL_KINDS = GATEWAY_KINDS | MONITORING_KINDS
"""Kinds whose CRDs a cluster may lack: applied only while discovery says they are served."""
STATUS_ECHO_S = 10.0
"""How long a just-written status is trusted over a body that may not show it yet."""


async def apply_in_order(
    kube: Kube, manifests: list[dict[str, Any]]
) -> list[dict[str, Any] | BaseException]:
    """Apply concurrently, except that a RoleBinding waits for the rest (its Role).

    The operator holds no `bind` verb, so the API server checks a new RoleBinding against
    the Role it names, which must exist: applied at the same moment, the binding can
    arrive first and be refused with 404 NotFound (seen under load). Results are in the
    order of `manifests`; failures are returned, not raised.
    """
    results: dict[int, dict[str, Any] | BaseException] = {}
    for last in (False, True):
        indices = [i for i, m in enumerate(manifests) if (m["kind"] in _APPLIED_LAST) is last]
        done = await asyncio.gather(
            *(kube.apply(manifests[i]) for i in indices), return_exceptions=True
        )
        results.update(zip(indices, done, strict=True))
    return [results[i] for i in range(len(manifests))]


class Reconciler:
    """Holds what reconciles share: the API client, caches, locks and metrics."""

    def __init__(
        self,
        kube: Kube,
        caches: Caches,
        http: aiohttp.ClientSession,
        metrics: OperatorMetrics,
        settings: ReconcileSettings | None = None,
    ) -> None:
        self.kube = kube
        self.caches = caches
        self.http = http
        self.metrics = metrics
        self.settings = settings or ReconcileSettings()
        self._gate = asyncio.Semaphore(self.settings.max_concurrent)
        self.plans = PlanMemo(self.settings.defaults)
        self._in_sync: dict[str, tuple[str, tuple[str | None, ...]]] = {}
        """Per resource: the plan key and the children's resourceVersions when every child
        was last found to contain its rendered form; equal again, the comparison is skipped."""
        self.nodes = NodeCache()
        self.gateway_apis = GatewayApis()
        self._locks: dict[str, asyncio.Lock] = {}
        self._written: dict[str, tuple[dict[str, Any], float]] = {}
        self._salts: set[str] = set()
        """Salt Secrets known to exist (created, or a create answered 409)."""
        self._identity: dict[str, tuple[str, str]] = {}
        self.pods = PodObserver(http, caches, metrics, self.settings)
        self.router_exit = RouterExit(kube, caches)
        self._phases: tuple[Callable[[Scope], Awaitable[None]], ...] = (
            self._ensure_secrets,
            self._check,
            self._discover,
            self.router_exit.phase,
            self._apply,
            self._prune,
            self._observe,
        )
        """The phases between render and status, in order."""

    def forget(self, uid: str) -> None:
        """Drop per-resource state once a resource is gone."""
        self._locks.pop(uid, None)
        self._written.pop(uid, None)
        self.plans.forget(uid)
        self._in_sync.pop(uid, None)
        self._salts = {s for s in self._salts if not s.startswith(f"{uid}/")}
        self.pods.forget(uid)
        identity = self._identity.pop(uid, None)
        if identity is not None:
            self.metrics.drop_resource(*identity)

    async def reconcile(self, body: Mapping[str, Any], *, trigger: str) -> Outcome:
        raw = copy.deepcopy(dict(body))
        uid = str(raw["metadata"]["uid"])
        lock = self._locks.setdefault(uid, asyncio.Lock())
        started = time.monotonic()
        result = "error"
        try:
            async with lock, self._gate:
                outcome = await self._reconcile(raw, fresh=trigger == "create")
            result = "degraded" if outcome.problem else "ok"
            if outcome.problem:
                self.metrics.failures.labels(outcome.problem.reason).inc()
            return outcome
        except Exception as error:
            self.metrics.failures.labels(type(error).__name__).inc()
            raise
        finally:
            self.metrics.reconciles.labels(trigger, result).inc()
            self.metrics.duration.observe(time.monotonic() - started)

    async def _reconcile(self, raw: dict[str, Any], *, fresh: bool) -> Outcome:
        obs = Observation(generation=raw["metadata"].get("generation"))
        outcome = Outcome()
        if raw["metadata"].get("deletionTimestamp"):
            await self.router_exit.leave(raw, outcome)  # nothing else: the GC deletes the rest
            return outcome
        key, planned = self.plans.get(str(raw["metadata"]["uid"]), raw)
        if isinstance(planned, Problem):
            obs.blocked = planned
        else:
            scope = Scope(
                raw=raw, plan=planned, fresh=fresh, obs=obs, outcome=outcome, plan_key=key
            )
            for phase in self._phases:
                await phase(scope)
        outcome.problem = obs.blocked or obs.degraded
        await self._write_status(raw, obs, outcome)
        return outcome

    # ------------------------------------------------------------------ phases

    async def _ensure_secrets(self, scope: Scope) -> None:
        """Create the generated salt-key Secret when the spec needs one (create-only)."""
        pcd, names = scope.pcd, scope.names
        if await ensure_salt_secret(self.kube, pcd, names, scope.raw, self._salts):
            log.info("created salt-key Secret for %s/%s", names.namespace, names.instance)

    async def _check(self, scope: Scope) -> None:
        """What a schema cannot check: referenced Secrets exist, a node offers the GPUs."""
        pcd, obs = scope.pcd, scope.obs
        spec = pcd.spec
        obs.desired_replicas = spec.model.replicas
        obs.selector = selector_string(selector_labels(scope.names, Component.MODEL_SERVER))
        obs.ceiling = ceiling_of(pcd)
        message = await missing_secret(self.kube, pcd)
        if message:
            obs.degraded = Problem(Reason.SECRET_NOT_FOUND, message)
            return
        if spec.model.resources.gpus <= 0:
            return  # nothing to check: no node list for a resource that asks for no GPU
        nodes = await self.nodes.get(self.kube)
        short = gpu_shortfall(
            nodes, spec.model.resources.gpus, node_selector(pcd), gpu_resource(pcd)
        )
        # No eligible GPU node at all looks like a GPU node pool scaled to zero: its
        # autoscaler adds a node for the pending pods, so the pods' own state says so (a
        # warning), not a failure. GPU nodes all too small for the pod are a failure.
        if short and gpu_nodes_present(nodes, node_selector(pcd), gpu_resource(pcd)):
            obs.degraded = Problem(Reason.INSUFFICIENT_GPUS, short)

    async def _discover(self, scope: Scope) -> None:
        """Which optional kinds the cluster serves (cached, with back-off when absent)."""
        served, apis = scope.served, self.gateway_apis
        served["InferencePool"] = await apis.served(self.kube, POOL.api_version, POOL.plural)
        if scope.plan.renders("HTTPRoute") or served["InferencePool"]:
            served["HTTPRoute"] = await apis.served(self.kube, ROUTE.api_version, ROUTE.plural)
        # Ask discovery only for resources that monitor, or did (their PodMonitors may need
        # removing): a cluster without the Prometheus Operator hears nothing of it otherwise.
        was_monitored = any(
            c.get("type") == ConditionType.MONITORING_READY
            for c in (scope.raw.get("status") or {}).get("conditions") or []
        )
        if self._monitoring(scope) or (was_monitored and not scope.fresh):
            served["PodMonitor"] = await apis.served(self.kube, MONITORING_API, POD_MONITOR.plural)

    async def _apply(self, scope: Scope) -> None:
        """Server-side apply each child whose rendered form is not contained in the live one."""
        to_sync = [
            m
            for m in scope.plan.desired
            if m["kind"] not in OPTIONAL_KINDS or scope.served.get(m["kind"])
        ]
        if not scope.fresh and await self._unchanged(scope, to_sync):
            return
        lives: list[dict[str, Any] | ApiError | None] = (
            [None] * len(to_sync)
            if scope.fresh
            else list(await asyncio.gather(*(self._read(m) for m in to_sync)))
        )
        pending: list[dict[str, Any]] = []
        for manifest, live in zip(to_sync, lives, strict=True):
            label = label_of(manifest)
            if isinstance(live, ApiError):
                degrade(scope.obs, Reason.APPLY_FAILED, f"{label}: {live.message}")
            elif live is not None and controller_uid(live) not in (None, scope.uid):
                degrade(
                    scope.obs,
                    Reason.APPLY_FAILED,
                    f"{label} already exists and is controlled by another owner; "
                    "delete it or rename this resource",
                )
            elif live is not None and live.get("metadata", {}).get("deletionTimestamp"):
                continue  # being deleted (held by a finalizer): applied again once it is gone
            elif needs_apply(manifest, live):
                pending.append(manifest)
            elif live is not None:
                scope.live[label] = live
        results = await apply_in_order(self.kube, pending)
        for manifest, result in zip(pending, results, strict=True):
            self._applied(scope, manifest, result)
        if not scope.fresh and not pending and scope.obs.degraded is None:
            self._in_sync[scope.uid] = (scope.plan_key, await self._versions(to_sync))
        if scope.outcome.applied:
            names = scope.names
            log.info(
                "%s/%s: applied %s",
                names.namespace,
                names.instance,
                ", ".join(scope.outcome.applied),
            )

    def _applied(
        self, scope: Scope, manifest: dict[str, Any], result: dict[str, Any] | BaseException
    ) -> None:
        """Record one apply's result; an optional kind whose CRD went away is not served."""
        label = label_of(manifest)
        if isinstance(result, ApiError) and not result.transient:
            if isinstance(result, NotFoundError) and manifest["kind"] in OPTIONAL_KINDS:
                self.gateway_apis.invalidate()
                scope.served[manifest["kind"]] = False
            else:
                degrade(scope.obs, Reason.APPLY_FAILED, f"{label}: {result.message}")
            return
        if isinstance(result, BaseException):
            raise result
        scope.outcome.applied.append(label)
        self.metrics.children_applied.labels(manifest["kind"]).inc()
        scope.live[label] = result
        self.caches.informer(kind_of(manifest)).observe(result)

    async def _prune(self, scope: Scope) -> None:
        """Delete the children of `PRUNABLE` the spec no longer renders, if they are ours."""
        if scope.fresh:
            return
        names = scope.names
        for prunable in PRUNABLE:
            if prunable.discovered and not scope.served.get(prunable.kind.kind):
                continue
            for name in prunable.names(names):
                if scope.plan.renders(prunable.kind.kind, name):
                    continue
                live = (await self.caches.synced(prunable.kind)).get(names.namespace, name)
                if live is not None and controller_uid(live) == scope.uid:
                    await self.kube.delete(prunable.kind, names.namespace, name)

    async def _observe(self, scope: Scope) -> None:
        """What the cluster shows: the Deployments, the Gateway's verdict, the pods."""
        obs, names = scope.obs, scope.names
        obs.model_server = scope.live.get(f"Deployment/{names.model_server}")
        obs.endpoint_picker = scope.live.get(f"Deployment/{names.epp}")
        if self._monitoring(scope):
            obs.monitoring = conditions.monitoring(
                served=bool(scope.served.get("PodMonitor")),
                api=MONITORING_API,
                pod_monitors=(names.model_server, names.epp),
                applied=[
                    n for n in (names.model_server, names.epp) if f"PodMonitor/{n}" in scope.live
                ],
            )
        obs.gateway = await self._gateway_condition(scope)
        scraped, recent = await self.pods.observe(scope)
        obs.prefix_cache = prefix_cache_status(scope.pcd, scraped)
        if recent.ratio is not None:
            obs.prefix_cache = obs.prefix_cache.model_copy(
                update={
                    "recent_hit_ratio": recent.ratio,
                    "recent_window_seconds": round(recent.span_s),
                }
            )
        ladder = self.pods.ladder(scope)
        if ladder is not None:
            obs.cache, obs.cache_delivering = ladder_status(ladder), delivering(ladder)
        meta = scope.raw["metadata"]
        self._identity[scope.uid] = (meta["namespace"], meta["name"])
        ready = int(((obs.model_server or {}).get("status") or {}).get("readyReplicas") or 0)
        self.metrics.set_replicas(meta["namespace"], meta["name"], obs.desired_replicas, ready)

    # ------------------------------------------------------------------ helpers

    async def _versions(self, manifests: list[dict[str, Any]]) -> tuple[str | None, ...]:
        """The cached resourceVersion of each manifest's live object."""
        out = []
        for m in manifests:
            informer = await self.caches.synced(kind_of(m))
            out.append(informer.version(m["metadata"]["namespace"], m["metadata"]["name"]))
        return tuple(out)

    async def _unchanged(self, scope: Scope, to_sync: list[dict[str, Any]]) -> bool:
        """Neither the plan nor any child moved since every child was last found in sync:
        take the live children from the cache and skip the comparison."""
        known = self._in_sync.pop(scope.uid, None)
        if known is None or known[0] != scope.plan_key:
            return False
        try:
            versions = await self._versions(to_sync)
        except ApiError:
            return False
        if versions != known[1] or None in versions:
            return False
        for m in to_sync:
            live = (await self.caches.synced(kind_of(m))).get(
                m["metadata"]["namespace"], m["metadata"]["name"]
            )
            if live is None:
                return False
            scope.live[label_of(m)] = live
        self._in_sync[scope.uid] = known
        return True

    def _monitoring(self, scope: Scope) -> bool:
        return monitoring_enabled(scope.pcd)

    async def _read(self, manifest: Mapping[str, Any]) -> dict[str, Any] | ApiError | None:
        """The live child, from its kind's cache; a refusal to list the kind (403) is returned
        to be reported, not raised."""
        try:
            informer = await self.caches.synced(kind_of(manifest))
        except ApiError as error:
            if error.transient:
                raise
            return error
        return informer.get(manifest["metadata"]["namespace"], manifest["metadata"]["name"])

    async def _gateway_condition(self, scope: Scope) -> Desired:
        """GatewayReady: the CRDs and the picker first, then the Gateway controller's verdict."""
        pcd, names, live = scope.pcd, scope.names, scope.live
        kinds = [m["kind"] for m in scope.plan.desired if m["kind"] in GATEWAY_KINDS]
        st = (scope.obs.endpoint_picker or {}).get("status") or {}
        early = conditions.gateway_precondition(
            missing_kinds=[k for k in kinds if not scope.served.get(k)],
            epp_name=names.epp,
            want=pcd.spec.gateway.replicas,
            ready_replicas=int(st.get("readyReplicas") or 0),
        )
        if early is not None:
            return early
        route = live.get(f"HTTPRoute/{names.route}") if "HTTPRoute" in kinds else None
        if "HTTPRoute" in kinds and route is None:
            route = (await self.caches.synced(ROUTE)).get(names.namespace, names.route)
        gateways = []
        for parent in route_parents(route, names.namespace) if route is not None else []:
            try:
                gw = await self.kube.get(GATEWAY, parent.namespace, parent.name)
            except ApiError as error:
                if error.transient:
                    raise
                gw = None  # not allowed to read it, or its CRD is gone: no address to show
            if gw is not None:
                gateways.append(gw)
        view = gateway_view(
            namespace=names.namespace,
            pool_name=names.pool,
            pool=live.get(f"InferencePool/{names.pool}"),
            route_name=names.route,
            route=route,
            gateways=gateways,
        )
        scope.obs.gateway_addresses = view.addresses
        return view.condition

    async def _write_status(self, raw: dict[str, Any], obs: Observation, outcome: Outcome) -> None:
        """Status phase: write `.status` only when it differs from the live one."""
        uid = str(raw["metadata"]["uid"])
        live_status = raw.get("status") or {}
        echo = self._written.get(uid)
        recent = echo is not None and time.monotonic() - echo[1] < STATUS_ECHO_S
        previous = echo[0] if recent and echo is not None else live_status
        new = compute_status(obs, previous, now=now_rfc3339())
        if not status_differs(new, live_status):
            return
        if recent and echo is not None and not status_differs(new, echo[0]):
            return
        manifest = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {
                "name": raw["metadata"]["name"],
                "namespace": raw["metadata"]["namespace"],
            },
            "status": new,
        }
        try:
            await self.kube.apply_status(manifest)
        except NotFoundError:
            return  # deleted meanwhile
        self.metrics.status_writes.inc()
        self._written[uid] = (new, time.monotonic())
        outcome.status_written = True
        outcome.transitions = transitions(list(previous.get("conditions") or []), new["conditions"])

"""One reconcile of one PromptCacheDeployment: render, apply what changed, observe, report.

The same function serves every trigger (create, update, resume, the periodic
resync, a watched child changing), so behaviour cannot drift between them.
Reconciles of one resource are serialised by a lock; different resources run
concurrently. Nothing here blocks the event loop: all I/O is awaited.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from promptcache.api import (
    API_VERSION,
    BUILT_IN_DEFAULTS,
    KIND,
    InvalidResourceError,
    OperatorDefaults,
    PromptCacheDeployment,
    ceiling_of,
    parse_resource,
)
from promptcache.api.status import ConditionType, Reason
from promptcache.controller.checks import (
    GatewayApis,
    NodeCache,
    gpu_nodes_present,
    gpu_shortfall,
    missing_secret,
)
from promptcache.controller.children import controller_uid, owned
from promptcache.controller.compare import needs_apply
from promptcache.controller.conditions import Desired, now_rfc3339, transitions
from promptcache.controller.diagnose import diagnose
from promptcache.controller.gateway_status import gateway_view, route_parents
from promptcache.controller.kube import ApiError, Kind, Kube, by_kind, kind_of
from promptcache.controller.metrics import OperatorMetrics
from promptcache.controller.options import DEFAULT_SCRAPE_PORT, DEFAULT_SCRAPE_TIMEOUT_SECONDS
from promptcache.controller.salt import ensure_salt_secret
from promptcache.controller.scrape import (
    ScrapedPrefixCache,
    aggregate,
    ready_pod_ips,
    scrape_by_ip,
)
from promptcache.controller.status import (
    Observation,
    Problem,
    compute_status,
    prefix_cache_status,
    selector_string,
    status_differs,
)
from promptcache.controller.window import HitWindow, WindowedRatio
from promptcache.render import (
    GATEWAY_KINDS,
    MONITORING_KINDS,
    Names,
    RenderError,
    names_of,
    render,
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
HPA = by_kind("HorizontalPodAutoscaler")
NETWORK_POLICY = by_kind("NetworkPolicy")
CONFIG_MAP = by_kind("ConfigMap")
STATUS_ECHO_S = 10.0
"""How long a just-written status is trusted over a body that may not show it yet."""


@dataclass(frozen=True)
class ReconcileSettings:
    scrape_port: int = DEFAULT_SCRAPE_PORT
    scrape_timeout_s: float = DEFAULT_SCRAPE_TIMEOUT_SECONDS
    defaults: OperatorDefaults = BUILT_IN_DEFAULTS
    """Operator-wide defaults for what a resource leaves empty (`promptcache run` flags)."""


@dataclass
class Outcome:
    """What one reconcile did: for handlers (events, retries), metrics and tests."""

    applied: list[str] = field(default_factory=list)
    status_written: bool = False
    transitions: list[dict[str, Any]] = field(default_factory=list)
    problem: Problem | None = None


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
        http: aiohttp.ClientSession,
        metrics: OperatorMetrics,
        settings: ReconcileSettings | None = None,
    ) -> None:
        self.kube = kube
        self.http = http
        self.metrics = metrics
        self.settings = settings or ReconcileSettings()
        self.nodes = NodeCache()
        self.gateway_apis = GatewayApis()
        self.scrape_gate = asyncio.Semaphore(16)
        self._locks: dict[str, asyncio.Lock] = {}
        self._written: dict[str, tuple[dict[str, Any], float]] = {}
        self._salts: set[str] = set()
        """Salt Secrets known to exist (created, or a create answered 409)."""
        self._windows: dict[str, HitWindow] = {}
        self._identity: dict[str, tuple[str, str]] = {}

    def forget(self, uid: str) -> None:
        """Drop per-resource state once a resource is gone."""
        self._locks.pop(uid, None)
        self._written.pop(uid, None)
        self._salts = {s for s in self._salts if not s.startswith(f"{uid}/")}
        self._windows.pop(uid, None)
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
            async with lock:
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
        """`fresh`: the resource was just created, so its children cannot exist yet (their
        names derive from it and their owner is this very object): apply without reading
        them first, which halves a new resource's requests. Every other trigger reads first,
        so an unchanged resource costs no writes."""
        meta = raw["metadata"]
        obs = Observation(generation=meta.get("generation"))
        outcome = Outcome()
        try:
            pcd = parse_resource({k: raw[k] for k in ("apiVersion", "kind", "metadata", "spec")})
            names = names_of(pcd)
        except InvalidResourceError as error:
            obs.blocked = Problem(Reason.INVALID_SPEC, "; ".join(str(p) for p in error.problems))
        except RenderError as error:
            obs.blocked = Problem(error.reason, str(error))
        except KeyError as error:
            obs.blocked = Problem(Reason.INVALID_SPEC, f"missing {error.args[0]}")
        if obs.blocked is None:
            await self._realise(raw, pcd, names, obs, outcome, fresh=fresh)
        outcome.problem = obs.blocked or obs.degraded
        if obs.blocked is None:
            self._identity[str(meta["uid"])] = (meta["namespace"], meta["name"])
            ready = int(((obs.model_server or {}).get("status") or {}).get("readyReplicas") or 0)
            self.metrics.set_replicas(meta["namespace"], meta["name"], obs.desired_replicas, ready)
        await self._write_status(raw, obs, outcome)
        return outcome

    async def _realise(
        self,
        raw: dict[str, Any],
        pcd: PromptCacheDeployment,
        names: Names,
        obs: Observation,
        outcome: Outcome,
        *,
        fresh: bool,
    ) -> None:
        uid = str(raw["metadata"]["uid"])
        spec = pcd.spec
        obs.desired_replicas = spec.model.replicas
        obs.selector = selector_string(selector_labels(names, Component.MODEL_SERVER))
        obs.ceiling = ceiling_of(pcd)
        desired = [owned(m, raw) for m in render(pcd, self.settings.defaults)]

        if await ensure_salt_secret(self.kube, pcd, names, raw, self._salts):
            log.info("created salt-key Secret for %s/%s", names.namespace, names.instance)
        message = await missing_secret(self.kube, pcd)
        if message:
            obs.degraded = Problem(Reason.SECRET_NOT_FOUND, message)
        else:
            nodes = await self.nodes.get(self.kube)
            short = gpu_shortfall(
                nodes, spec.model.resources.gpus, node_selector(pcd), gpu_resource(pcd)
            )
            # No eligible GPU node at all looks like a GPU node pool scaled to zero: its
            # autoscaler adds a node for the pending pods, so the pods' own state says so (a
            # warning), not a failure. GPU nodes all too small for the pod are a failure.
            if short and gpu_nodes_present(nodes, node_selector(pcd), gpu_resource(pcd)):
                obs.degraded = Problem(Reason.INSUFFICIENT_GPUS, short)

        served = {
            "InferencePool": await self.gateway_apis.served(
                self.kube, POOL.api_version, POOL.plural
            )
        }
        if any(m["kind"] == "HTTPRoute" for m in desired) or served["InferencePool"]:
            served["HTTPRoute"] = await self.gateway_apis.served(
                self.kube, ROUTE.api_version, ROUTE.plural
            )
        monitoring = monitoring_enabled(pcd, self.settings.defaults)
        # Ask discovery only for resources that monitor, or did (their PodMonitors may need
        # removing): a cluster without the Prometheus Operator hears nothing of it otherwise.
        was_monitored = any(
            c.get("type") == ConditionType.MONITORING_READY
            for c in (raw.get("status") or {}).get("conditions") or []
        )
        if monitoring or (was_monitored and not fresh):
            served["PodMonitor"] = await self.gateway_apis.served(
                self.kube, MONITORING_API, POD_MONITOR.plural
            )
        optional = GATEWAY_KINDS | MONITORING_KINDS
        to_sync = [m for m in desired if m["kind"] not in optional or served.get(m["kind"])]
        lives: list[dict[str, Any] | ApiError | None] = (
            [None] * len(to_sync)
            if fresh
            else list(await asyncio.gather(*(self._read(m) for m in to_sync)))
        )
        by_kind_name = await self._apply(
            to_sync, lives, uid=uid, served=served, obs=obs, outcome=outcome
        )
        if outcome.applied:
            log.info(
                "%s/%s: applied %s", names.namespace, names.instance, ", ".join(outcome.applied)
            )
        route_desired = any(m["kind"] == "HTTPRoute" for m in desired)
        if served.get("HTTPRoute") and not route_desired and not fresh:
            await self._prune_route(names, uid)
        if served.get("PodMonitor") and not monitoring and not fresh:
            await self._prune_pod_monitors(names, uid)
        if monitoring:
            obs.monitoring = self._monitoring_condition(names, served, by_kind_name)
        if not spec.autoscaling.enabled and not fresh:
            await self._prune(HPA, names.namespace, names.instance, uid)
        if not fresh and not any(m["kind"] == NETWORK_POLICY.kind for m in desired):
            # no policy step in front of the picker any more, or gateway.networkPolicy off
            await self._prune(NETWORK_POLICY, names.namespace, names.epp, uid)
        if not fresh and not spec.gateway.route.route_by_model:
            # the body-based router's mapping exists only while the route matches by model
            await self._prune(CONFIG_MAP, names.namespace, names.model_map, uid)

        obs.model_server = by_kind_name.get(f"Deployment/{names.model_server}")
        obs.endpoint_picker = by_kind_name.get(f"Deployment/{names.epp}")
        obs.gateway = await self._gateway_condition(
            pcd, names, desired, served, obs, live=by_kind_name
        )
        scraped, recent = await self._observe_pods(names, uid, obs)
        obs.prefix_cache = prefix_cache_status(pcd, scraped)
        if recent.ratio is not None:
            obs.prefix_cache = obs.prefix_cache.model_copy(
                update={
                    "recent_hit_ratio": recent.ratio,
                    "recent_window_seconds": round(recent.span_s),
                }
            )

    async def _apply(
        self,
        to_sync: list[dict[str, Any]],
        lives: list[dict[str, Any] | ApiError | None],
        *,
        uid: str,
        served: dict[str, bool],
        obs: Observation,
        outcome: Outcome,
    ) -> dict[str, Mapping[str, Any]]:
        """Apply each child whose rendered form is not live; return the live children."""
        by_kind_name: dict[str, Mapping[str, Any]] = {}
        pending: list[tuple[str, dict[str, Any]]] = []
        for manifest, live in zip(to_sync, lives, strict=True):
            label = f"{manifest['kind']}/{manifest['metadata']['name']}"
            if isinstance(live, ApiError):
                obs.degraded = obs.degraded or Problem(
                    Reason.APPLY_FAILED, f"{label}: {live.message}"[:1000]
                )
                continue
            if live is not None and controller_uid(live) not in (None, uid):
                obs.degraded = obs.degraded or Problem(
                    Reason.APPLY_FAILED,
                    f"{label} already exists and is controlled by another owner; "
                    "delete it or rename this resource",
                )
                continue
            if needs_apply(manifest, live):
                pending.append((label, manifest))
            elif live is not None:
                by_kind_name[label] = live
        results = await apply_in_order(self.kube, [m for _, m in pending])
        for (label, manifest), result in zip(pending, results, strict=True):
            if isinstance(result, ApiError) and not result.transient:
                if result.code == 404 and manifest["kind"] in GATEWAY_KINDS | MONITORING_KINDS:
                    self.gateway_apis.invalidate()
                    served[manifest["kind"]] = False
                    continue
                obs.degraded = obs.degraded or Problem(
                    Reason.APPLY_FAILED, f"{label}: {result.message}"[:1000]
                )
                continue
            if isinstance(result, BaseException):
                raise result
            outcome.applied.append(label)
            self.metrics.children_applied.labels(manifest["kind"]).inc()
            by_kind_name[label] = result
        return by_kind_name

    async def _read(self, manifest: Mapping[str, Any]) -> dict[str, Any] | ApiError | None:
        """The live child; a refusal (403, 422) is returned to be reported, not raised."""
        try:
            return await self.kube.get(
                kind_of(manifest), manifest["metadata"]["namespace"], manifest["metadata"]["name"]
            )
        except ApiError as error:
            if error.transient:
                raise
            return error

    async def _prune_pod_monitors(self, names: Names, uid: str) -> None:
        """Monitoring turned off: remove the PodMonitors this resource owns."""
        for name in (names.model_server, names.epp):
            live = await self.kube.get(POD_MONITOR, names.namespace, name)
            if live is not None and controller_uid(live) == uid:
                await self.kube.delete(POD_MONITOR, names.namespace, name)

    @staticmethod
    def _monitoring_condition(
        names: Names, served: Mapping[str, bool], live: Mapping[str, Mapping[str, Any]]
    ) -> Desired:
        if not served.get("PodMonitor"):
            return Desired(
                ConditionType.MONITORING_READY,
                "False",
                Reason.PROMETHEUS_OPERATOR_NOT_INSTALLED,
                f"spec.monitoring.enabled, but {MONITORING_API} PodMonitor is not served: install "
                "the Prometheus Operator CRDs (or scrape the pods yourself, docs/monitoring.md); "
                "everything else is managed as usual",
            )
        applied = [n for n in (names.model_server, names.epp) if f"PodMonitor/{n}" in live]
        if len(applied) < 2:
            return Desired(
                ConditionType.MONITORING_READY, "False", Reason.APPLY_FAILED,
                "PodMonitors not applied yet (see Degraded)",
            )  # fmt: skip
        return Desired(
            ConditionType.MONITORING_READY,
            "True",
            Reason.POD_MONITORS_APPLIED,
            f"PodMonitor {names.model_server} (model servers) and {names.epp} (Endpoint Picker) "
            "applied",
        )

    async def _prune_route(self, names: Names, uid: str) -> None:
        """The HTTPRoute is rendered only with parentRefs; remove ours when they go away."""
        await self._prune(ROUTE, names.namespace, names.route, uid)

    async def _prune(self, kind: Kind, namespace: str, name: str, uid: str) -> None:
        """Delete a child the spec no longer renders, if it is ours."""
        live = await self.kube.get(kind, namespace, name)
        if live is not None and controller_uid(live) == uid:
            await self.kube.delete(kind, namespace, name)

    async def _gateway_condition(
        self,
        pcd: PromptCacheDeployment,
        names: Names,
        desired: list[dict[str, Any]],
        served: Mapping[str, bool],
        obs: Observation,
        *,
        live: Mapping[str, Mapping[str, Any]],
    ) -> Desired:
        kinds = [m["kind"] for m in desired if m["kind"] in GATEWAY_KINDS]
        missing = [k for k in kinds if not served.get(k)]
        if missing:
            return Desired(
                ConditionType.GATEWAY_READY,
                "False",
                Reason.CRD_NOT_INSTALLED,
                f"the {' and '.join(missing)} CRD is not installed; the model servers are managed "
                "without a gateway. Install the Gateway API and Inference Extension CRDs.",
            )
        st = (obs.endpoint_picker or {}).get("status") or {}
        want, ready = pcd.spec.gateway.replicas, int(st.get("readyReplicas") or 0)
        if ready < want:
            return Desired(
                ConditionType.GATEWAY_READY,
                "False",
                Reason.REPLICAS_NOT_READY,
                f"Endpoint Picker {names.epp}: {ready}/{want} ready",
            )
        route = live.get(f"HTTPRoute/{names.route}") if "HTTPRoute" in kinds else None
        if "HTTPRoute" in kinds and route is None:
            route = await self.kube.get(ROUTE, names.namespace, names.route)
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
        obs.gateway_addresses = view.addresses
        return view.condition

    async def _observe_pods(
        self, names: Names, uid: str, obs: Observation
    ) -> tuple[ScrapedPrefixCache, WindowedRatio]:
        """Why pods are not ready (into `obs.pods`); the pods' prefix-cache reports, lifetime
        and over the recent window."""
        selector = selector_string(selector_labels(names, Component.MODEL_SERVER))
        pods = await self.kube.list(POD, names.namespace, label_selector=selector)
        obs.pods = diagnose(pods)
        ips = ready_pod_ips(pods)
        if not ips:
            return ScrapedPrefixCache(), WindowedRatio(None, 0.0, 0.0)
        results = await scrape_by_ip(
            self.http,
            ips,
            port=self.settings.scrape_port,
            timeout_s=self.settings.scrape_timeout_s,
            limit=self.scrape_gate,
        )
        window = self._windows.setdefault(uid, HitWindow())
        recent = window.add(
            time.monotonic(), {ip: (m.hits, m.queries) for ip, m in results.items()}
        )
        return aggregate(list(results.values())), recent

    async def _write_status(self, raw: dict[str, Any], obs: Observation, outcome: Outcome) -> None:
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
        except ApiError as error:
            if error.code == 404:
                return  # deleted meanwhile
            raise
        self.metrics.status_writes.inc()
        self._written[uid] = (new, time.monotonic())
        outcome.status_written = True
        outcome.transitions = transitions(list(previous.get("conditions") or []), new["conditions"])

"""A small dict-in, dict-out Kubernetes REST layer over lightkube's connection handling.

Why not lightkube's typed models: server-side apply and the "is the desired
manifest already live?" comparison both need the API server's JSON verbatim,
and 200 resources' worth of typed objects would cost memory for nothing. So
lightkube supplies what is hard to get right (kubeconfig, in-cluster service
account, TLS, token refresh) and this module builds the few REST calls the
operator makes. Every request passes one counter, so tests and the benchmark
can prove that an idle resync writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import httpx2
from lightkube.config.client_adapter import AsyncClient as AdapterClient
from lightkube.config.client_adapter import ConnectionParams
from lightkube.config.kubeconfig import KubeConfig, SingleConfig

from promptcache.api.constants import API_VERSION, KIND, PLURAL
from promptcache.controller.errors import (
    ApiError,
    ApiUnreachableError,
    ConflictError,
    NotFoundError,
    TooManyRequestsError,
    api_error,
)

FIELD_MANAGER: Final[str] = "promptcache"
"""The one field manager every server-side apply of the operator uses."""
WRITE_VERBS: Final[frozenset[str]] = frozenset({"POST", "PUT", "PATCH", "DELETE"})
APPLY_CONTENT_TYPE: Final[str] = "application/apply-patch+yaml"  # JSON is valid YAML
MERGE_CONTENT_TYPE: Final[str] = "application/merge-patch+json"
THROTTLE_RETRIES: Final[int] = 8
"""429s one request waits out (each for its Retry-After) before the caller sees the error;
client-go retries up to 10 times the same way."""
THROTTLE_DEFAULT_WAIT_S: Final[float] = 1.0
"""Wait after a 429 that names no Retry-After (the API server's own default)."""
REQUEST_TIMEOUT_S: Final[float] = 65.0
"""How long the client waits for an answer: a little over the API server's own limit
(`--request-timeout`, 1 min), so the server decides. Creating a Service allocates its
ClusterIP through the server's own rate-limited client and took 9 s on average (over 15 s
for hundreds) when 200 resources were created at once: a 15 s client timeout aborted
them and sent them again, which only added load."""
LIST_PAGE: Final[int] = 500
"""Items per LIST page (client-go's informers page by 500 too)."""
MAX_IN_FLIGHT: Final[int] = 32
"""Requests (watches apart) one client has open at once. 16 reconciles applying their
children side by side would otherwise send ~180 at once: the API server serves no more
for it (on two cores it saturates well below), every request waits longer, and past the
client's timeout it is sent again."""
WATCH_TIMEOUT_S: Final[int] = 300
"""The server ends a watch after this; the informer resumes it from its resourceVersion."""


Items = list[dict[str, Any]]
"""A LIST's items, as the API server sent them."""


@dataclass(frozen=True)
class Kind:
    """Where a kind lives in the REST API."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        parts = [base]
        if self.namespaced and namespace is not None:
            parts.append(f"namespaces/{namespace}")
        parts.append(self.plural)
        if name is not None:
            parts.append(name)
        return "/".join(parts)


_KNOWN: Final[tuple[Kind, ...]] = (
    Kind("v1", "ServiceAccount", "serviceaccounts"),
    Kind("v1", "ConfigMap", "configmaps"),
    Kind("v1", "Service", "services"),
    Kind("v1", "Secret", "secrets"),
    Kind("v1", "Pod", "pods"),
    Kind("v1", "Event", "events"),
    Kind("v1", "Node", "nodes", namespaced=False),
    Kind("apps/v1", "Deployment", "deployments"),
    Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
    Kind("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers"),
    Kind("rbac.authorization.k8s.io/v1", "Role", "roles"),
    Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    Kind("coordination.k8s.io/v1", "Lease", "leases"),
    Kind("inference.networking.k8s.io/v1", "InferencePool", "inferencepools"),
    Kind("gateway.networking.k8s.io/v1", "HTTPRoute", "httproutes"),
    Kind("gateway.networking.k8s.io/v1", "Gateway", "gateways"),
    Kind("monitoring.coreos.com/v1", "PodMonitor", "podmonitors"),
    Kind(API_VERSION, KIND, PLURAL),
)
KINDS: Final[Mapping[tuple[str, str], Kind]] = {(k.api_version, k.kind): k for k in _KNOWN}


def kind_of(manifest: Mapping[str, Any]) -> Kind:
    """The Kind of a manifest; a kind the operator does not know is a programming error."""
    return KINDS[(str(manifest["apiVersion"]), str(manifest["kind"]))]


def by_kind(kind: str) -> Kind:
    return next(k for k in _KNOWN if k.kind == kind)


class RequestCounter:
    """Counts requests by HTTP verb (and writes by verb and plural) as they leave the client."""

    def __init__(self) -> None:
        self.by_verb: Counter[str] = Counter()
        self.writes_by_resource: Counter[str] = Counter()

    @property
    def writes(self) -> int:
        return sum(n for verb, n in self.by_verb.items() if verb in WRITE_VERBS)

    def record(self, method: str, path: str) -> None:
        self.by_verb[method] += 1
        if method in WRITE_VERBS:
            segments = [s for s in path.split("/") if s]
            self.writes_by_resource[plural_of(segments)] += 1


def plural_of(segments: list[str]) -> str:
    """`/apis/apps/v1/namespaces/ns/deployments/x` → `deployments` (subresources appended)."""
    rest = segments[2:] if segments[:1] == ["api"] else segments[3:]
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    if not rest:
        return "?"
    return "/".join([rest[0], *rest[2:3]])


def load_config() -> SingleConfig:
    """In-cluster service account first, then KUBECONFIG / ~/.kube/config (lightkube's order)."""
    config = KubeConfig.from_env().get()
    if config is None:
        raise RuntimeError("no Kubernetes configuration found (KUBECONFIG or in-cluster)")
    return config


__all__ = ["FIELD_MANAGER", "KINDS", "ApiError", "Kind", "Kube", "RequestCounter", "by_kind"]


class Kube:
    """The REST calls the operator needs, on one pooled HTTP client."""

    def __init__(
        self,
        config: SingleConfig,
        *,
        counter: RequestCounter | None = None,
        timeout_s: float = REQUEST_TIMEOUT_S,
        on_request: Any = None,
        on_throttle: Callable[[float], None] | None = None,
        sleep: Callable[[float], Any] = asyncio.sleep,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self.counter = counter or RequestCounter()
        self._on_request = on_request
        self._on_throttle = on_throttle
        self._sleep = sleep
        self._in_flight = asyncio.Semaphore(max_in_flight)
        params = ConnectionParams(timeout=httpx2.Timeout(timeout_s))
        self._http: httpx2.AsyncClient = AdapterClient(config, params)
        self._http.event_hooks["request"].append(self._count)
        self.default_namespace = config.namespace

    async def _count(self, request: httpx2.Request) -> None:
        # A watch is one long GET: counted apart, so "no read at steady state" is checkable.
        verb = "WATCH" if request.url.params.get("watch") else request.method
        self.counter.record(verb, request.url.path)
        if self._on_request is not None:
            self._on_request(verb, request.url.path)

    async def close(self) -> None:
        await self._http.aclose()

    async def _send(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """One request; a 429 is waited out (its Retry-After, with a little jitter so that
        throttled callers do not return in lockstep) up to `THROTTLE_RETRIES` times."""
        for attempt in range(THROTTLE_RETRIES + 1):
            try:
                return await self._send_once(
                    method, path, body=body, params=params, content_type=content_type
                )
            except TooManyRequestsError as error:
                if attempt == THROTTLE_RETRIES:
                    raise
                wait = error.retry_after_s
                wait = THROTTLE_DEFAULT_WAIT_S if wait is None else wait
                if self._on_throttle is not None:
                    self._on_throttle(wait)
                await self._sleep(wait * (1 + random.random() / 4))  # noqa: S311 - jitter
        raise AssertionError("unreachable")  # pragma: no cover

    async def _send_once(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        content = None
        if body is not None:
            headers["Content-Type"] = content_type
            content = json.dumps(body, separators=(",", ":")).encode()
        try:
            async with self._in_flight:
                response = await self._http.request(
                    method, path, params=dict(params or {}), content=content, headers=headers
                )
        except httpx2.TransportError as error:
            raise ApiUnreachableError(f"{method} {path}: {error!r}") from error
        try:
            data = response.json() if response.content else {}
        except ValueError:
            data = {"message": response.text[:500]}
        if response.status_code >= 400:
            raise api_error(
                response.status_code,
                str(data.get("reason", "")) if isinstance(data, dict) else "",
                str(data.get("message", response.text[:500])) if isinstance(data, dict) else "",
                retry_after=response.headers.get("Retry-After"),
            )
        return data if isinstance(data, dict) else {}

    async def get(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return await self._send("GET", kind.path(namespace, name))
        except NotFoundError:
            return None

    async def get_path(self, path: str) -> dict[str, Any] | None:
        """A raw GET (discovery documents); None on 404."""
        try:
            return await self._send("GET", path)
        except NotFoundError:
            return None

    async def list_versioned(
        self, kind: Kind, namespace: str | None = None
    ) -> tuple[list[dict[str, Any]], str]:
        """The items and the list's resourceVersion, where a watch of the same list starts."""
        data = await self._send("GET", kind.path(namespace))
        version = str((data.get("metadata") or {}).get("resourceVersion") or "")
        return [dict(item) for item in data.get("items") or []], version

    async def list(
        self, kind: Kind, namespace: str | None = None, *, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else {}
        data = await self._send("GET", kind.path(namespace), params=params)
        items = data.get("items") or []
        return [dict(item) for item in items]

    async def list_pages(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        limit: int = LIST_PAGE,
    ) -> AsyncIterator[tuple[Items, str]]:
        """One consistent LIST in pages of `limit` (`continue` tokens), each with the list's
        resourceVersion: a caller that stores each page as it comes never holds the whole
        list decoded at once (4,000 pods are some 100 MiB as Python objects)."""
        params = {"limit": str(limit)}
        if label_selector:
            params["labelSelector"] = label_selector
        while True:
            data = await self._send("GET", kind.path(namespace), params=params)
            meta = data.get("metadata") or {}
            yield (
                [dict(item) for item in data.get("items") or []],
                str(meta.get("resourceVersion") or ""),
            )
            token = meta.get("continue")
            if not token:
                return
            params["continue"] = str(token)

    async def watch(
        self,
        kind: Kind,
        namespace: str | None,
        *,
        resource_version: str,
        label_selector: str | None = None,
        timeout_s: int = WATCH_TIMEOUT_S,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """The watch events (`ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`) after
        `resource_version`, until the server ends the watch. An error status before the
        stream starts (410, 429, 403), or an `ERROR` event in it, raises its typed error:
        `GoneError` means the version is too old, list again."""
        params = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        if label_selector:
            params["labelSelector"] = label_selector
        timeout = httpx2.Timeout(timeout_s + 30.0, connect=15.0)
        async with self._http.stream(
            "GET", kind.path(namespace), params=params, timeout=timeout,
            headers={"Accept": "application/json"},
        ) as response:  # fmt: skip
            if response.status_code >= 400:
                raw = await response.aread()
                try:
                    data = json.loads(raw) if raw else {}
                except ValueError:
                    data = {}
                raise api_error(
                    response.status_code,
                    str(data.get("reason", "")),
                    str(data.get("message", raw[:500].decode(errors="replace"))),
                    retry_after=response.headers.get("Retry-After"),
                )
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    raise api_error(
                        int(status.get("code") or 500),
                        str(status.get("reason", "")),
                        str(status.get("message", "")),
                    )
                yield str(event.get("type", "")), dict(event.get("object") or {})

    async def apply(
        self, manifest: Mapping[str, Any], *, force: bool = True, manager: str = FIELD_MANAGER
    ) -> dict[str, Any]:
        """Server-side apply under the operator's field manager (creates when absent)."""
        kind = kind_of(manifest)
        meta = manifest["metadata"]
        params = {"fieldManager": manager, "force": "true" if force else "false"}
        return await self._send(
            "PATCH",
            kind.path(meta.get("namespace"), meta["name"]),
            body=manifest,
            params=params,
            content_type=APPLY_CONTENT_TYPE,
        )

    async def apply_status(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply of the status subresource (the operator owns all of status)."""
        kind = kind_of(manifest)
        meta = manifest["metadata"]
        params = {"fieldManager": FIELD_MANAGER, "force": "true"}
        return await self._send(
            "PATCH",
            kind.path(meta.get("namespace"), meta["name"]) + "/status",
            body=manifest,
            params=params,
            content_type=APPLY_CONTENT_TYPE,
        )

    async def create(self, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
        """POST; None when the object already exists (409), which create-only callers want."""
        kind = kind_of(manifest)
        try:
            return await self._send(
                "POST", kind.path(manifest["metadata"].get("namespace")), body=manifest
            )
        except ConflictError:
            return None

    async def replace(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """PUT with the manifest's resourceVersion: optimistic concurrency (409 on a race)."""
        kind = kind_of(manifest)
        meta = manifest["metadata"]
        return await self._send(
            "PUT", kind.path(meta.get("namespace"), meta["name"]), body=manifest
        )

    async def patch_json(
        self, kind: Kind, namespace: str | None, name: str, ops: Sequence[Mapping[str, Any]]
    ) -> dict[str, Any]:
        """A JSON patch (RFC 6902); begin `ops` with a `test` of the resourceVersion to make
        it conditional (a race answers 409/422, not a lost write)."""
        return await self._send(
            "PATCH",
            kind.path(namespace, name),
            body=ops,
            content_type="application/json-patch+json",
        )

    async def delete(self, kind: Kind, namespace: str | None, name: str) -> None:
        """Delete in the background; an object already gone is fine."""
        with contextlib.suppress(NotFoundError):
            await self._send(
                "DELETE", kind.path(namespace, name), body={"propagationPolicy": "Background"}
            )

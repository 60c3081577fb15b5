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

import contextlib
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import httpx2
from lightkube.config.client_adapter import AsyncClient as AdapterClient
from lightkube.config.client_adapter import ConnectionParams
from lightkube.config.kubeconfig import KubeConfig, SingleConfig

from promptcache.api.constants import API_VERSION, KIND, PLURAL
from promptcache.controller.errors import ApiError, ConflictError, NotFoundError, api_error

FIELD_MANAGER: Final[str] = "promptcache"
"""The one field manager every server-side apply of the operator uses."""
WRITE_VERBS: Final[frozenset[str]] = frozenset({"POST", "PUT", "PATCH", "DELETE"})
APPLY_CONTENT_TYPE: Final[str] = "application/apply-patch+yaml"  # JSON is valid YAML
MERGE_CONTENT_TYPE: Final[str] = "application/merge-patch+json"


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
        timeout_s: float = 15.0,
        on_request: Any = None,
    ) -> None:
        self.counter = counter or RequestCounter()
        self._on_request = on_request
        params = ConnectionParams(timeout=httpx2.Timeout(timeout_s))
        self._http: httpx2.AsyncClient = AdapterClient(config, params)
        self._http.event_hooks["request"].append(self._count)
        self.default_namespace = config.namespace

    async def _count(self, request: httpx2.Request) -> None:
        self.counter.record(request.method, request.url.path)
        if self._on_request is not None:
            self._on_request(request.method, request.url.path)

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
        headers = {"Accept": "application/json"}
        content = None
        if body is not None:
            headers["Content-Type"] = content_type
            content = json.dumps(body, separators=(",", ":")).encode()
        response = await self._http.request(
            method, path, params=dict(params or {}), content=content, headers=headers
        )
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

    async def list(
        self, kind: Kind, namespace: str | None = None, *, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else {}
        data = await self._send("GET", kind.path(namespace), params=params)
        items = data.get("items") or []
        return [dict(item) for item in items]

    async def apply(self, manifest: Mapping[str, Any], *, force: bool = True) -> dict[str, Any]:
        """Server-side apply under the operator's field manager (creates when absent)."""
        kind = kind_of(manifest)
        meta = manifest["metadata"]
        params = {"fieldManager": FIELD_MANAGER, "force": "true" if force else "false"}
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

    async def delete(self, kind: Kind, namespace: str | None, name: str) -> None:
        """Delete in the background; an object already gone is fine."""
        with contextlib.suppress(NotFoundError):
            await self._send(
                "DELETE", kind.path(namespace, name), body={"propagationPolicy": "Background"}
            )

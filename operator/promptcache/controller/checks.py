"""Can the cluster realise this resource? Checks that a schema cannot make.

Each check returns a user-actionable message or None. They only read: a
missing Secret or a GPU shortfall is reported (Degraded) while the children
are still applied, so the resource converges by itself once the Secret is
created or a GPU node joins (an autoscaler reacts to the pending pods).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from promptcache.api import PromptCacheDeployment
from promptcache.controller.errors import ApiError, ForbiddenError
from promptcache.controller.kube import Kube, by_kind
from promptcache.render.model_server import GPU_RESOURCE

log = logging.getLogger(__name__)

SECRET = by_kind("Secret")
NODE = by_kind("Node")


def referenced_secrets(pcd: PromptCacheDeployment) -> list[tuple[str, str, str]]:
    """(field path, Secret name, key) of every Secret the user names in the spec."""
    refs = []
    model = pcd.spec.model
    if model.hf_token_secret_ref is not None:
        ref = model.hf_token_secret_ref
        refs.append(("spec.model.hfTokenSecretRef", ref.name, ref.key))
    iso = pcd.spec.isolation
    if iso.salt_secret_ref is not None and pcd.spec.needs_salt_key:
        ref2 = iso.salt_secret_ref
        refs.append(("spec.isolation.saltSecretRef", ref2.name, ref2.key))
    return refs


async def missing_secret(kube: Kube, pcd: PromptCacheDeployment) -> str | None:
    """A message naming the first referenced Secret (or key) that is not there.

    The chart's RBAC does not let the operator read Secrets it did not create (a
    `secrets: get` cluster-wide would read every Secret of the cluster): then this check
    says nothing, and a missing Secret shows on the pods (`CreateContainerConfigError`).
    An operator granted `get` on Secrets (`promptcache run` as admin, a namespace-scoped
    Role of your own) reports it here."""
    namespace = pcd.metadata.namespace
    for path, name, key in referenced_secrets(pcd):
        try:
            secret = await kube.get(SECRET, namespace, name)
        except ForbiddenError:
            return None
        if secret is None:
            return (
                f"{path}: Secret {name!r} not found in namespace {namespace!r}; create it "
                f"(kubectl -n {namespace} create secret generic {name} --from-literal={key}=...)"
            )
        if key not in (secret.get("data") or {}) and key not in (secret.get("stringData") or {}):
            return f"{path}: Secret {name!r} has no key {key!r}; add it or set {path}.key"
    return None


def node_gpus(node: Mapping[str, Any], resource: str = GPU_RESOURCE) -> int:
    raw = (node.get("status", {}).get("allocatable") or {}).get(resource, 0)
    try:
        return int(str(raw))
    except ValueError:
        return 0


def _eligible(
    nodes: Sequence[Mapping[str, Any]], node_selector: Mapping[str, str]
) -> list[Mapping[str, Any]]:
    return [
        n
        for n in nodes
        if all(
            (n.get("metadata", {}).get("labels") or {}).get(k) == v
            for k, v in node_selector.items()
        )
    ]


def gpu_nodes_present(
    nodes: Sequence[Mapping[str, Any]],
    node_selector: Mapping[str, str],
    resource: str = GPU_RESOURCE,
) -> bool:
    """Does any node matching the nodeSelector offer GPUs at all? None: the GPU node pool
    looks scaled to zero, and its autoscaler adds a node for the pending pods."""
    return any(node_gpus(n, resource) > 0 for n in _eligible(nodes, node_selector))


def gpu_shortfall(
    nodes: Sequence[Mapping[str, Any]],
    gpus: int,
    node_selector: Mapping[str, str],
    resource: str = GPU_RESOURCE,
) -> str | None:
    """A message when no node (matching the nodeSelector) offers `gpus` GPUs."""
    if gpus <= 0:
        return None
    best = max((node_gpus(n, resource) for n in _eligible(nodes, node_selector)), default=0)
    if best >= gpus:
        return None
    where = "matching the pod's nodeSelector" if node_selector else "in the cluster"
    return (
        f"spec.model.resources.gpus={gpus} but the largest node {where} offers {best} "
        f"{resource}; lower gpus (e.g. tensor parallelism over fewer GPUs) or add a larger node"
    )


@dataclass
class NodeCache:
    """Nodes listed at most once per `ttl_s`: every resource's GPU check shares one read."""

    ttl_s: float = 30.0
    _nodes: list[dict[str, Any]] = field(default_factory=list)
    _at: float = float("-inf")

    async def get(self, kube: Kube) -> list[dict[str, Any]]:
        if time.monotonic() - self._at > self.ttl_s:
            self._nodes = await kube.list(NODE)
            self._at = time.monotonic()
        return self._nodes


@dataclass
class _Probe:
    present: bool = False
    next_check: float = float("-inf")
    backoff_s: float = 0.0


@dataclass
class GatewayApis:
    """Are the Gateway API / InferencePool kinds served? Checked with exponential back-off.

    A missing CRD is a steady state, not an error: it is re-checked after 10 s,
    20 s, ... up to `max_backoff_s`, logged once per change, and never retried
    per resource, so a cluster without them sees no error spam and no crash loop.
    """

    min_backoff_s: float = 10.0
    max_backoff_s: float = 300.0
    present_recheck_s: float = 300.0
    _probes: dict[tuple[str, str], _Probe] = field(default_factory=dict)

    def invalidate(self) -> None:
        """Forget what is known (an apply said 404: the CRD went away)."""
        for probe in self._probes.values():
            probe.next_check = float("-inf")

    async def served(self, kube: Kube, api_version: str, plural: str) -> bool:
        probe = self._probes.setdefault((api_version, plural), _Probe())
        now = time.monotonic()
        if now < probe.next_check:
            return probe.present
        try:
            doc = await kube.get_path(f"/apis/{api_version}")
        except ApiError as error:
            if not error.transient:  # 503: an aggregated API that is down is not served
                raise
            doc = None
        present = bool(doc) and any(
            r.get("name") == plural for r in (doc or {}).get("resources", [])
        )
        if present != probe.present or probe.next_check == float("-inf"):
            level = logging.INFO if present else logging.WARNING
            log.log(
                level, "%s %s is %s", api_version, plural, "served" if present else "not served"
            )
        probe.present = present
        if present:
            probe.backoff_s = 0.0
            probe.next_check = now + self.present_recheck_s
        else:
            probe.backoff_s = min(self.max_backoff_s, max(self.min_backoff_s, probe.backoff_s * 2))
            probe.next_check = now + probe.backoff_s
        return present

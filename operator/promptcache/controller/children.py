"""Turn render's pure manifests into the children the operator applies.

Render knows nothing of the live parent; here each manifest gets the
ownerReference that lets the garbage collector delete it with the resource
(controller=true, blockOwnerDeletion=true) and the hash annotation that lets a
resync skip unchanged children. Names always come from render: never
`generateName`, which would create a duplicate on every re-apply.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from promptcache.api.constants import API_VERSION, KIND
from promptcache.controller.compare import HASH_ANNOTATION, rendered_hash
from promptcache.controller.kube import Kind, by_kind
from promptcache.render import Names


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    meta = owner["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def owned(manifest: Mapping[str, Any], owner: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `manifest` owned by `owner`, carrying the hash of what was rendered."""
    child = copy.deepcopy(dict(manifest))
    meta = child.setdefault("metadata", {})
    if "generateName" in meta or not meta.get("name"):
        raise ValueError(f"{child.get('kind')} has no fixed name; children must be named")
    meta["ownerReferences"] = [owner_reference(owner)]
    digest = rendered_hash(child)
    meta["annotations"] = {**meta.get("annotations", {}), HASH_ANNOTATION: digest}
    return child


def controller_uid(live: Mapping[str, Any]) -> str | None:
    """The uid of the object's controlling owner, if any."""
    for ref in live.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def owning_resource(live: Mapping[str, Any]) -> str | None:
    """The name of the PromptCacheDeployment controlling a child, if one does."""
    for ref in live.get("metadata", {}).get("ownerReferences") or []:
        if (
            ref.get("controller")
            and ref.get("kind") == KIND
            and ref.get("apiVersion") == API_VERSION
        ):
            return str(ref["name"])
    return None


@dataclass(frozen=True)
class Prunable:
    """A kind of child that some specs render and others do not: when the spec stops
    rendering one of `names`, the prune phase deletes it if this resource controls it."""

    kind: Kind
    names: Callable[[Names], tuple[str, ...]]
    discovered: bool = False
    """Its CRD may be missing: pruned only while discovery says it is served."""


PRUNABLE: tuple[Prunable, ...] = (
    # parentRefs removed
    Prunable(by_kind("HTTPRoute"), lambda n: (n.route,), discovered=True),
    # monitoring turned off
    Prunable(by_kind("PodMonitor"), lambda n: (n.model_server, n.epp), discovered=True),
    # autoscaling turned off
    Prunable(by_kind("HorizontalPodAutoscaler"), lambda n: (n.instance,)),
    # no policy step in front of the picker any more, or gateway.networkPolicy off
    Prunable(by_kind("NetworkPolicy"), lambda n: (n.epp,)),
)
"""Every owned kind that can disappear from a render; every other child stays while its
resource does (the garbage collector removes all of them with it). The body-based router's
mapping ConfigMap is not here: it leaves the router before it goes (router_map.py)."""

"""The smallest valid resource and its manifests, for tests that change one field; and
finding one manifest among them."""

from __future__ import annotations

import copy
from typing import Any

from promptcache.api import parse_resource
from promptcache.render import render

BASE: dict[str, Any] = {
    "apiVersion": "serving.promptcache.io/v1alpha1",
    "kind": "PromptCacheDeployment",
    "metadata": {"name": "chat", "namespace": "serving"},
    "spec": {"model": {"name": "org/model", "replicas": 2}},
}


def rendered(**spec: Any) -> list[dict[str, Any]]:
    """The manifests of BASE with `spec` merged over its top-level spec fields."""
    doc = copy.deepcopy(BASE)
    doc["spec"].update(spec)
    return render(parse_resource(doc))


def by_kind(
    manifests: list[dict[str, Any]], kind: str, component: str | None = None
) -> dict[str, Any]:
    """The one manifest of `kind` (and component label, when given) in `manifests`."""
    found = [
        m
        for m in manifests
        if m["kind"] == kind
        and (
            component is None or m["metadata"]["labels"]["app.kubernetes.io/component"] == component
        )
    ]
    assert len(found) == 1, f"{kind}/{component}: {len(found)}"
    return found[0]

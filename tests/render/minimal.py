"""The smallest valid resource and its manifests, for render tests that change one field."""

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

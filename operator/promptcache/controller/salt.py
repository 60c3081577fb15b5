"""The generated salt-key Secret: made once, never rewritten, never logged.

When the spec names no Secret, the pods read the HMAC key that turns tenant
isolation keys into cache salts from `<name>-salt`. Regenerating it would
silently move every tenant to a fresh, cold cache, so it is created with POST
only: a 409 means it is already there and is kept as it is, across reconciles
and operator restarts. It is owned by the resource, so it goes with it.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Mapping
from typing import Any

from promptcache.api import PromptCacheDeployment
from promptcache.controller.children import owner_reference
from promptcache.controller.kube import Kube, by_kind
from promptcache.render import Names
from promptcache.render.front import salt_secret
from promptcache.render.names import Component, labels

SECRET = by_kind("Secret")


def generated_salt_secret(pcd: PromptCacheDeployment, names: Names) -> tuple[str, str] | None:
    """(name, key) of the Secret the operator must generate, or None when it need not."""
    if pcd.spec.isolation.salt_secret_ref is not None:
        return None
    return salt_secret(pcd, names)  # None unless the spec needs a salt key


async def ensure_salt_secret(
    kube: Kube,
    pcd: PromptCacheDeployment,
    names: Names,
    owner: Mapping[str, Any],
    ensured: set[str] | None = None,
) -> bool:
    """Create the generated Secret if absent; True when this call created it.

    Create-only, never a read: the operator holds `secrets: create` and no `get`, so it
    cannot read any Secret of the cluster. A 409 means the Secret is there already (keep
    it, whoever made it). `ensured` remembers which Secrets this process has seen exist,
    so an idle resync sends nothing."""
    wanted = generated_salt_secret(pcd, names)
    if wanted is None:
        return False
    name, key = wanted
    seen = f"{owner['metadata']['uid']}/{name}"
    if ensured is not None and seen in ensured:
        return False
    value = base64.b64encode(secrets.token_hex(32).encode()).decode()
    manifest = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": names.namespace,
            "labels": labels(names, Component.ISOLATION),
            "ownerReferences": [owner_reference(owner)],
        },
        "type": "Opaque",
        "data": {key: value},
    }
    del value
    created = await kube.create(manifest) is not None
    del manifest
    if ensured is not None:
        ensured.add(seen)
    return created

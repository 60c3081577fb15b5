"""A body-based router's mapping leaves the router's map before its ConfigMap is deleted.

GIE's `bbr` v1.5.0 never sees a deleted mapping ConfigMap: its reconciler gets the deleted
object back empty and removes the mappings of `""/""`, so the names of a deleted mapping stay
mapped until the router restarts (`e2e/test_bbr.py` pins it). It does see a mapping lose its
`bbr-managed` label. So a mapping on its way out is first unlabelled, stays so for
`SETTLE_SECONDS` (the router reads the change through its watch within milliseconds), and
only then goes. Every way out is held until then:

* `routeByModel` turned off: instead of the prune phase's delete, unlabel, settle, delete;
* the resource deleted: while it renders a mapping the resource carries `MAPPING_FINALIZER`,
  so its deletion waits for unlabel and settle (the garbage collector then deletes the
  unlabelled ConfigMap);
* the ConfigMap deleted any other way (its namespace deleted, by hand): it carries the same
  finalizer (rendered), so it stays, terminating, until unlabelled and settled.

Why finalizers, which the operator otherwise avoids (controller/resync.py): without one the
garbage collector, or the namespace controller, deletes the ConfigMap as the resource goes,
faster than any watch-triggered unlabel, and the router keeps the names. The cost: deleting
a resource that routes by model, or its namespace, waits for the operator (about
`SETTLE_SECONDS` plus a reconcile while it runs; until it is back when it is not; after an
uninstall, `kubectl patch ... -p '{"metadata":{"finalizers":null}}'` releases them). Only
resources with `routeByModel` carry it. The decision is pure (`plan_exit`); the phase in
`reconcile.py` applies it.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from promptcache.contract.router import MAPPING_FINALIZER, MAPPING_LABEL, MAPPING_UNMAPPED_AT

SETTLE_SECONDS: Final = 2.0
"""How long a mapping stays unlabelled before it may go."""


def _escape(key: str) -> str:
    """A JSON-pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _parse_time(raw: str | None) -> datetime.datetime | None:
    if not raw:
        return None
    try:
        return datetime.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None


@dataclass
class Exit:
    """What to do now with one mapping ConfigMap, and whether it is out of the router."""

    patches: list[list[dict[str, Any]]] = field(default_factory=list)
    """JSON patches for the ConfigMap, in order."""
    delete: bool = False
    requeue_after_s: float | None = None
    done: bool = False
    """The router no longer maps it (gone, or unlabelled and settled): the resource may go."""


def _guard(live: Mapping[str, Any]) -> dict[str, Any]:
    rv = str(live["metadata"].get("resourceVersion", ""))
    return {"op": "test", "path": "/metadata/resourceVersion", "value": rv}


def release_finalizer(live: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The JSON patch that takes `MAPPING_FINALIZER` off `live` (None: it has none)."""
    finalizers = list(live["metadata"].get("finalizers") or [])
    if MAPPING_FINALIZER not in finalizers:
        return None
    rest = [f for f in finalizers if f != MAPPING_FINALIZER]
    return [_guard(live), {"op": "replace", "path": "/metadata/finalizers", "value": rest}]


def hold_finalizer(live: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The JSON patch that puts `MAPPING_FINALIZER` on `live` (None: it has it)."""
    finalizers = list(live["metadata"].get("finalizers") or [])
    if MAPPING_FINALIZER in finalizers:
        return None
    return [
        _guard(live),
        {"op": "add", "path": "/metadata/finalizers", "value": [*finalizers, MAPPING_FINALIZER]},
    ]


def plan_exit(live: Mapping[str, Any] | None, *, wanted: bool, now: datetime.datetime) -> Exit:
    """For the live mapping ConfigMap of a resource: `wanted` says the resource renders it
    and is not being deleted. A mapping that is wanted and not being deleted stays as apply
    keeps it; any other is unlabelled, left to settle, then released and deleted."""
    if live is None:
        return Exit(done=True)
    meta = live["metadata"]
    terminating = bool(meta.get("deletionTimestamp"))
    if wanted and not terminating:
        return Exit()
    if (meta.get("labels") or {}).get(MAPPING_LABEL) is not None:
        stamp = now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        ops: list[dict[str, Any]] = [
            _guard(live),
            {"op": "remove", "path": f"/metadata/labels/{_escape(MAPPING_LABEL)}"},
        ]
        if meta.get("annotations"):
            path = f"/metadata/annotations/{_escape(MAPPING_UNMAPPED_AT)}"
            ops.append({"op": "add", "path": path, "value": stamp})
        else:
            ops.append(
                {
                    "op": "add",
                    "path": "/metadata/annotations",
                    "value": {MAPPING_UNMAPPED_AT: stamp},
                }
            )
        return Exit(patches=[ops], requeue_after_s=SETTLE_SECONDS)
    since = _parse_time((meta.get("annotations") or {}).get(MAPPING_UNMAPPED_AT))
    waited = (now - since).total_seconds() if since is not None else SETTLE_SECONDS
    if waited < SETTLE_SECONDS:
        return Exit(requeue_after_s=SETTLE_SECONDS - waited)
    release = release_finalizer(live)
    return Exit(patches=[release] if release is not None else [], delete=not terminating, done=True)

"""What the picker itself scored for one request, read from its debug log.

A test that proves a scorer's effect needs the picker's view at the pick, not the pods'
view a moment before or after it: GIE scores from its own last scrape of each pod (every
50 ms, on its own goroutine), so a premise read from the engine can hold while the picker
still scores from an older scrape. At `--zap-log-level=4` (GIE's `DEBUG`) the scheduler
logs one JSON line per scorer and endpoint (`"Calculated score"`, with the request's
`x-request-id`); `scores_of` turns those lines into `{pod: {scorer type: score}}`.

GIE v1.5.0 `pkg/epp/scheduling/scheduler_profile.go` `runScorerPlugins`; endpoints are
named `<pod>-rank-<n>` (`pkg/epp/datastore/datastore.go`), one per vLLM data-parallel rank.
"""

from __future__ import annotations

import json
from typing import Final

DEBUG_LOG_ARG: Final[str] = "--zap-log-level=4"
"""GIE's `logutil.DEBUG`: the level at which it logs each scorer's score per endpoint."""

_REQUEST_ID_KEY: Final[str] = "x-request-id"
_SCORED: Final[str] = "Calculated score"


def _pod_of(endpoint: object) -> str:
    """The endpoint's NamespacedName -> its pod's name. Kubernetes' `NamespacedName` logs
    itself through `logr.Marshaler` as `{"name": "<pod>-rank-0", "namespace": ...}`; its
    text form `namespace/name` is read too."""
    if isinstance(endpoint, dict):
        name = next((v for k, v in endpoint.items() if k.lower() == "name"), "")
    else:
        name = str(endpoint)
    name = str(name).rsplit("/", 1)[-1]
    head, sep, rank = name.rpartition("-rank-")
    return head if sep and rank.isdigit() else name


def _scorer_of(plugin: object) -> str:
    """A TypedName (`{"type": ..., "name": ...}`, or its `name/type` text) -> its type."""
    if isinstance(plugin, dict):
        return str(plugin.get("type") or plugin.get("Type") or plugin)
    return str(plugin).rsplit("/", 1)[-1]


def scores_of(log_text: str, request_id: str) -> dict[str, dict[str, float]]:
    """Per pod, per scorer type, the score the picker gave for the request `request_id`
    (empty when the picker did not log it: not yet flushed, or not run at DEBUG)."""
    out: dict[str, dict[str, float]] = {}
    for line in log_text.splitlines():
        if _SCORED not in line or request_id not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("msg") != _SCORED or entry.get(_REQUEST_ID_KEY) != request_id:
            continue
        pod = _pod_of(entry.get("endpoint"))
        out.setdefault(pod, {})[_scorer_of(entry.get("plugin"))] = float(entry["score"])
    return out

"""Standard Kubernetes conditions with honest transition times.

`lastTransitionTime` moves only when a condition's status changes; a new reason
or message under the same status is an update, not a transition. The setter
reports whether anything changed so the caller writes status only when needed
(the kueue pattern).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Literal

from promptcache.controller.diagnose import NOT_READY_WARNINGS

Status = Literal["True", "False", "Unknown"]


@dataclass(frozen=True)
class Desired:
    """What one condition should say now."""

    type: str
    status: Status
    reason: str
    message: str = ""


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def find(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def set_condition(
    conditions: list[dict[str, Any]], desired: Desired, *, generation: int | None, now: str
) -> tuple[list[dict[str, Any]], bool]:
    """Return the conditions with `desired` set, and whether its status transitioned."""
    old = find(conditions, desired.type)
    transitioned = old is None or old.get("status") != desired.status
    new: dict[str, Any] = {
        "type": desired.type,
        "status": desired.status,
        "reason": desired.reason,
        "message": desired.message,
        "lastTransitionTime": now if transitioned or old is None else old["lastTransitionTime"],
    }
    if generation is not None:
        new["observedGeneration"] = generation
    rest = [c for c in conditions if c.get("type") != desired.type]
    index = next((i for i, c in enumerate(conditions) if c.get("type") == desired.type), None)
    if index is None:
        return [*rest, new], True
    out = list(conditions)
    out[index] = new
    return out, transitioned


def transitions(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Conditions of `new` whose status or reason differs from `old` (for Events)."""
    changed = []
    for cond in new:
        before = find(old, cond["type"])
        if (
            before is None
            and cond["type"] != "Degraded"
            and cond["status"] != "True"
            and cond["reason"] not in NOT_READY_WARNINGS
        ):
            # a first "not yet" (Ready=False, ...) is not news; later flips are. A first one
            # that already names a pod problem (Unschedulable, ImagePullBackOff, ...) is: the
            # operator may first look only once the scheduler has spoken, and the Event must
            # not depend on that race.
            continue
        if before is None and cond["type"] == "Degraded" and cond["status"] != "True":
            continue  # nor is a first "not degraded"
        if before is None or (before.get("status"), before.get("reason")) != (
            cond["status"],
            cond["reason"],
        ):
            changed.append(cond)
    return changed

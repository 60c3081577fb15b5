"""Why model-server pods are not ready, read from the pods themselves (pure).

`0/2 ready` is not an answer. The kubelet and the scheduler already say why a pod
is not ready: a waiting container's reason (`ImagePullBackOff`, `CrashLoopBackOff`,
...), the `PodScheduled=False/Unschedulable` condition with the scheduler's message,
a running container whose startup probe has not passed yet (vLLM loading weights).
This module picks the most telling of those across the pods and turns it into a
condition reason and a message that names the pod, the container, the image and
the field to fix.

Severity: a `failure` needs the user (a bad image, a crashing container, a pod no
node can ever take); otherwise it is a wait (weights loading, a GPU node pool
scaling up from zero) and only a warning.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from promptcache.api.status import Reason
from promptcache.render.front import FRONT_CONTAINER
from promptcache.render.model_server import GPU_RESOURCE, STARTUP_BUDGET_SECONDS, VLLM_CONTAINER

# The user fixes these; the others resolve by themselves (or by an autoscaler).
FAILURES: Final[frozenset[str]] = frozenset(
    {
        Reason.IMAGE_PULL_BACK_OFF,
        Reason.CRASH_LOOP_BACK_OFF,
        Reason.CONTAINER_CONFIG_ERROR,
        Reason.UNSCHEDULABLE,
    }
)
NOT_READY_WARNINGS: Final[frozenset[str]] = FAILURES | {Reason.CONTAINERS_NOT_READY}
"""Ready=False reasons whose transition is posted as a Warning Event (the rest are Normal)."""

_IMAGE_FIELD: Final[dict[str, str]] = {
    VLLM_CONTAINER: "spec.model.image",
    FRONT_CONTAINER: "spec.front.image",
}
_PULL_REASONS: Final[frozenset[str]] = frozenset(
    {"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull"}
)
_CONFIG_REASONS: Final[frozenset[str]] = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
)
# Lower rank wins: the most actionable explanation is shown when pods disagree.
_RANK: Final[dict[str, int]] = {
    Reason.IMAGE_PULL_BACK_OFF: 0,
    Reason.CONTAINER_CONFIG_ERROR: 1,
    Reason.CRASH_LOOP_BACK_OFF: 2,
    Reason.UNSCHEDULABLE: 3,
    Reason.LOADING_WEIGHTS: 5,
    Reason.CONTAINERS_NOT_READY: 6,
    Reason.PODS_STARTING: 7,
}


@dataclass(frozen=True)
class Diagnosis:
    reason: str
    message: str
    failure: bool
    """The user must act (Degraded=True); otherwise it is a wait, shown as a warning only."""


def _parse_time(raw: Any) -> datetime.datetime | None:
    try:
        return datetime.datetime.strptime(str(raw), "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.UTC
        )
    except ValueError:
        return None


def _duration(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h{(s % 3600) // 60}m"


def _is_ready(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _condition(pod: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return None


def _requests_gpus(pod: Mapping[str, Any]) -> bool:
    for container in (pod.get("spec") or {}).get("containers") or []:
        res = container.get("resources") or {}
        for part in ("limits", "requests"):
            if str((res.get(part) or {}).get(GPU_RESOURCE, "0")) not in ("0", ""):
                return True
    return False


def _container_image(pod: Mapping[str, Any], name: str, status: Mapping[str, Any]) -> str:
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == name:
            return str(container.get("image") or status.get("image") or "")
    return str(status.get("image") or "")


def _explain_pod(pod: Mapping[str, Any], now: datetime.datetime) -> Diagnosis | None:
    """One not-ready pod's explanation (None when the pod is ready or going away)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp") or _is_ready(pod):
        return None
    name = str(meta.get("name", "?"))
    scheduled = _condition(pod, "PodScheduled")
    if scheduled and scheduled.get("status") == "False":
        said = str(scheduled.get("message") or "no scheduler message").strip()
        if scheduled.get("reason") == "Unschedulable":
            said = said.rstrip(".")
            if _requests_gpus(pod):
                # A GPU node pool commonly scales from zero: no node fits until its autoscaler
                # reacts to this very pod. That is a wait, not a mistake.
                return Diagnosis(
                    Reason.UNSCHEDULABLE,
                    f"pod {name} cannot be scheduled yet: {said}. Waiting for a GPU node: a "
                    "node pool that scales from zero adds one when its autoscaler sees this "
                    "pod; otherwise add GPU nodes or check spec.model.nodeSelector, "
                    "spec.model.tolerations and spec.model.resources.gpus",
                    failure=False,
                )
            return Diagnosis(
                Reason.UNSCHEDULABLE,
                f"pod {name} cannot be scheduled: {said}. Check spec.model.nodeSelector, "
                "spec.model.tolerations and spec.model.resources",
                failure=True,
            )
    statuses = list(status.get("containerStatuses") or [])
    for cs in statuses:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        why = str(waiting.get("reason") or "")
        cname = str(cs.get("name", "?"))
        detail = str(waiting.get("message") or "").strip()
        if why in _PULL_REASONS:
            image = _container_image(pod, cname, cs)
            field = _IMAGE_FIELD.get(cname, "the image")
            return Diagnosis(
                Reason.IMAGE_PULL_BACK_OFF,
                f"pod {name} container {cname}: image {image!r} cannot be pulled ({why}"
                f"{': ' + detail if detail else ''}); check {field} and the registry "
                "credentials (imagePullSecrets)",
                failure=True,
            )
        if why in _CONFIG_REASONS:
            return Diagnosis(
                Reason.CONTAINER_CONFIG_ERROR,
                f"pod {name} container {cname} cannot start ({why}"
                f"{': ' + detail if detail else ''})",
                failure=True,
            )
        if why == "CrashLoopBackOff":
            last = (cs.get("lastState") or {}).get("terminated") or {}
            exit_part = (
                f", last exit code {last.get('exitCode')}"
                f"{' (' + str(last['reason']) + ')' if last.get('reason') else ''}"
                if last
                else ""
            )
            return Diagnosis(
                Reason.CRASH_LOOP_BACK_OFF,
                f"pod {name} container {cname} is crash-looping ({cs.get('restartCount', 0)} "
                f"restarts{exit_part}); see kubectl logs -n {meta.get('namespace', '')} {name} "
                f"-c {cname} --previous",
                failure=True,
            )
    for cs in statuses:
        running = (cs.get("state") or {}).get("running")
        if cs.get("name") == VLLM_CONTAINER and running is not None and not cs.get("started"):
            since = _parse_time(running.get("startedAt"))
            elapsed = f" for {_duration((now - since).total_seconds())}" if since else ""
            return Diagnosis(
                Reason.LOADING_WEIGHTS,
                f"pod {name}: vLLM is loading the model{elapsed} (startup probe not passed "
                f"yet; it may take up to {STARTUP_BUDGET_SECONDS // 60}m)",
                failure=False,
            )
    not_ready = [
        str(cs.get("name"))
        for cs in statuses
        if (cs.get("state") or {}).get("running") is not None and not cs.get("ready")
    ]
    if not_ready:
        return Diagnosis(
            Reason.CONTAINERS_NOT_READY,
            f"pod {name}: container {', '.join(sorted(not_ready))} running but not ready "
            "(readiness probe failing)",
            failure=False,
        )
    return Diagnosis(
        Reason.PODS_STARTING, f"pod {name} is starting ({status.get('phase', '?')})", failure=False
    )


def diagnose(
    pods: Sequence[Mapping[str, Any]], *, now: datetime.datetime | None = None
) -> Diagnosis | None:
    """The most actionable reason any pod is not ready, with how many pods share it."""
    at = now or datetime.datetime.now(datetime.UTC)
    found = [d for d in (_explain_pod(p, at) for p in pods) if d is not None]
    if not found:
        return None
    best = min(found, key=lambda d: (_RANK.get(d.reason, len(_RANK)), not d.failure))
    same = sum(1 for d in found if d.reason == best.reason)
    if same > 1:
        return Diagnosis(
            best.reason, f"{best.message}; {same - 1} more pod(s) likewise", best.failure
        )
    return best

"""The resource's conditions: what each says, built here, and honest transition times.

Every condition of `.status` is built in this module from what a reconcile observed:
`Ready`, `Progressing`, `Degraded` and `GatewayReady` (`ready`, `progressing`,
`degraded`, `gateway`), the reconciler's own GatewayReady verdicts before the
Gateway's is read (`gateway_precondition`), and `MonitoringReady` (`monitoring`).
The Gateway controller's verdict on the route and pool is read by
`gateway_status.gateway_view`, which quotes it.

`lastTransitionTime` moves only when a condition's status changes; a new reason
or message under the same status is an update, not a transition. The setter
reports whether anything changed so the caller writes status only when needed
(the kueue pattern).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from promptcache.api.status import ConditionType, Reason
from promptcache.controller.diagnose import NOT_READY_WARNINGS
from promptcache.controller.observation import Desired, Observation, Status

__all__ = [
    "Desired",
    "Status",
    "degraded",
    "find",
    "gateway",
    "gateway_precondition",
    "monitoring",
    "now_rfc3339",
    "progressing",
    "ready",
    "set_condition",
    "transitions",
]


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


def _deploy_status(deployment: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict((deployment or {}).get("status") or {})


def progressing(obs: Observation) -> Desired:
    """Progressing: the model-server rollout, from its Deployment."""
    if obs.blocked is not None:
        return Desired(ConditionType.PROGRESSING, "False", obs.blocked.reason, obs.blocked.message)
    if obs.model_server is None:
        return Desired(ConditionType.PROGRESSING, "True", Reason.ROLLING_OUT, "applying children")
    meta, st = obs.model_server.get("metadata", {}), _deploy_status(obs.model_server)
    want = obs.desired_replicas
    updated, total = int(st.get("updatedReplicas") or 0), int(st.get("replicas") or 0)
    if int(st.get("observedGeneration") or 0) < int(meta.get("generation") or 0):
        return Desired(ConditionType.PROGRESSING, "True", Reason.ROLLING_OUT, "rollout starting")
    if updated < want or total > want:
        return Desired(
            ConditionType.PROGRESSING,
            "True",
            Reason.ROLLING_OUT,
            f"{updated}/{want} model-server pods updated, {total} running",
        )
    return Desired(ConditionType.PROGRESSING, "False", Reason.RECONCILED, "rollout complete")


def ready(obs: Observation) -> Desired:
    """Ready: enough model-server pods ready; else the most actionable reason why not."""
    if obs.blocked is not None:
        return Desired(ConditionType.READY, "False", obs.blocked.reason, obs.blocked.message)
    want = obs.desired_replicas
    count = int(_deploy_status(obs.model_server).get("readyReplicas") or 0)
    if want == 0:
        return Desired(ConditionType.READY, "True", Reason.SCALED_TO_ZERO, "spec.model.replicas=0")
    if count >= want:
        return Desired(ConditionType.READY, "True", Reason.AVAILABLE, f"{count}/{want} ready")
    message = f"{count}/{want} model-server pods ready"
    if obs.degraded is not None:
        message += f" ({obs.degraded.message})"
    elif obs.pods is not None:
        return Desired(
            ConditionType.READY, "False", obs.pods.reason, f"{message}: {obs.pods.message}"
        )
    return Desired(ConditionType.READY, "False", Reason.REPLICAS_NOT_READY, message)


def degraded(obs: Observation) -> Desired:
    """Degraded: something the user must fix (the spec, the cluster, a failing pod)."""
    problem = obs.blocked or obs.degraded
    if problem is not None:
        return Desired(ConditionType.DEGRADED, "True", problem.reason, problem.message)
    if obs.pods is not None and obs.pods.failure:
        return Desired(ConditionType.DEGRADED, "True", obs.pods.reason, obs.pods.message)
    return Desired(ConditionType.DEGRADED, "False", Reason.AS_EXPECTED, "")


def gateway(obs: Observation) -> Desired:
    """GatewayReady as observed (`obs.gateway`), or why it could not be."""
    if obs.blocked is not None:
        return Desired(
            ConditionType.GATEWAY_READY, "False", obs.blocked.reason, obs.blocked.message
        )
    return obs.gateway or Desired(ConditionType.GATEWAY_READY, "Unknown", "Pending", "")


def gateway_precondition(
    *, missing_kinds: Sequence[str], epp_name: str, want: int, ready_replicas: int
) -> Desired | None:
    """GatewayReady=False before the Gateway's verdict counts: CRDs missing, or the
    Endpoint Picker not ready; None when the Gateway's own status decides."""
    if missing_kinds:
        return Desired(
            ConditionType.GATEWAY_READY,
            "False",
            Reason.CRD_NOT_INSTALLED,
            f"the {' and '.join(missing_kinds)} CRD is not installed; the model servers are "
            "managed without a gateway. Install the Gateway API and Inference Extension CRDs.",
        )
    if ready_replicas < want:
        return Desired(
            ConditionType.GATEWAY_READY,
            "False",
            Reason.REPLICAS_NOT_READY,
            f"Endpoint Picker {epp_name}: {ready_replicas}/{want} ready",
        )
    return None


def monitoring(
    *, served: bool, api: str, pod_monitors: Sequence[str], applied: Sequence[str]
) -> Desired:
    """MonitoringReady while monitoring is on: the PodMonitor CRD served, ours applied.

    `pod_monitors`: the model servers' and the picker's PodMonitor names, in that order."""
    if not served:
        return Desired(
            ConditionType.MONITORING_READY,
            "False",
            Reason.PROMETHEUS_OPERATOR_NOT_INSTALLED,
            f"spec.monitoring.enabled, but {api} PodMonitor is not served: install "
            "the Prometheus Operator CRDs (or scrape the pods yourself, docs/monitoring.md); "
            "everything else is managed as usual",
        )
    if any(name not in applied for name in pod_monitors):
        return Desired(
            ConditionType.MONITORING_READY, "False", Reason.APPLY_FAILED,
            "PodMonitors not applied yet (see Degraded)",
        )  # fmt: skip
    model_server, epp = pod_monitors
    return Desired(
        ConditionType.MONITORING_READY,
        "True",
        Reason.POD_MONITORS_APPLIED,
        f"PodMonitor {model_server} (model servers) and {epp} (Endpoint Picker) applied",
    )

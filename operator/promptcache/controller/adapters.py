"""Per-adapter status: on how many ready pods each adapter is served, and why not (pure).

Three sources, all the engine's and the kubelet's own word, none of them a guess from the
spec alone:

* **what the pod was started with**: the vllm container's `--lora-modules` in the pod's
  own spec (name and path of every adapter). A pod started before the last change of an
  adapter says nothing about the adapter as it is now: its failures are not the current
  definition's, and its `/v1/models` serves the adapter by name only ("an older version").
* **what a ready pod serves**: its `GET /v1/models` (through the front, a read-only route)
  lists the base model and every adapter loaded; an adapter listed is served from the
  source the pod was started with (vLLM's `root` is that path as the engine resolved it,
  not necessarily the spec's string). vLLM loads `--lora-modules` at start and refuses to
  start when one fails, and the front never forwards vLLM's runtime LoRA API, so this list
  cannot change while the engine runs: it is read once per engine start
  (`ServedModelsCache`), not per reconcile.
* **why an engine stopped**: the vllm container's termination message. The rendered
  `terminationMessagePolicy: FallbackToLogsOnError` makes the kubelet keep the tail of a
  failed container's log there (80 lines, at most 2048 bytes), in the pod object the
  reconcile already lists: no log read (and no `pods/log` permission), no extra request.
  vLLM 0.33 names the adapter in one failure only, the one it raises when no adapter is at
  the path (or none can be downloaded; it prints `<path>` for the path). A rank above
  `--max-lora-rank` is reported with the rank but not the name: the adapters whose declared
  `rank` equals it are blamed, else those whose rank is not declared, else every adapter
  not shown loaded, and the message says which it was. Any other failure inside vLLM's
  static LoRA loading is put on every adapter the tail does not show loaded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from promptcache.api.spec import LoraAdapter
from promptcache.api.status import AdapterReason, AdapterReasonName, AdapterStatus
from promptcache.contract import VllmFlag
from promptcache.render.model_server import VLLM_CONTAINER

NOT_FOUND: Final = re.compile(r"Loading lora (?P<name>\S+) failed: No adapter found for \S+")
LOADED: Final = re.compile(r"Loaded new LoRA adapter: name '(?P<name>[^']+)'")
RANK: Final = re.compile(r"LoRA rank (?P<rank>\d+) is greater than max_lora_rank (?P<max>\d+)")
STATIC_LOAD_FRAME: Final = "init_static_loras"
"""vLLM's start-up step that loads `--lora-modules`: a traceback through it blames an adapter."""
ERROR_LINE: Final = re.compile(r"^(?:\w+\.)*\w*(?:Error|Exception): (?P<said>.+)$", re.M)
MAX_MESSAGE: Final = 512

PodKey = tuple[str, int]
"""(pod uid, the vllm container's restart count): one engine start."""


@dataclass(frozen=True)
class AdapterFailure:
    reason: AdapterReasonName
    message: str


@dataclass(frozen=True)
class ReadyPod:
    """A ready model-server pod as the status needs it."""

    ip: str
    key: PodKey
    sources: Mapping[str, str]
    """The adapters it was started with: name -> path or repository id."""


def served_models(body: bytes) -> dict[str, str] | None:
    """An OpenAI `ModelList` as id -> root (`""` when absent); None: not a model list."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeError):
        return None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return None
    return {
        str(m["id"]): str(m.get("root") or "") for m in data if isinstance(m, dict) and "id" in m
    }


def _vllm(pod: Mapping[str, Any], part: str) -> Mapping[str, Any]:
    """The vllm container's spec (`part="spec"`) or status (`"status"`), empty if absent."""
    if part == "spec":
        items = ((pod.get("spec") or {}).get("containers")) or []
    else:
        items = ((pod.get("status") or {}).get("containerStatuses")) or []
    return next((c for c in items if c.get("name") == VLLM_CONTAINER), {})


def started_with(pod: Mapping[str, Any]) -> dict[str, str]:
    """The adapters a pod's engine was started with (its `--lora-modules`): name -> source.

    The renderer writes each item as JSON; vLLM also reads `name=path`, so that is read too
    (a hand-edited pod), and anything else is skipped."""
    args = [str(a) for a in (_vllm(pod, "spec").get("args") or [])]
    if VllmFlag.LORA_MODULES not in args:
        return {}
    out: dict[str, str] = {}
    for item in args[args.index(VllmFlag.LORA_MODULES) + 1 :]:
        if item.startswith("--"):
            break
        try:
            module = json.loads(item)
        except ValueError:
            name, sep, path = item.partition("=")
            if sep:
                out[name] = path
            continue
        if isinstance(module, dict) and "name" in module:
            out[str(module["name"])] = str(module.get("path", ""))
    return out


def pod_key(pod: Mapping[str, Any]) -> PodKey:
    return (
        str((pod.get("metadata") or {}).get("uid", "")),
        int(_vllm(pod, "status").get("restartCount") or 0),
    )


def _termination_messages(pod: Mapping[str, Any]) -> list[str]:
    """The vllm container's current and last termination messages."""
    status = _vllm(pod, "status")
    out = []
    for state in (status.get("state") or {}, status.get("lastState") or {}):
        message = (state.get("terminated") or {}).get("message")
        if message:
            out.append(str(message))
    return out


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


def _rank_suspects(
    message: str, rank: re.Match[str], suspects: Sequence[LoraAdapter]
) -> dict[str, AdapterFailure]:
    said, reported, limit = rank[0], int(rank["rank"]), rank["max"]
    fix = f"raise engine.maxLoraRank to at least {reported}, or replace the adapter"
    exact = [a for a in suspects if a.rank == reported]
    if exact:
        why = f"vLLM: {said}; {fix}"
        return {a.name: AdapterFailure(AdapterReason.RANK_OVER_LIMIT, _short(why)) for a in exact}
    undeclared = [a for a in suspects if a.rank is None]
    blamed = undeclared or list(suspects)
    hint = (
        "its rank is not declared (model.adapters[].rank)"
        if undeclared
        else "the declared ranks do not say which (check model.adapters[].rank)"
    )
    why = (
        f"vLLM refused an adapter of rank {reported} (max_lora_rank {limit}) without naming "
        f"it, and this one may be it: {hint}; {fix}"
    )
    return {a.name: AdapterFailure(AdapterReason.RANK_OVER_LIMIT, _short(why)) for a in blamed}


def failure_in(message: str, adapters: Sequence[LoraAdapter]) -> dict[str, AdapterFailure]:
    """The adapters a vllm termination message blames, and why (empty: not an adapter's
    fault). `adapters` are those the failed engine was started with."""
    by_name = {a.name: a for a in adapters}
    found = NOT_FOUND.search(message)
    if found is not None:
        adapter = by_name.get(found["name"])
        if adapter is None:  # named, and not one of these: its own business
            return {}
        where = "path" if adapter.path else "huggingFaceRepo"
        why = (
            f"vLLM: {found[0]}; no PEFT adapter (adapter_config.json and weights) at "
            f"{adapter.source!r}: fix model.adapters[].{where}"
            + (" or the volume the podTemplate mounts there" if adapter.path else "")
        )
        return {adapter.name: AdapterFailure(AdapterReason.NOT_FOUND, _short(why))}
    rank = RANK.search(message)
    if STATIC_LOAD_FRAME not in message and rank is None:
        return {}
    loaded = {m["name"] for m in LOADED.finditer(message)}
    suspects = [a for a in adapters if a.name not in loaded]
    if rank is not None:
        return _rank_suspects(message, rank, suspects)
    errors = list(ERROR_LINE.finditer(message))
    said = errors[-1]["said"] if errors else "see the vllm container's log"
    why = f"vLLM stopped while loading adapters, without naming the one: {said}"
    return {a.name: AdapterFailure(AdapterReason.LOAD_FAILED, _short(why)) for a in suspects}


def adapter_failures(
    pods: Iterable[Mapping[str, Any]], adapters: Sequence[LoraAdapter]
) -> dict[str, AdapterFailure]:
    """What the pods' engines said when they stopped, per adapter (the first pod's word).

    A pod counts only for the adapters it was started with as they are defined now: a pod
    of an earlier version of the list failing on an adapter since fixed says nothing."""
    out: dict[str, AdapterFailure] = {}
    for pod in pods:
        messages = _termination_messages(pod)
        if not messages:
            continue
        sources = started_with(pod)
        current = [a for a in adapters if sources.get(a.name) == a.source]
        for message in messages:
            for name, failure in failure_in(message, current).items():
                out.setdefault(name, failure)
    return out


def ready_pods(pods: Iterable[Mapping[str, Any]]) -> list[ReadyPod]:
    """The pods that are Ready, not terminating and have an IP."""
    out = []
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        status = pod.get("status") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        if ready and status.get("podIP"):
            out.append(ReadyPod(str(status["podIP"]), pod_key(pod), started_with(pod)))
    return out


class ServedModelsCache:
    """What each engine start listed at `/v1/models`, per resource, for its ready pods.

    The list cannot change while the engine runs (static adapters, and the front never
    forwards vLLM's runtime LoRA API), so a pod costs one request per engine start, not one
    per reconcile. Each observation replaces a resource's entries with those of its ready
    pods now, so the cache holds at most one entry per ready pod of each resource."""

    def __init__(self) -> None:
        self._by_resource: dict[str, dict[PodKey, dict[str, str]]] = {}

    def get(self, uid: str, key: PodKey) -> dict[str, str] | None:
        return self._by_resource.get(uid, {}).get(key)

    def replace(self, uid: str, entries: dict[PodKey, dict[str, str]]) -> None:
        self._by_resource[uid] = entries

    def forget(self, uid: str) -> None:
        self._by_resource.pop(uid, None)

    def __len__(self) -> int:
        return sum(len(e) for e in self._by_resource.values())


def adapter_status(
    adapters: Sequence[LoraAdapter],
    served_by_pod: Mapping[str, Mapping[str, str]],
    failures: Mapping[str, AdapterFailure],
) -> list[AdapterStatus]:
    """One entry per adapter, in the list's order.

    `served_by_pod` holds what each ready pod that answered `/v1/models` lists (id ->
    root); a pod that did not answer is left out (it says nothing either way).
    `readyReplicas` counts the ready pods that serve the name; `Served` needs every one of
    them to serve it from the source the spec names now."""
    out = []
    pods = len(served_by_pod)
    reason: AdapterReasonName
    for adapter in adapters:
        roots = [s[adapter.name] for s in served_by_pod.values() if adapter.name in s]
        serving, current = len(roots), sum(1 for r in roots if r == adapter.source)
        failure = failures.get(adapter.name)
        if pods and current == pods:
            reason, message = AdapterReason.SERVED, f"served by {serving} ready pod(s)"
        elif failure is not None:
            reason, message = failure.reason, failure.message
        elif pods:
            reason = AdapterReason.NOT_ON_EVERY_POD
            message = f"served by {current} of {pods} ready pods as the spec names it"
            if serving > current:
                message += f" ({serving - current} serve an older source)"
            message += "; a rollout is under way"
        else:
            reason, message = AdapterReason.PENDING, "no ready model-server pod yet"
        out.append(
            AdapterStatus(name=adapter.name, ready_replicas=serving, reason=reason, message=message)
        )
    return out

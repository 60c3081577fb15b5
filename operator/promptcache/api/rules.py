"""Cross-field rules, each written once and enforced in two places.

The same rule becomes a CEL `x-kubernetes-validations` entry in the CRD (so the
API server refuses a bad resource from kubectl or GitOps) and a pydantic
validator (so `promptcache render` refuses it offline with the same message).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from promptcache.api.constants import DEFAULT_VLLM_IMAGE
from promptcache.contract import (
    DEFAULT_PICKER,
    ENDPOINT_PICKER_POD,
    FLAG_WITH_SPACE_PATTERN,
    MODEL_CACHE_MOUNT_PATH,
    MODEL_SERVER_POD,
    OPERATOR_ANNOTATION_PREFIX,
    OPERATOR_POD_LABELS,
    OWNED_ENGINE_FLAGS,
    Container,
    IsolationMode,
    OwnedEngineFlags,
    OwnedPodParts,
    PickerTarget,
    lacking,
    needs_salt_key,
    owned_flag_pattern,
    profile_of,
)
from promptcache.contract import PickerFeature as Feature

M = TypeVar("M")
_REQUIRED = IsolationMode.REQUIRED.value
_SHARED = IsolationMode.SHARED.value


@dataclass(frozen=True)
class CrossFieldRule:
    """One rule over an object of the resource."""

    scope: str
    """Which object the rule sits on: `spec`, `model`, `engine`, `isolation`, `prefixCache`, ..."""
    cel: str
    """The rule as CEL, evaluated by the API server with `self` bound to that object."""
    message: str
    """What the user sees from either side; says what to change."""
    holds: Callable[[Any], bool]
    """The same rule in Python, over the pydantic model."""
    field_path: str | None = None
    """Where the API server reports the failure, relative to the object."""


def _unique_tier_names(prefix_cache: Any) -> bool:
    names = [tier.name for tier in prefix_cache.tiers]
    return len(names) == len(set(names))


VLLM_RENDER = "VllmRender"
"""`prefixCache.tokenProducer`'s value for vLLM's render backend."""

_NO_TOKEN_PRODUCER = lacking(Feature.TOKEN_PRODUCER)
_NO_TIERS = lacking(Feature.PREFIX_TIERS)
_NO_SESSIONS = lacking(Feature.SESSION_AFFINITY)
_NO_LRU = lacking(Feature.LRU_CAPACITY)


def _fallback_lru(pickers: tuple[PickerTarget, ...]) -> int:
    """The per-pod LRU `pickers` use whatever `lruCapacityPerServer` says, from their rows:
    the rule below holds the field to it with one CEL equality, so they must agree."""
    (capacity,) = {profile_of(p).default_lru_capacity for p in pickers}
    return capacity


GIE_LRU_CAPACITY = _fallback_lru(_NO_LRU)
"""The per-pod prefix LRU the pickers without `Feature.LRU_CAPACITY` use whatever
`lruCapacityPerServer` says (their rows' `default_lru_capacity`)."""


def _by(pickers: tuple[PickerTarget, ...]) -> str:
    """`gateway.picker a or b (what they are)`, as the messages name the refusing pickers."""
    names = " or ".join(p.value for p in pickers)
    if len(pickers) > 1 and all(profile_of(p).gie_based for p in pickers):
        return f"gateway.picker {names} (GIE v1.5.0's picker)"
    if len(pickers) == 1:
        return f"gateway.picker {names} ({profile_of(pickers[0]).about})"
    return f"gateway.picker {names}"


def _not_picker_cel(pickers: tuple[PickerTarget, ...]) -> str:
    """CEL true unless `gateway.picker` names one of `pickers` (empty: the rule does not apply;
    the renderer checks the picker it resolves, `picker_refusals`)."""
    if len(pickers) == 1:
        return f"!has(self.gateway.picker) || self.gateway.picker != '{pickers[0].value}'"
    listed = "[" + ", ".join(f"'{p.value}'" for p in pickers) + "]"
    return f"!has(self.gateway.picker) || !(self.gateway.picker in {listed})"


def _others(pickers: tuple[PickerTarget, ...]) -> str:
    """The pickers a message suggests instead: the default first, then the enum's order."""
    others = sorted(
        (p for p in PickerTarget if p not in pickers), key=lambda p: p != DEFAULT_PICKER
    )
    return " or ".join(p.value for p in others)


def picker_refusals(spec: Any, picker: str) -> list[str]:
    """What `picker` cannot honour in `spec`, as the messages the rules below use (each
    from a feature its row in `contract.PROFILES` lacks).

    The rules check an explicit `gateway.picker`; the renderer calls this with the picker
    it resolved (the operator's default when the field is empty), so both say the same."""
    if not picker:
        return []
    profile = profile_of(picker)
    has = profile.features
    refused = []
    if Feature.TOKEN_PRODUCER not in has and spec.prefix_cache.token_producer == VLLM_RENDER:
        refused.append(GIE_RENDER_MESSAGE)
    if Feature.PREFIX_TIERS not in has and spec.prefix_cache.tiers:
        refused.append(GIE_TIERS_MESSAGE)
    if Feature.SESSION_AFFINITY not in has and spec.session_affinity.enabled:
        refused.append(GIE_SESSIONS_MESSAGE)
    if (
        Feature.LRU_CAPACITY not in has
        and spec.prefix_cache.lru_capacity_per_server != profile.default_lru_capacity
    ):
        refused.append(GIE_LRU_MESSAGE)
    return refused


REFUSED_WITHOUT: dict[Feature, str] = {
    Feature.TOKEN_PRODUCER: f"`prefixCache.tokenProducer: {VLLM_RENDER}`",
    Feature.PREFIX_TIERS: "`prefixCache.tiers`",
    Feature.SESSION_AFFINITY: "`sessionAffinity.enabled`",
    Feature.LRU_CAPACITY: (f"`prefixCache.lruCapacityPerServer` other than {GIE_LRU_CAPACITY}"),
}
"""The field `picker_refusals` refuses for a picker without each feature (the docs table)."""


def picker_refused_fields(picker: PickerTarget) -> list[str]:
    """What the API refuses for `picker`, by field, from its row's missing features."""
    return [field for f, field in REFUSED_WITHOUT.items() if f not in profile_of(picker).features]


GIE_LRU_MESSAGE = (
    "prefixCache.lruCapacityPerServer cannot be honoured by "
    f"{_by(_NO_LRU)}: it "
    f"sizes each pod's prefix index from num_gpu_blocks under autoTune, else {GIE_LRU_CAPACITY} "
    f"blocks; leave prefixCache.lruCapacityPerServer at {GIE_LRU_CAPACITY} or set "
    f"gateway.picker to {_others(_NO_LRU)}"
)


GIE_RENDER_MESSAGE = (
    "prefixCache.tokenProducer VllmRender cannot be honoured by "
    f"{_by(_NO_TOKEN_PRODUCER)}: its "
    "prefix producer hashes characters and it has no token-producer plugin; leave "
    "prefixCache.tokenProducer empty (or Estimate) or set gateway.picker to "
    f"{_others(_NO_TOKEN_PRODUCER)}"
)
RENDER_NEEDS_KEYLESS_MESSAGE = (
    "prefixCache.tokenProducer VllmRender sends the picker's own render requests through "
    "the cache front without the client's isolation key or account, which isolation mode "
    "Required and isolation.identity.required refuse; use Estimate, or isolation mode "
    "PerKey without identity.required"
)
GIE_TIERS_MESSAGE = (
    "prefixCache.tiers cannot be honoured by "
    f"{_by(_NO_TIERS)}: its prefix producers "
    "all write one shared attribute and its prefix-cache-scorer ignores its parameters, so "
    "tiers would overwrite each other; remove prefixCache.tiers or set gateway.picker to "
    f"{_others(_NO_TIERS)}"
)
GIE_SESSIONS_MESSAGE = (
    f"sessionAffinity.enabled cannot be honoured by {_by(_NO_SESSIONS)}"
    ": it has no session-affinity plugin; set "
    "sessionAffinity.enabled to false (prefix affinity still draws a conversation's next "
    "turn to the pod holding it) or set gateway.picker to "
    f"{_others(_NO_SESSIONS)}"
)


def _cel_string(text: str) -> str:
    """A CEL single-quoted string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _no_extra_arg_matches(pattern: str, message: str) -> CrossFieldRule:
    """`engine.extraArgs` has no item matching `pattern` (RE2 in CEL, `re.fullmatch` here:
    both anchor at both ends, so they agree)."""
    compiled = re.compile(pattern)
    return CrossFieldRule(
        scope="engine",
        cel=f"!self.extraArgs.exists(a, a.matches({_cel_string(pattern)}))",
        message=message,
        holds=lambda m: not any(compiled.fullmatch(a) for a in m.extra_args),
        field_path=".extraArgs",
    )


def _owned_flags_rule(group: OwnedEngineFlags) -> CrossFieldRule:
    flags = ", ".join((*group.flags, *group.aliases))
    return _no_extra_arg_matches(
        owned_flag_pattern(group), f"must not set {flags} (in any spelling): {group.why}"
    )


LORA_SLOTS_DEFAULT_CAP = 8
"""`engine.maxLoras` defaults to the number of adapters, at most this on GPUs (vLLM reserves
GPU memory for every slot)."""


def default_max_loras(adapters: int, gpus: int) -> int:
    """`engine.maxLoras` when empty; `_CEL_DEFAULT_MAX_LORAS` is the same in CEL. On CPU one
    more slot than adapters: vLLM's CPU build can give a base-model request the output of the
    adapter in the last slot while that slot is in use (an open upstream bug)."""
    if gpus == 0:
        return adapters + 1
    return min(adapters, LORA_SLOTS_DEFAULT_CAP)


def _served_name(model: Any) -> str:
    return str(model.served_model_name or model.name)


def _unique_adapter_names(model: Any) -> bool:
    names = [a.name for a in model.adapters]
    return len(names) == len(set(names))


_PARENT_SEGMENT = re.compile(r"(^|/)\.\.(/|$)")


def _mount_prefixes(model: Any) -> list[str]:
    template = model.pod_template
    mounts = [MODEL_CACHE_MOUNT_PATH]
    if template is not None:
        mounts += [
            str(m.get("mountPath", "")) for c in template.spec.containers for m in c.volume_mounts
        ]
    return [m for m in mounts if m]


def _under(path: str, mount: str) -> bool:
    return path == mount or path.startswith(mount if mount.endswith("/") else mount + "/")


def _adapters_on_mounted_volumes(model: Any) -> bool:
    mounts = _mount_prefixes(model)
    return all(
        a.path is None
        or (not _PARENT_SEGMENT.search(a.path) and any(_under(a.path, m) for m in mounts))
        for a in model.adapters
    )


_CEL_UNDER_MOUNT = (
    "a.path == m.mountPath || "
    "a.path.startsWith(m.mountPath.endsWith('/') ? m.mountPath : m.mountPath + '/')"
)
_CEL_DEFAULT_MAX_LORAS = (
    "(self.model.resources.gpus == 0 ? size(self.model.adapters) + 1 : "
    f"(size(self.model.adapters) < {LORA_SLOTS_DEFAULT_CAP} ? size(self.model.adapters) : "
    f"{LORA_SLOTS_DEFAULT_CAP}))"
)
_CEL_MAX_LORAS = f"(has(self.engine.maxLoras) ? self.engine.maxLoras : {_CEL_DEFAULT_MAX_LORAS})"


def _max_loras(spec: Any) -> int:
    if spec.engine.max_loras is not None:
        return int(spec.engine.max_loras)
    return default_max_loras(len(spec.model.adapters), spec.model.resources.gpus)


ADAPTER_NAME_CLASH_MESSAGE = (
    "adapter names must differ from the served model name (servedModelName, else name): "
    "clients choose the base model or an adapter by that name in `model`"
)
ADAPTER_RULES: tuple[CrossFieldRule, ...] = (
    CrossFieldRule(
        scope="adapter",
        cel="has(self.path) != has(self.huggingFaceRepo)",
        message="set exactly one of path (a directory on a mounted volume) and huggingFaceRepo",
        holds=lambda a: (a.path is None) != (a.hugging_face_repo is None),
        field_path=".path",
    ),
    CrossFieldRule(
        scope="model",
        cel="!has(self.adapters) || self.adapters.all(a, self.adapters.exists_one(b, "
        "b.name == a.name))",
        message="adapter names must be unique",
        holds=_unique_adapter_names,
        field_path=".adapters",
    ),
    CrossFieldRule(
        scope="model",
        cel="!has(self.adapters) || self.adapters.all(a, a.name != "
        "(has(self.servedModelName) ? self.servedModelName : self.name))",
        message=ADAPTER_NAME_CLASH_MESSAGE,
        holds=lambda m: all(a.name != _served_name(m) for a in m.adapters),
        field_path=".adapters",
    ),
    CrossFieldRule(
        scope="model",
        cel=(
            "!has(self.adapters) || self.adapters.all(a, !has(a.path) || "
            f"(!a.path.matches({_cel_string(_PARENT_SEGMENT.pattern)}) && "
            f"(a.path == {_cel_string(MODEL_CACHE_MOUNT_PATH)} || "
            f"a.path.startsWith({_cel_string(MODEL_CACHE_MOUNT_PATH + '/')}) || "
            "(has(self.podTemplate) && has(self.podTemplate.spec) && "
            "has(self.podTemplate.spec.containers) && self.podTemplate.spec.containers.exists(c, "
            f"has(c.volumeMounts) && c.volumeMounts.exists(m, {_CEL_UNDER_MOUNT}))))))"
        ),
        message=(
            "each adapter path must be on a volume the vllm container mounts, without `..`: "
            f"under {MODEL_CACHE_MOUNT_PATH} (the model cache) or under a volumeMount of "
            "model.podTemplate.spec.containers[vllm] (with its volume in podTemplate.spec.volumes)"
        ),
        holds=_adapters_on_mounted_volumes,
        field_path=".adapters",
    ),
)
LORA_LIMITS_NEED_ADAPTERS_MESSAGE = (
    "engine.maxLoras, engine.maxLoraRank and engine.maxCpuLoras apply to model.adapters: "
    "list the adapters or leave the limits empty"
)
LORA_RULES: tuple[CrossFieldRule, ...] = (
    CrossFieldRule(
        scope="spec",
        cel=(
            "(has(self.model.adapters) && size(self.model.adapters) > 0) || "
            "(!has(self.engine.maxLoras) && !has(self.engine.maxLoraRank) && "
            "!has(self.engine.maxCpuLoras))"
        ),
        message=LORA_LIMITS_NEED_ADAPTERS_MESSAGE,
        holds=lambda m: (
            bool(m.model.adapters)
            or (
                m.engine.max_loras is None
                and m.engine.max_lora_rank is None
                and m.engine.max_cpu_loras is None
            )
        ),
        field_path=".engine",
    ),
    CrossFieldRule(
        scope="spec",
        cel=(
            "!has(self.engine.maxCpuLoras) || !has(self.model.adapters) || "
            f"(self.engine.maxCpuLoras >= {_CEL_MAX_LORAS} && "
            "self.engine.maxCpuLoras >= size(self.model.adapters))"
        ),
        message=(
            "engine.maxCpuLoras must be at least engine.maxLoras (vLLM refuses less) and the "
            "number of model.adapters (each listed adapter stays loaded): raise it or leave it "
            "empty"
        ),
        holds=lambda m: (
            m.engine.max_cpu_loras is None
            or m.engine.max_cpu_loras >= max(_max_loras(m), len(m.model.adapters))
        ),
        field_path=".engine.maxCpuLoras",
    ),
    CrossFieldRule(
        scope="spec",
        cel=(
            "!has(self.engine.maxLoraRank) || !has(self.model.adapters) || "
            "self.model.adapters.all(a, !has(a.rank) || a.rank <= self.engine.maxLoraRank)"
        ),
        message=(
            "engine.maxLoraRank is below an adapter's rank (vLLM would refuse to load it): "
            "raise engine.maxLoraRank or leave it empty to size it from model.adapters[].rank"
        ),
        holds=lambda m: (
            m.engine.max_lora_rank is None
            or all(a.rank is None or a.rank <= m.engine.max_lora_rank for a in m.model.adapters)
        ),
        field_path=".engine.maxLoraRank",
    ),
    CrossFieldRule(
        scope="spec",
        cel="!self.gateway.route.routeByModel || (has(self.gateway.route.parentRefs) && "
        "size(self.gateway.route.parentRefs) > 0)",
        message=(
            "gateway.route.routeByModel needs gateway.route.parentRefs: name the shared Gateway "
            "(without one no route is rendered)"
        ),
        holds=lambda m: not m.gateway.route.route_by_model or bool(m.gateway.route.parent_refs),
        field_path=".gateway.route.routeByModel",
    ),
)


GATEWAY_RULES: tuple[CrossFieldRule, ...] = ()
"""Rules over `spec.gateway` alone (none since `sessionShimImage` was removed)."""


ENGINE_RULES: tuple[CrossFieldRule, ...] = (
    *(_owned_flags_rule(group) for group in OWNED_ENGINE_FLAGS),
    _no_extra_arg_matches(
        FLAG_WITH_SPACE_PATTERN,
        "items are argv words: write a flag and its value as two items "
        '("--max-num-batched-tokens", "8192") or as one "--max-num-batched-tokens=8192"',
    ),
)


def _cel_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(_cel_string(i) for i in items) + "]"


def _named(items: tuple[str, ...]) -> str:
    return ", ".join(items)


_OWNED_CONTAINER_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("command", "command", "the operator writes the command line: add flags with {flags}"),
    ("args", "args", "the operator writes the command line: add flags with {flags}"),
    ("image", "image", "set {image}"),
    ("ports", "ports", "the Services and the probes depend on the operator's ports"),
    ("livenessProbe", "liveness_probe", "the operator's probes know how the pod starts"),
    ("readinessProbe", "readiness_probe", "the operator's probes know how the pod starts"),
    ("startupProbe", "startup_probe", "the operator's probes know how the pod starts"),
    ("resources", "resources", "{resources}"),
    ("securityContext", "security_context", "the operator runs every container restricted"),
)
_FIXES: dict[str, dict[str, str]] = {
    Container.VLLM.value: {"flags": "engine.extraArgs", "image": "model.image",
             "resources": "set model.resources"},
    Container.EPP.value: {"flags": "gateway.extraFlags", "image": "gateway.eppImage",
            "resources": "the operator sizes the Endpoint Picker"},
}  # fmt: skip


def _pod_rules(pod: OwnedPodParts, spec_scope: str, container_scope: str) -> list[CrossFieldRule]:
    main, volumes, paths, env = pod.container, pod.volumes, pod.mount_paths, pod.env
    rules = [
        CrossFieldRule(
            scope=spec_scope,
            cel=f"!has(self.containers) || self.containers.all(c, c.name == {_cel_string(main)})",
            message=(
                f"only the {main} container can be extended (env, volumeMounts); "
                f"{_named(pod.other_containers)} and the rest of the pod are the operator's"
            ),
            holds=lambda m: all(c.name == main for c in m.containers),
            field_path=".containers",
        ),
        CrossFieldRule(
            scope=spec_scope,
            cel=f"!has(self.volumes) || self.volumes.all(v, !(v.name in {_cel_list(volumes)}))",
            message=f"volume names {_named(volumes)} are the operator's: name yours differently",
            holds=lambda m: all(v.get("name") not in volumes for v in m.volumes),
            field_path=".volumes",
        ),
        CrossFieldRule(
            scope=spec_scope,
            cel=(
                "!has(self.containers) || self.containers.all(c, !has(c.volumeMounts) || "
                f"c.volumeMounts.all(m, m.name in {_cel_list(volumes)} || "
                "(has(self.volumes) && self.volumes.exists(v, v.name == m.name))))"
            ),
            message=(
                "each volumeMount must name a volume of podTemplate.spec.volumes "
                f"or one of the operator's ({_named(volumes)})"
            ),
            holds=lambda m: all(
                mount.get("name") in volumes
                or any(v.get("name") == mount.get("name") for v in m.volumes)
                for c in m.containers
                for mount in c.volume_mounts
            ),
            field_path=".containers",
        ),
        CrossFieldRule(
            scope=container_scope,
            cel=f"!has(self.env) || self.env.all(e, !(e.name in {_cel_list(env)}))",
            message=f"env {_named(env)} are set by the operator: use other names",
            holds=lambda m: all(e.get("name") not in env for e in m.env),
            field_path=".env",
        ),
        CrossFieldRule(
            scope=container_scope,
            cel=(
                "!has(self.volumeMounts) || "
                f"self.volumeMounts.all(m, !(m.mountPath in {_cel_list(paths)}))"
            ),
            message=f"mount paths {_named(paths)} are the operator's: mount elsewhere",
            holds=lambda m: all(v.get("mountPath") not in paths for v in m.volume_mounts),
            field_path=".volumeMounts",
        ),
    ]
    rules += [
        CrossFieldRule(
            scope=container_scope,
            cel=f"!has(self.{alias})",
            message=(
                f"{alias} of the {main} container cannot be overridden: "
                + why.format(**_FIXES[main])
            ),
            holds=_unset(attr),
            field_path=f".{alias}",
        )
        for alias, attr, why in _OWNED_CONTAINER_FIELDS
    ]
    return rules


def _unset(attr: str) -> Callable[[Any], bool]:
    return lambda m: getattr(m, attr) is None


POD_TEMPLATE_RULES: tuple[CrossFieldRule, ...] = (
    CrossFieldRule(
        scope="podMetadata",
        cel=f"!has(self.labels) || !self.labels.exists(k, k in {_cel_list(OPERATOR_POD_LABELS)})",
        message=(
            f"labels {_named(OPERATOR_POD_LABELS)} are the operator's "
            "(selectors match them): use other keys"
        ),
        holds=lambda m: not any(k in OPERATOR_POD_LABELS for k in m.labels),
        field_path=".labels",
    ),
    CrossFieldRule(
        scope="podMetadata",
        cel=(
            "!has(self.annotations) || !self.annotations.exists(k, "
            f"k.startsWith({_cel_string(OPERATOR_ANNOTATION_PREFIX)}))"
        ),
        message=(
            f"annotations under {OPERATOR_ANNOTATION_PREFIX} are the operator's "
            "(e.g. the config hash that rolls the pods out): use other keys"
        ),
        holds=lambda m: not any(k.startswith(OPERATOR_ANNOTATION_PREFIX) for k in m.annotations),
        field_path=".annotations",
    ),
    *_pod_rules(MODEL_SERVER_POD, "modelPodSpec", "modelContainer"),
    *_pod_rules(ENDPOINT_PICKER_POD, "gatewayPodSpec", "gatewayContainer"),
)


RULES: tuple[CrossFieldRule, ...] = (
    *ADAPTER_RULES,
    *LORA_RULES,
    CrossFieldRule(
        scope="autoscaling",
        cel="self.minReplicas <= self.maxReplicas",
        message="minReplicas must not exceed maxReplicas",
        holds=lambda m: m.min_replicas <= m.max_replicas,
        field_path=".minReplicas",
    ),
    CrossFieldRule(
        scope="model",
        cel=(
            "!has(self.resources.gpuVendor) || self.resources.gpuVendor != 'amd' || "
            f"self.image != {_cel_string(DEFAULT_VLLM_IMAGE)}"
        ),
        message=(
            "AMD GPUs need a ROCm build of vLLM: set model.image (e.g. a vllm/vllm-openai-rocm "
            "or rocm/vllm tag); the default image is built for CUDA"
        ),
        holds=lambda m: m.resources.vendor != "amd" or m.image != DEFAULT_VLLM_IMAGE,
        field_path=".image",
    ),
    *ENGINE_RULES,
    *GATEWAY_RULES,
    *POD_TEMPLATE_RULES,
    CrossFieldRule(
        scope="isolation",
        cel=f"self.mode != '{_REQUIRED}' || self.header != '' || self.bodyField != ''",
        message="Required isolation needs a header or a bodyField to carry the key",
        holds=lambda m: m.mode != _REQUIRED or m.header != "" or m.body_field != "",
        field_path=".mode",
    ),
    CrossFieldRule(
        scope="isolation",
        cel=(
            f"self.mode != '{_SHARED}' "
            "|| (self.identity.header == '' && !self.identity.bearerToken)"
        ),
        message=(
            "isolation by account derives salts, which mode Shared never does: set "
            "isolation.mode to PerKey or Required, or remove isolation.identity"
        ),
        holds=lambda m: m.mode != _SHARED or not m.identity.enabled,
        field_path=".identity",
    ),
    CrossFieldRule(
        scope="isolation",
        cel="!self.identity.required || self.identity.header != '' || self.identity.bearerToken",
        message=(
            "isolation.identity.required names no source for the account: set "
            "isolation.identity.header or isolation.identity.bearerToken"
        ),
        holds=lambda m: not m.identity.required or m.identity.enabled,
        field_path=".identity.required",
    ),
    CrossFieldRule(
        scope="isolation",
        cel=(
            "self.identity.header == '' || (self.identity.header != self.header "
            "&& self.identity.header != 'authorization')"
        ),
        message=(
            "isolation.identity.header must be the header the gateway's authentication sets, "
            "not the isolation-key header or authorization (use identity.bearerToken for tokens)"
        ),
        holds=lambda m: (
            not m.identity.header or m.identity.header not in (m.header, "authorization")
        ),
        field_path=".identity.header",
    ),
    CrossFieldRule(
        scope="prefixCache",
        cel="self.tiers.all(t, self.tiers.exists_one(u, u.name == t.name))",
        message="tier names must be unique",
        holds=_unique_tier_names,
        field_path=".tiers",
    ),
    CrossFieldRule(
        scope="prefixCache",
        cel="self.maxPrefixTokensToMatch > 0 || self.maxPrefixBlocksToMatch > 0",
        message=(
            "maxPrefixTokensToMatch and maxPrefixBlocksToMatch cannot both be 0: "
            "that would hash every token of every prompt; set a cap"
        ),
        holds=lambda m: m.max_prefix_tokens_to_match > 0 or m.max_prefix_blocks_to_match > 0,
        field_path=".maxPrefixTokensToMatch",
    ),
    CrossFieldRule(
        scope="spec",
        cel=f"self.front.enabled || self.isolation.mode == '{_SHARED}'",
        message=(
            "isolation by key needs the cache front: set isolation.mode to Shared "
            "or front.enabled to true"
        ),
        holds=lambda m: m.front.enabled or not needs_salt_key(m.isolation.mode),
        field_path=".front.enabled",
    ),
    CrossFieldRule(
        scope="spec",
        cel="self.front.enabled || !self.promptEmbeds.enabled || self.promptEmbeds.cacheGiB == 0.0",
        message=(
            "prompt embeds by identifier need the cache front: set promptEmbeds.cacheGiB "
            "to 0 or front.enabled to true"
        ),
        holds=lambda m: (
            m.front.enabled or not m.prompt_embeds.enabled or m.prompt_embeds.cache_gib == 0
        ),
        field_path=".front.enabled",
    ),
    CrossFieldRule(
        scope="spec",
        cel="self.front.enabled || !has(self.isolation.honorPromptCacheMaxLen) "
        "|| !self.isolation.honorPromptCacheMaxLen",
        message=(
            "prompt_cache_max_len is honoured by the cache front: set "
            "isolation.honorPromptCacheMaxLen to false (or leave it empty) or front.enabled to true"
        ),
        holds=lambda m: m.front.enabled or m.isolation.honor_prompt_cache_max_len is not True,
        field_path=".isolation.honorPromptCacheMaxLen",
    ),
    CrossFieldRule(
        scope="spec",
        cel="self.front.enabled || !self.front.usageHeaders.enabled",
        message=(
            "usage headers are added by the cache front: set front.usageHeaders.enabled "
            "to false or front.enabled to true"
        ),
        holds=lambda m: m.front.enabled or not m.front.usage_headers.enabled,
        field_path=".front.enabled",
    ),
    CrossFieldRule(
        scope="spec",
        cel=(
            "!has(self.front.memoryBudgetBytes) || "
            "self.front.memoryBudgetBytes >= self.front.maxRequestBytes"
        ),
        message=(
            "front.memoryBudgetBytes is below front.maxRequestBytes: not even one full-size "
            "request could be served; raise the budget or lower maxRequestBytes"
        ),
        holds=lambda m: (
            m.front.memory_budget_bytes is None
            or m.front.memory_budget_bytes >= m.front.max_request_bytes
        ),
        field_path=".front.memoryBudgetBytes",
    ),
    CrossFieldRule(
        scope="spec",
        cel=(
            f"{_not_picker_cel(_NO_TIERS)} "
            "|| !has(self.prefixCache.tiers) || size(self.prefixCache.tiers) == 0"
        ),
        message=GIE_TIERS_MESSAGE,
        holds=lambda m: GIE_TIERS_MESSAGE not in picker_refusals(m, m.gateway.picker or ""),
        field_path=".prefixCache.tiers",
    ),
    CrossFieldRule(
        scope="spec",
        cel=(
            f"{_not_picker_cel(_NO_TOKEN_PRODUCER)} "
            "|| !has(self.prefixCache.tokenProducer) "
            "|| self.prefixCache.tokenProducer != 'VllmRender'"
        ),
        message=GIE_RENDER_MESSAGE,
        holds=lambda m: GIE_RENDER_MESSAGE not in picker_refusals(m, m.gateway.picker or ""),
        field_path=".prefixCache.tokenProducer",
    ),
    CrossFieldRule(
        scope="spec",
        cel=(
            "!has(self.prefixCache.tokenProducer) || self.prefixCache.tokenProducer != "
            f"'VllmRender' || (self.isolation.mode != '{_REQUIRED}' "
            "&& !self.isolation.identity.required)"
        ),
        message=RENDER_NEEDS_KEYLESS_MESSAGE,
        holds=lambda m: (
            m.prefix_cache.token_producer != VLLM_RENDER
            or (m.isolation.mode != _REQUIRED and not m.isolation.identity.required)
        ),
        field_path=".prefixCache.tokenProducer",
    ),
    CrossFieldRule(
        scope="spec",
        cel=(f"{_not_picker_cel(_NO_SESSIONS)} || !self.sessionAffinity.enabled"),
        message=GIE_SESSIONS_MESSAGE,
        holds=lambda m: GIE_SESSIONS_MESSAGE not in picker_refusals(m, m.gateway.picker or ""),
        field_path=".sessionAffinity.enabled",
    ),
    CrossFieldRule(
        scope="spec",
        cel=(
            f"{_not_picker_cel(_NO_LRU)} "
            f"|| self.prefixCache.lruCapacityPerServer == {GIE_LRU_CAPACITY}"
        ),
        message=GIE_LRU_MESSAGE,
        holds=lambda m: GIE_LRU_MESSAGE not in picker_refusals(m, m.gateway.picker or ""),
        field_path=".prefixCache.lruCapacityPerServer",
    ),
)


RULE_SEPARATOR = "\n"


def field_path_of(message: str) -> str | None:
    """The field a broken rule's message is reported at, relative to the rule's object."""
    for rule in RULES:
        if rule.message == message:
            return rule.field_path
    return None


def rules_for(scope: str) -> tuple[CrossFieldRule, ...]:
    return tuple(rule for rule in RULES if rule.scope == scope)


def enforce_rules(model: M, scope: str) -> M:
    """Raise the first broken rule's message as a ValueError (pydantic reports it with its path)."""
    broken = [rule.message for rule in rules_for(scope) if not rule.holds(model)]
    if broken:
        raise ValueError(RULE_SEPARATOR.join(broken))
    return model

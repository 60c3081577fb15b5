"""Cross-field rules, each written once and enforced in two places.

The same rule becomes a CEL `x-kubernetes-validations` entry in the CRD (so the
API server refuses a bad resource from kubectl or GitOps) and a pydantic
validator (so `promptcache render` refuses it offline with the same message).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from promptcache.contract import IsolationMode, needs_salt_key

M = TypeVar("M")
_REQUIRED = IsolationMode.REQUIRED.value
_SHARED = IsolationMode.SHARED.value


@dataclass(frozen=True)
class CrossFieldRule:
    """One rule over an object of the resource."""

    scope: str
    """Which object the rule sits on: `spec`, `isolation`, `prefixCache`."""
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


GIE_PICKER = "gie-v1.5"
"""`contract.PickerTarget.GIE`, spelled out: the API package stays free of the contract's enum."""


def picker_refusals(spec: Any, picker: str) -> list[str]:
    """What `picker` cannot honour in `spec`, as the messages the rules below use.

    The rules check an explicit `gateway.picker`; the renderer calls this with the picker
    it resolved (the operator's default when the field is empty), so both say the same."""
    refused = []
    if picker == GIE_PICKER and spec.prefix_cache.tiers:
        refused.append(GIE_TIERS_MESSAGE)
    if picker == GIE_PICKER and spec.session_affinity.enabled:
        refused.append(GIE_SESSIONS_MESSAGE)
    if picker == GIE_PICKER and spec.prefix_cache.lru_capacity_per_server != GIE_LRU_CAPACITY:
        refused.append(GIE_LRU_MESSAGE)
    return refused


GIE_LRU_CAPACITY = 31250
"""The per-pod prefix LRU GIE v1.5.0 uses whatever `lruCapacityPerServer` says."""
GIE_LRU_MESSAGE = (
    "prefixCache.lruCapacityPerServer cannot be honoured by gateway.picker gie-v1.5: it "
    f"sizes each pod's prefix index from num_gpu_blocks under autoTune, else {GIE_LRU_CAPACITY} "
    f"blocks; leave prefixCache.lruCapacityPerServer at {GIE_LRU_CAPACITY} or set "
    "gateway.picker to llm-d-router"
)


GIE_TIERS_MESSAGE = (
    "prefixCache.tiers cannot be honoured by gateway.picker gie-v1.5: its prefix producers "
    "all write one shared attribute and its prefix-cache-scorer ignores its parameters, so "
    "tiers would overwrite each other; remove prefixCache.tiers or set gateway.picker to "
    "llm-d-router"
)
GIE_SESSIONS_MESSAGE = (
    "sessionAffinity.enabled cannot be honoured by gateway.picker gie-v1.5: it has no "
    "session-affinity plugin; set sessionAffinity.enabled to false (prefix affinity still "
    "draws a conversation's next turn to the pod holding it) or set gateway.picker to "
    "llm-d-router"
)


RULES: tuple[CrossFieldRule, ...] = (
    CrossFieldRule(
        scope="isolation",
        cel=f"self.mode != '{_REQUIRED}' || self.header != '' || self.bodyField != ''",
        message="Required isolation needs a header or a bodyField to carry the key",
        holds=lambda m: m.mode != _REQUIRED or m.header != "" or m.body_field != "",
        field_path=".mode",
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
            f"!has(self.gateway.picker) || self.gateway.picker != '{GIE_PICKER}' "
            "|| !has(self.prefixCache.tiers) || size(self.prefixCache.tiers) == 0"
        ),
        message=GIE_TIERS_MESSAGE,
        holds=lambda m: GIE_TIERS_MESSAGE not in picker_refusals(m, m.gateway.picker or ""),
        field_path=".prefixCache.tiers",
    ),
    CrossFieldRule(
        scope="spec",
        cel=(
            f"!has(self.gateway.picker) || self.gateway.picker != '{GIE_PICKER}' "
            "|| !self.sessionAffinity.enabled"
        ),
        message=GIE_SESSIONS_MESSAGE,
        holds=lambda m: GIE_SESSIONS_MESSAGE not in picker_refusals(m, m.gateway.picker or ""),
        field_path=".sessionAffinity.enabled",
    ),
    CrossFieldRule(
        scope="spec",
        cel=(
            f"!has(self.gateway.picker) || self.gateway.picker != '{GIE_PICKER}' "
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

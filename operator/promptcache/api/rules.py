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

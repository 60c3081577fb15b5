"""The counters of the hit-ratio ladder (issue 39): written by the cache front, read by the
operator's scrape of the same pods and by Prometheus's rules and dashboard.

Each is a Prometheus counter (exposed with `_total`), labelled by `scope` (`SCOPE_CLASSES`:
never a key or an account, so the series stay few). Over any window the rungs are

    routing   = predicted / accounted        delivered = delivered / accounted
    workload  = workload / estimated         capacity  = capacity / estimated
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class LadderCounter(StrEnum):
    """The counters' names, without Prometheus's `_total` suffix."""

    ACCOUNTED = "promptcache_front_accounted_prompt_tokens"
    """Prompt tokens of requests with a valid prediction whose usage reported cached_tokens."""
    PREDICTED = "promptcache_front_predicted_tokens"
    DELIVERED = "promptcache_front_delivered_tokens"
    ESTIMATED = "promptcache_front_estimated_prompt_tokens"
    """Of the accounted prompt tokens, those whose prediction carried the picker's
    workload and capacity estimates."""
    WORKLOAD = "promptcache_front_workload_tokens"
    CAPACITY = "promptcache_front_capacity_tokens"

    @property
    def sample(self) -> str:
        """The name of its samples in the exposition."""
        return f"{self.value}_total"


SCOPE_CLASSES: Final[tuple[str, ...]] = ("shared", "keyed", "account", "uncacheable")
"""The values of the `scope` label (`front.hits.ScopeClass`)."""

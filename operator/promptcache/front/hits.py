"""Predicted against delivered, per request: what the front counts for issue 39's ladder.

For each answered request on a salted route the front knows the isolation scope its policy
put the request in, and, when promptcache's picker chose this pod, what the picker expected
the pod to hold (`tenancy.prediction`, verified here). When vLLM's usage then reports
`cached_tokens`, the three figures — prompt tokens, predicted tokens, delivered (cached)
tokens — are counted together, by pool (the scrape's labels) and by scope class
(`ScopeClass`: a handful of values, never a key or an account), so that Prometheus can
compute both hit ratios over any window from one sample of requests:

    predicted = rate(promptcache_front_predicted_tokens_total[w])
                / rate(promptcache_front_accounted_prompt_tokens_total[w])
    delivered = rate(promptcache_front_delivered_tokens_total[w])
                / rate(promptcache_front_accounted_prompt_tokens_total[w])

A request without a valid prediction (another picker, a client straight to the pod, a
forged header) is not in these three: its tokens stay in the front's unlabelled usage
counters, and the verdict on its header in `promptcache_front_predictions_total{outcome}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from promptcache.tenancy.policy import Isolation
from promptcache.tenancy.prediction import Prediction


class ScopeClass(StrEnum):
    """The kind of isolation scope a request was served in (a bounded metric label; the
    contract's `SCOPE_CLASSES`, which a test holds equal)."""

    SHARED = "shared"
    """Mode Shared, or PerKey without a key: the one unsalted scope."""
    KEYED = "keyed"
    """An isolation key's salt."""
    ACCOUNT = "account"
    """An account's salt (with or without its key)."""
    UNCACHEABLE = "uncacheable"
    """`prompt_cache_max_len: 0`: a one-off salt that can share nothing."""


_SCOPES: dict[Isolation, ScopeClass] = {
    Isolation.SHARED: ScopeClass.SHARED,
    Isolation.UNKEYED: ScopeClass.SHARED,
    Isolation.KEYED: ScopeClass.KEYED,
    Isolation.ACCOUNT: ScopeClass.ACCOUNT,
    Isolation.UNCACHEABLE: ScopeClass.UNCACHEABLE,
}


def scope_class(isolation: Isolation) -> ScopeClass | None:
    """The scope class of a served request (None for a refused one, which is not served)."""
    return _SCOPES.get(isolation)


@dataclass(frozen=True, slots=True)
class Tally:
    """What one request carries to the point where its usage is read."""

    scope: ScopeClass
    prediction: Prediction | None
    weight: float = 1.0
    """How many requests this one's counts stand for (`front.sampling`: 1 unless the
    front checks a sample of the predictions)."""

"""Hypothesis strategies for valid PromptCacheDeployments, spanning what render branches on."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from promptcache.api import parse_resource
from promptcache.api.rules import (
    GIE_LRU_CAPACITY,
    GIE_LRU_MESSAGE,
    GIE_SESSIONS_MESSAGE,
    GIE_TIERS_MESSAGE,
    picker_refusals,
)
from promptcache.contract import DEFAULT_PICKER, PickerTarget

names = st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True)
tier_names = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)
header_names = st.one_of(
    st.sampled_from(["x-prompt-cache-isolation-key", "x.tenant", "x_tenant", "x!#$%&'*+.^_`|~-1"]),
    st.from_regex(r"[a-z0-9!#$%&'*+.^_`|~-]{1,40}", fullmatch=True),
)
"""Valid header names, unusual ones included (RFC 9110 tokens, lower case)."""
body_fields = st.one_of(
    st.sampled_from(["prompt_cache_isolation_key", "tenant", "_t", "T9"]),
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,30}", fullmatch=True),
)
timeouts = st.one_of(
    st.sampled_from([0.001, 1 / 3, 30.0, 60.0, 1234.5678, 3600.0]),
    st.floats(0, 3600, exclude_min=True, allow_nan=False),
)
"""Valid front timeouts in seconds (0 < t <= 3600), fractions that do not print short
included."""
cache_sizes = st.one_of(
    st.sampled_from([0.0, 0.1, 1.0, 1024.0, 1 / 3, 1e-9]), st.floats(0, 1024, allow_nan=False)
)


@st.composite
def isolations(draw: st.DrawFn, front: bool) -> dict[str, Any]:
    """Isolation settings, including empty header or field ("do not read one")."""
    mode = draw(st.sampled_from(["Shared", "PerKey", "Required"])) if front else "Shared"
    header = draw(st.one_of(st.just(""), header_names))
    field = draw(st.one_of(st.just(""), body_fields))
    if mode == "Required" and not (header or field):
        header = "x-tenant"
    isolation: dict[str, Any] = {"mode": mode, "header": header, "bodyField": field}
    honor = draw(st.sampled_from([None, False] + ([True] if front else [])))
    if honor is not None:
        isolation["honorPromptCacheMaxLen"] = honor
    return isolation


@st.composite
def front_limits(draw: st.DrawFn, max_request: int) -> dict[str, Any]:
    """The front's limits, each left out (the default) or set within its bounds; a memory
    budget is never below the largest request (the API refuses that)."""
    limits = {
        "maxConcurrency": st.integers(1, 65536),
        "memoryBudgetBytes": st.integers(max(1024**2, max_request), 256 * 1024**3),
        "maxConcurrentBodyReads": st.integers(1, 65536),
        "headerTimeoutSeconds": timeouts,
        "bodyTimeoutSeconds": timeouts,
        "maxPromptEmbedsReferences": st.integers(1, 1_000_000),
    }
    return {key: draw(values) for key, values in limits.items() if draw(st.booleans())}


@st.composite
def resources(draw: st.DrawFn) -> dict[str, Any]:
    front = draw(st.booleans())
    max_request = draw(st.integers(1024, 4 * 1024**3))
    tiers = draw(st.lists(tier_names, max_size=3, unique=True))
    spec: dict[str, Any] = {
        "model": {
            "name": draw(st.sampled_from(["org/model", "meta-llama/Llama-3.1-8B-Instruct"])),
            "replicas": draw(st.integers(0, 8)),
            "resources": {"gpus": draw(st.integers(0, 8))},
        },
        "engine": {
            "apiServerCount": draw(st.integers(1, 8)),
            "blockSize": draw(st.sampled_from([8, 16, 32, 64, 128])),
            "gpuMemoryUtilization": draw(st.floats(0.05, 1.0)),
        },
        "promptEmbeds": {
            "enabled": draw(st.booleans()),
            "cacheGiB": draw(cache_sizes) if front else 0.0,
        },
        "isolation": draw(isolations(front)),
        "sessionAffinity": {
            "enabled": draw(st.booleans()),
            "header": draw(header_names),
            "useUserField": draw(st.booleans()),
            "ttlSeconds": draw(st.integers(1, 86400)),
        },
        "prefixCache": {
            "autoTune": draw(st.booleans()),
            "blockSizeTokens": draw(st.integers(1, 1024)),
            "lruCapacityPerServer": draw(st.integers(1, 10**6)),
            "tiers": [{"name": t, "blockSizeTokens": draw(st.integers(1, 512))} for t in tiers],
        },
        "gateway": {
            "replicas": draw(st.integers(1, 3)),
            "failureMode": draw(st.sampled_from(["FailOpen", "FailClose"])),
            "route": {
                "parentRefs": draw(st.sampled_from([[], [{"name": "gw", "namespace": "infra"}]]))
            },
        },
        "front": {
            "enabled": front,
            "maxRequestBytes": max_request,
            "usageHeaders": {
                "enabled": front and draw(st.booleans()),
                "promptTokensHeader": draw(header_names),
                "cachedPromptTokensHeader": draw(header_names),
            },
        },
    }
    if draw(st.booleans()):
        spec["engine"]["maxModelLen"] = draw(st.integers(256, 131072))
    if draw(st.booleans()):
        spec["engine"]["maxNumSeqs"] = draw(st.integers(1, 65536))
    spec["front"].update(draw(front_limits(max_request)))
    doc = {
        "apiVersion": "serving.promptcache.io/v1alpha1",
        "kind": "PromptCacheDeployment",
        "metadata": {"name": draw(names), "namespace": draw(names)},
        "spec": spec,
    }
    picker = draw(st.sampled_from([None, *PickerTarget]))
    _honour(doc, picker or DEFAULT_PICKER)
    if picker is not None:
        spec["gateway"]["picker"] = picker.value
    return doc


_UNSET_WHEN_REFUSED: dict[str, tuple[str, str, Any]] = {
    GIE_SESSIONS_MESSAGE: ("sessionAffinity", "enabled", False),
    GIE_TIERS_MESSAGE: ("prefixCache", "tiers", []),
    GIE_LRU_MESSAGE: ("prefixCache", "lruCapacityPerServer", GIE_LRU_CAPACITY),
}
"""What a picker refuses (`api.rules.picker_refusals`), and the value that it accepts."""


def _honour(doc: dict[str, Any], picker: PickerTarget) -> None:
    """Take out of `doc` (naming no picker yet) what `picker`, named or the default, cannot
    honour: the API refuses those, so a valid resource has none. Driven by the rules' own
    refusals, so a picker that learns a feature (sessions) gets resources with it at once."""
    for message in picker_refusals(parse_resource(doc).spec, picker.value):
        section, field, value = _UNSET_WHEN_REFUSED[message]
        doc["spec"][section][field] = value

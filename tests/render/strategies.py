"""Hypothesis strategies for valid PromptCacheDeployments, spanning the settings render branches on."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

names = st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True)
tier_names = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)


@st.composite
def resources(draw: st.DrawFn) -> dict[str, Any]:
    front = draw(st.booleans())
    isolation_mode = draw(st.sampled_from(["Shared", "PerKey", "Required"])) if front else "Shared"
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
            "cacheGiB": draw(st.floats(0, 64)) if front else 0.0,
        },
        "isolation": {"mode": isolation_mode},
        "sessionAffinity": {
            "enabled": draw(st.booleans()),
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
        "front": {"enabled": front, "usageHeaders": {"enabled": front and draw(st.booleans())}},
    }
    if draw(st.booleans()):
        spec["engine"]["maxModelLen"] = draw(st.integers(256, 131072))
    return {
        "apiVersion": "serving.promptcache.io/v1alpha1",
        "kind": "PromptCacheDeployment",
        "metadata": {"name": draw(names), "namespace": draw(names)},
        "spec": spec,
    }

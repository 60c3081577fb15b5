"""The typed models: defaults, strictness and the arithmetic the status reports."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from promptcache.api import (
    InvalidResourceError,
    PromptCacheDeployment,
    ceiling_of,
    parse_resource,
)
from promptcache.contract.cache_size import GIB


def resource(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "serving.promptcache.io/v1alpha1",
        "kind": "PromptCacheDeployment",
        "metadata": {"name": "demo", "namespace": "ns"},
        "spec": {"model": {"name": "org/model"}, **spec},
    }


def test_defaults_follow_the_spec_documents() -> None:
    pcd = parse_resource(resource())
    spec = pcd.spec
    assert spec.isolation.mode == "PerKey"
    assert spec.isolation.header == "x-prompt-cache-isolation-key"
    assert spec.isolation.body_field == "prompt_cache_isolation_key"
    assert spec.session_affinity.header == "x-session-affinity"
    assert spec.prefix_cache.auto_tune is True
    assert spec.prefix_cache.max_prefix_tokens_to_match == 131072
    assert spec.prefix_cache.lru_capacity_per_server == 31250
    assert spec.front.usage_headers.prompt_tokens_header == "dashflow-prompt-tokens"
    assert spec.front.usage_headers.cached_prompt_tokens_header == "dashflow-cached-prompt-tokens"
    assert spec.model.effective_served_name == "org/model"


def test_strict_types_refuse_what_the_api_server_refuses() -> None:
    with pytest.raises(InvalidResourceError) as error:
        parse_resource(resource(engine={"apiServerCount": "2", "gpuMemoryUtilization": True}))
    assert [str(p) for p in error.value.problems] == [
        "spec.engine.apiServerCount: must be an integer",
        "spec.engine.gpuMemoryUtilization: must be a number",
    ]


def test_the_removed_session_shim_name_is_refused_not_ignored() -> None:
    """`gateway.sessionShimImage` (deprecated old name of `gatewayPolicyImage`) was removed:
    a resource still naming it is refused, so the image it named is never silently lost."""
    with pytest.raises(InvalidResourceError) as error:
        parse_resource(resource(gateway={"sessionShimImage": "registry.example/op:0"}))
    assert [p.path for p in error.value.problems] == ["spec.gateway.sessionShimImage"]


def test_an_integer_is_a_valid_number() -> None:
    pcd = parse_resource(resource(promptEmbeds={"enabled": True, "cacheGiB": 2}))
    assert pcd.spec.prompt_embeds.cache_gib == 2


def test_dump_and_parse_round_trip() -> None:
    pcd = parse_resource(resource(prefixCache={"tiers": [{"name": "coarse"}]}))
    again = PromptCacheDeployment.model_validate(pcd.model_dump(by_alias=True, mode="json"))
    assert again == pcd


@given(
    gib=st.floats(min_value=0, max_value=1024, allow_nan=False),
    processes=st.integers(min_value=1, max_value=64),
    replicas=st.integers(min_value=0, max_value=1000),
    enabled=st.booleans(),
)
def test_ceiling_is_processes_times_size(
    gib: float, processes: int, replicas: int, enabled: bool
) -> None:
    pcd = parse_resource(
        resource(
            model={"name": "m", "replicas": replicas},
            engine={"apiServerCount": processes},
            promptEmbeds={"enabled": enabled, "cacheGiB": gib},
        )
    )
    ceiling = ceiling_of(pcd)
    per_process = int(gib * GIB) if enabled else 0
    assert ceiling.per_process_bytes == per_process
    assert ceiling.per_pod_bytes == per_process * processes
    assert ceiling.total_bytes == per_process * processes * replicas


def test_ceiling_is_zero_without_the_front() -> None:
    pcd = parse_resource(
        resource(
            front={"enabled": False, "usageHeaders": {"enabled": False}},
            isolation={"mode": "Shared"},
            promptEmbeds={"enabled": True, "cacheGiB": 0},
        )
    )
    assert ceiling_of(pcd).per_pod_bytes == 0

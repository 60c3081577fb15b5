"""`resolved` is the one place operator-wide defaults are applied.

For any valid resource and any operator defaults, rendering the resource and rendering its
resolved form give the same manifests, resolving is idempotent (and final), and neither
render nor the status reads a default from anywhere else: the resolved resource with every
default spelled out as a field gives the same status and manifests under other defaults,
and the status's picker numbers are the resolved picker's row's.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.resource_strategies import resources
from promptcache.api import (
    BUILT_IN_DEFAULTS,
    InvalidResourceError,
    OperatorDefaults,
    PromptCacheDeployment,
    UnresolvedError,
    parse_resource,
    resolved,
)
from promptcache.contract import PROFILES, PickerTarget
from promptcache.controller.scrape import ScrapedPrefixCache
from promptcache.controller.status import prefix_cache_status
from promptcache.render import RenderError, render
from promptcache.render.monitoring import monitoring_enabled
from promptcache.yamlio import dump_all

OPERATOR = Path(__file__).resolve().parents[2] / "operator" / "promptcache"

operator_defaults = st.builds(
    OperatorDefaults,
    front_image=st.sampled_from([BUILT_IN_DEFAULTS.front_image, "mirror.example/front:2"]),
    gateway_policy_image=st.sampled_from(
        [BUILT_IN_DEFAULTS.gateway_policy_image, "mirror.example/op@sha256:" + "b" * 64]
    ),
    endpoint_picker_cluster_role=st.sampled_from([None, "promptcache-endpoint-picker"]),
    picker=st.sampled_from(list(PickerTarget)),
    model_server_user=st.none() | st.integers(min_value=1, max_value=2**31 - 1),
    pod_monitors=st.booleans(),
)


def _rendered(pcd: PromptCacheDeployment, defaults: OperatorDefaults) -> str:
    """The manifests as bytes, or the refusal (both must agree, refusals included)."""
    try:
        return dump_all(render(pcd, defaults))
    except RenderError as error:
        return f"refused: {error.reason}: {error}"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=resources(), defaults=operator_defaults, other=operator_defaults)
def test_rendering_the_resolved_form_gives_the_same_manifests(
    doc: dict[str, Any], defaults: OperatorDefaults, other: OperatorDefaults
) -> None:
    pcd = parse_resource(doc)
    once = resolved(pcd, defaults)
    expected = _rendered(pcd, defaults)
    assert _rendered(once, defaults) == expected
    # final: a resolved resource renders the same whatever defaults come after
    assert _rendered(once, other) == expected
    assert resolved(once, defaults) is once
    assert resolved(once, other) is once
    # nothing defaulted is left empty, and what was filled is recorded
    spec = once.spec
    assert None not in (
        spec.gateway.picker,
        spec.gateway.gateway_policy_image,
        spec.front.image,
        spec.monitoring.enabled,
    )
    assert ("spec.gateway.picker" in once.filled) is (pcd.spec.gateway.picker is None)
    assert once.operator.model_server_user == defaults.model_server_user
    # never part of the resource: the dump is the written resource's, defaults filled
    assert set(once.model_dump(by_alias=True)) == set(pcd.model_dump(by_alias=True))


scraped_prefix_caches = st.builds(
    ScrapedPrefixCache,
    scraped_pods=st.integers(min_value=0, max_value=8),
    block_size=st.none() | st.sampled_from([8, 16, 32, 64, 128]),
    num_gpu_blocks=st.none() | st.integers(min_value=1, max_value=10**6),
    hit_ratio=st.none() | st.floats(min_value=0, max_value=1),
)


def _spelled_out(pcd: PromptCacheDeployment) -> PromptCacheDeployment:
    """The resolved resource written back with every default it was given as a field: what a
    user who wrote each value out would apply."""
    return parse_resource(pcd.model_dump(by_alias=True, mode="json", exclude_none=True))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    doc=resources(),
    defaults=operator_defaults,
    other=operator_defaults,
    scraped=scraped_prefix_caches,
)
def test_status_and_render_read_no_default_but_the_resolved_fields(
    doc: dict[str, Any],
    defaults: OperatorDefaults,
    other: OperatorDefaults,
    scraped: ScrapedPrefixCache,
) -> None:
    """Whether a value came from the resource or from the operator's defaults changes
    nothing: the resolved resource, every default spelled out as a field and resolved
    under other defaults, gives the same status and the same manifests (or, when the
    default picker cannot honour a field, the API refuses it with the render's message);
    and the status's picker numbers are the row's of the picker the resource resolved to."""
    once = resolved(parse_resource(doc), defaults)
    spec = once.spec.prefix_cache
    status = prefix_cache_status(once, scraped)
    assert once.spec.gateway.picker is not None
    row = PROFILES[once.spec.gateway.picker]
    assert status.effective_block_size_tokens == row.block_size(
        auto_tune=spec.auto_tune, configured=spec.block_size_tokens, scraped=scraped.block_size
    )
    assert status.index_capacity_per_pod == row.index_capacity(
        auto_tune=spec.auto_tune,
        configured=spec.lru_capacity_per_server,
        gpu_blocks=scraped.num_gpu_blocks,
    )
    rendered = _rendered(once, defaults)
    if rendered.startswith("refused: PickerCannotHonour: "):
        # the picker came from the defaults and cannot honour a field: named, the API
        # refuses what render refused, with the same messages
        with pytest.raises(InvalidResourceError) as invalid:
            _spelled_out(once)
        assert all(p.message in rendered for p in invalid.value.problems)
        return
    spelled = _spelled_out(once)
    # the operator's facts no field holds (the vLLM UID, the picker ClusterRole) stay
    operator = other.model_copy(
        update={
            "model_server_user": defaults.model_server_user,
            "endpoint_picker_cluster_role": defaults.endpoint_picker_cluster_role,
        }
    )
    again = resolved(spelled, operator)
    assert again.filled == frozenset()
    assert again.spec == once.spec
    assert prefix_cache_status(again, scraped) == status
    assert _rendered(again, operator) == rendered


def test_an_unresolved_resource_is_never_read_with_a_default_of_its_own() -> None:
    """Status (and render's parts) read the resolved resource only: given one that was not
    resolved, they fail loudly instead of falling back to a built-in default."""
    doc = {
        "apiVersion": "serving.promptcache.io/v1alpha1",
        "kind": "PromptCacheDeployment",
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {"model": {"name": "m"}},
    }
    written = parse_resource(doc)
    with pytest.raises(UnresolvedError, match=r"spec\.gateway\.picker"):
        prefix_cache_status(written, ScrapedPrefixCache())
    with pytest.raises(UnresolvedError, match=r"spec\.monitoring\.enabled"):
        monitoring_enabled(written)
    router = OperatorDefaults(picker=PickerTarget.LLM_D_ROUTER, pod_monitors=True)
    pcd = resolved(written, router)
    assert monitoring_enabled(pcd)
    status = prefix_cache_status(pcd, ScrapedPrefixCache())
    assert status.effective_block_size_tokens == 64  # llm-d-router's floor, not the default's


DEFAULT_NAMES = frozenset(
    {
        "OperatorDefaults",
        "BUILT_IN_DEFAULTS",
        "DEFAULT_PICKER",
        "DEFAULT_FRONT_IMAGE",
        "DEFAULT_GATEWAY_POLICY_IMAGE",
        "DEFAULT_MODEL_SERVER_USER",
    }
)
"""Where an operator-wide default comes from (a picker's pinned image is its row's, read
through `render.picker.picker_target` of the resolved resource)."""
MAY_READ_DEFAULTS = frozenset(
    {
        "render/__init__.py",  # render(pcd, defaults) hands them to resolved, nothing else
        "controller/plan.py",  # resolves each resource, once
        "controller/options.py",  # the operator's settings
        "controller/reconcile.py",  # carries them to the plan
        "controller/command.py",  # `promptcache run` flags
    }
)


def _names_read(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    found |= {a.attr for a in ast.walk(tree) if isinstance(a, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found |= {alias.name for alias in node.names}
    return found & DEFAULT_NAMES


@pytest.mark.parametrize("package", ["render", "controller"])
def test_render_and_status_read_no_default_but_the_resolved_resource(package: str) -> None:
    readers = {
        str(p.relative_to(OPERATOR)): sorted(_names_read(p))
        for p in sorted((OPERATOR / package).rglob("*.py"))
        if str(p.relative_to(OPERATOR)) not in MAY_READ_DEFAULTS
    }
    assert {path: names for path, names in readers.items() if names} == {}

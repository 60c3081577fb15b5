"""`resolved` is the one place operator-wide defaults are applied.

For any valid resource and any operator defaults, rendering the resource and rendering its
resolved form give the same manifests, resolving is idempotent (and final), and neither
render nor the status reads a default from anywhere else.
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
    OperatorDefaults,
    PromptCacheDeployment,
    UnresolvedError,
    parse_resource,
    resolved,
)
from promptcache.contract import PickerTarget
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

"""The render phase of a reconcile: one resolved resource for render and status alike."""

from __future__ import annotations

import copy
from typing import Any

from promptcache.api import BUILT_IN_DEFAULTS, OperatorDefaults
from promptcache.contract import PickerTarget
from promptcache.controller.children import PRUNABLE
from promptcache.controller.plan import Plan, PlanMemo, plan
from promptcache.controller.scrape import ScrapedPrefixCache
from promptcache.controller.status import Problem, prefix_cache_status
from promptcache.render import names_of

BODY: dict[str, Any] = {
    "apiVersion": "serving.promptcache.io/v1alpha1",
    "kind": "PromptCacheDeployment",
    "metadata": {"name": "chat", "namespace": "serving", "uid": "u-1", "generation": 1},
    "spec": {"model": {"name": "org/model", "replicas": 2}},
}
PODS = ScrapedPrefixCache(scraped_pods=1, block_size=16, num_gpu_blocks=1000, hit_ratio=0.5)


def body(**spec: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BODY)
    doc["spec"].update(spec)
    return doc


def test_the_plan_carries_the_resource_render_used() -> None:
    """`--picker gie-v1.5`: the plan's resource names GIE, its config is GIE's, and the
    status computed from it has no 64-token floor (the bug of issue 25)."""
    planned = plan(body(), OperatorDefaults(picker=PickerTarget.GIE))
    assert isinstance(planned, Plan)
    assert planned.pcd.spec.gateway.picker is PickerTarget.GIE
    (cm,) = [m for m in planned.desired if m["kind"] == "ConfigMap"]
    assert "Endpoint Picker: gie-v1.5" in next(iter(cm["data"].values()))
    assert prefix_cache_status(planned.pcd, PODS).effective_block_size_tokens == 16
    router = plan(body(), OperatorDefaults(picker=PickerTarget.LLM_D_ROUTER))
    assert isinstance(router, Plan)
    assert prefix_cache_status(router.pcd, PODS).effective_block_size_tokens == 64
    default = plan(body(), BUILT_IN_DEFAULTS)
    assert isinstance(default, Plan)
    assert default.pcd.spec.gateway.picker is PickerTarget.PROMPTCACHE
    assert prefix_cache_status(default.pcd, PODS).effective_block_size_tokens == 16


def test_every_child_is_owned_and_named() -> None:
    planned = plan(body(), BUILT_IN_DEFAULTS)
    assert isinstance(planned, Plan)
    for child in planned.desired:
        assert child["metadata"]["ownerReferences"][0]["uid"] == "u-1"
        assert child["metadata"]["name"]
    assert planned.renders("Deployment", planned.names.model_server)
    assert not planned.renders("HTTPRoute")


def test_what_cannot_be_rendered_is_a_problem_not_an_exception() -> None:
    invalid = plan(body(prefixCache={"lruCapacityPerServer": 0}), BUILT_IN_DEFAULTS)
    assert isinstance(invalid, Problem)
    assert invalid.reason == "InvalidSpec"
    assert "lruCapacityPerServer" in invalid.message
    long_name = body()
    long_name["metadata"]["name"] = "x" * 60
    too_long = plan(long_name, BUILT_IN_DEFAULTS)
    assert isinstance(too_long, Problem)
    assert too_long.reason == "NameTooLong"
    # Sessions cannot be honoured by GIE: refused when GIE is only the operator's default.
    refused = plan(
        body(sessionAffinity={"enabled": True}), OperatorDefaults(picker=PickerTarget.GIE)
    )
    assert isinstance(refused, Problem)
    assert refused.reason == "PickerCannotHonour"
    # Tiers cannot be honoured by the built-in default either, and the message says why
    # the resource, naming no picker, got one that refuses them.
    tiers = plan(body(prefixCache={"tiers": [{"name": "coarse"}]}), BUILT_IN_DEFAULTS)
    assert isinstance(tiers, Problem)
    assert tiers.reason == "PickerCannotHonour"
    assert "gateway.picker is empty, so the operator's default picker promptcache" in (
        tiers.message
    )


def test_the_prune_table_names_only_children_a_render_can_drop() -> None:
    """Each prunable child is rendered by some spec, and absent from a minimal one."""
    planned = plan(body(), BUILT_IN_DEFAULTS)
    assert isinstance(planned, Plan)
    full = plan(
        body(
            gateway={"route": {"parentRefs": [{"name": "gw"}], "routeByModel": True}},
            monitoring={"enabled": True},
            autoscaling={"enabled": True, "minReplicas": 1, "maxReplicas": 2},
        ),
        BUILT_IN_DEFAULTS,
    )
    assert isinstance(full, Plan)
    names = names_of(planned.pcd)
    for prunable in PRUNABLE:
        for name in prunable.names(names):
            assert full.renders(prunable.kind.kind, name), (prunable.kind.kind, name)
            if prunable.kind.kind != "NetworkPolicy":  # the picker pod's, rendered by default
                assert not planned.renders(prunable.kind.kind, name)
    router = OperatorDefaults(picker=PickerTarget.LLM_D_ROUTER)
    shared = plan(body(isolation={"mode": "Shared"}), router)
    assert isinstance(shared, Plan)
    assert not shared.renders("NetworkPolicy")  # no step in front of llm-d-router: none


def test_the_memo_renders_once_per_change_of_what_render_reads() -> None:
    """An idle resync re-rendered every resource (half of an idle operator's CPU at 2,000);
    the memo gives the same plan while spec and metadata are unchanged, and a new one as
    soon as either moves, a status write (resourceVersion) or field manager not counting."""
    memo = PlanMemo(BUILT_IN_DEFAULTS)
    first = memo.get("u-1", body())[1]
    moved = body()
    moved["metadata"].update(resourceVersion="99", managedFields=[{"manager": "x"}])
    moved["status"] = {"observedGeneration": 1}
    assert memo.get("u-1", moved)[1] is first
    for changed in (body(model={"name": "org/other", "replicas": 2}), _labelled(body())):
        again = memo.get("u-1", changed)[1]
        assert again is not first
        assert isinstance(again, Plan)
        assert again == plan(changed, BUILT_IN_DEFAULTS)
    memo.forget("u-1")
    assert memo.get("u-1", body())[1] is not first


def _labelled(doc: dict[str, Any]) -> dict[str, Any]:
    doc["metadata"]["labels"] = {"team": "a"}
    return doc

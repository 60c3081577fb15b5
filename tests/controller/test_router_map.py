"""A router mapping's way out: unlabel, settle, then release and delete (pure parts).

On the real API server with the real `bbr`: `e2e/test_bbr.py::test_the_operator_takes_a_mapping_out_of_the_router_before_it_goes`.
"""

from __future__ import annotations

import datetime
from typing import Any

import jsonpatch
import pytest

from promptcache.contract.router import MAPPING_FINALIZER, MAPPING_LABEL, MAPPING_UNMAPPED_AT
from promptcache.controller.router_map import (
    SETTLE_SECONDS,
    hold_finalizer,
    plan_exit,
    release_finalizer,
)

NOW = datetime.datetime(2026, 12, 4, 12, 0, 0, tzinfo=datetime.UTC)


def mapping(
    *, labelled: bool = True, terminating: bool = False, **annotations: str
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": "alpha-bbr",
        "resourceVersion": "7",
        "labels": {"app.kubernetes.io/name": "x", **({MAPPING_LABEL: "true"} if labelled else {})},
        "finalizers": ["other/keep", MAPPING_FINALIZER],
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    if terminating:
        meta["deletionTimestamp"] = "2026-12-04T11:59:00Z"
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}


def applied(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """What the API server would hold after the JSON patch (its `test` ops included)."""
    out: dict[str, Any] = jsonpatch.apply_patch(obj, ops)
    return out


def test_a_wanted_live_mapping_is_left_to_apply() -> None:
    step = plan_exit(mapping(), wanted=True, now=NOW)
    assert (step.patches, step.delete, step.done) == ([], False, False)


def test_a_gone_mapping_is_out() -> None:
    assert plan_exit(None, wanted=False, now=NOW).done


@pytest.mark.parametrize(("wanted", "terminating"), [(False, False), (True, True), (False, True)])
def test_the_way_out_is_unlabel_settle_then_release_and_delete(
    wanted: bool, terminating: bool
) -> None:
    live = mapping(terminating=terminating, other="kept")
    first = plan_exit(live, wanted=wanted, now=NOW)
    assert (first.delete, first.done, first.requeue_after_s) == (False, False, SETTLE_SECONDS)
    (ops,) = first.patches
    unlabelled = applied(live, ops)
    assert MAPPING_LABEL not in unlabelled["metadata"]["labels"]
    assert unlabelled["metadata"]["annotations"]["other"] == "kept"
    assert unlabelled["metadata"]["finalizers"] == live["metadata"]["finalizers"]

    soon = plan_exit(unlabelled, wanted=wanted, now=NOW + datetime.timedelta(seconds=0.5))
    assert (soon.patches, soon.delete, soon.done) == ([], False, False)
    assert soon.requeue_after_s == pytest.approx(SETTLE_SECONDS - 0.5)

    later = NOW + datetime.timedelta(seconds=SETTLE_SECONDS)
    last = plan_exit(unlabelled, wanted=wanted, now=later)
    assert last.done
    assert last.delete is not terminating, "a terminating one goes by itself once released"
    (release,) = last.patches
    assert applied(unlabelled, release)["metadata"]["finalizers"] == ["other/keep"]


def test_the_first_annotation_is_created_when_there_are_none() -> None:
    (ops,) = plan_exit(mapping(), wanted=False, now=NOW).patches
    assert applied(mapping(), ops)["metadata"]["annotations"] == {
        MAPPING_UNMAPPED_AT: "2026-12-04T12:00:00.000000Z"
    }


def test_every_patch_fails_on_a_changed_object() -> None:
    """Each patch tests the resourceVersion it was planned from: a concurrent change makes
    the API server refuse it (the reconcile reads again) instead of losing the change."""
    live = mapping()
    (ops,) = plan_exit(live, wanted=False, now=NOW).patches
    changed = mapping()
    changed["metadata"]["resourceVersion"] = "8"
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        applied(changed, ops)


def test_an_unlabelled_mapping_without_a_stamp_counts_as_settled() -> None:
    step = plan_exit(mapping(labelled=False), wanted=False, now=NOW)
    assert step.done
    assert step.delete


def test_the_resource_holds_and_releases_the_finalizer_once() -> None:
    pcd: dict[str, Any] = {"metadata": {"name": "alpha", "resourceVersion": "3"}}
    held = applied(pcd, hold_finalizer(pcd) or [])
    assert held["metadata"]["finalizers"] == [MAPPING_FINALIZER]
    assert hold_finalizer(held) is None
    held["metadata"]["finalizers"].insert(0, "other/keep")
    assert applied(held, release_finalizer(held) or [])["metadata"]["finalizers"] == ["other/keep"]
    assert release_finalizer(pcd) is None

"""Containment of rendered children in live objects: the rule behind zero-write resyncs."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from promptcache.api import parse_resource
from promptcache.controller.children import owned
from promptcache.controller.compare import HASH_ANNOTATION, is_subset, needs_apply, quantity_value
from promptcache.render import render

OWNER = {"metadata": {"name": "demo", "uid": "u-1"}}


def _pcd(**model: Any) -> Any:
    return parse_resource(
        {
            "apiVersion": "serving.promptcache.io/v1alpha1",
            "kind": "PromptCacheDeployment",
            "metadata": {"name": "demo", "namespace": "ns"},
            "spec": {"model": {"name": "m", **model}},
        }
    )


def _deployment(**model: Any) -> dict[str, Any]:
    manifests = [owned(m, OWNER) for m in render(_pcd(**model))]
    return next(
        m for m in manifests if m["kind"] == "Deployment" and m["metadata"]["name"] == "demo"
    )


def _as_server_stores(manifest: dict[str, Any]) -> dict[str, Any]:
    """What the API server gives back: defaults added, quantities canonical, empties dropped."""
    live = copy.deepcopy(manifest)
    live["metadata"]["uid"] = "x"
    live["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "1"
    live["status"] = {"replicas": 1}
    pod = live["spec"]["template"]["spec"]
    pod["dnsPolicy"] = "ClusterFirst"
    for container in pod["containers"]:
        container["terminationMessagePath"] = "/dev/termination-log"
        res = container["resources"]
        for section in ("requests", "limits"):
            res[section] = {k: str(v) for k, v in res.get(section, {}).items()}
            if not res[section]:
                del res[section]
        for env in container["env"]:
            if env.get("value") == "":
                del env["value"]
    return live


def test_live_copy_as_the_server_stores_it_needs_no_apply() -> None:
    desired = _deployment(resources={"gpus": 1})
    assert not needs_apply(desired, _as_server_stores(desired))


def test_missing_child_needs_apply() -> None:
    assert needs_apply(_deployment(), None)


def test_hand_edited_image_is_drift() -> None:
    desired = _deployment()
    live = _as_server_stores(desired)
    live["spec"]["template"]["spec"]["containers"][1]["image"] = "evil:latest"
    assert needs_apply(desired, live)


def test_hand_edited_cache_env_is_drift() -> None:
    desired = _deployment()
    live = _as_server_stores(desired)
    front = live["spec"]["template"]["spec"]["containers"][0]
    env = next(e for e in front["env"] if e["name"] == "SG_PROMPT_EMBEDS_CACHE_GIB")
    env["value"] = "99"
    assert needs_apply(desired, live)


def test_foreign_annotation_and_extra_env_are_not_drift() -> None:
    desired = _deployment()
    live = _as_server_stores(desired)
    live["metadata"]["annotations"]["someone/added"] = "yes"
    live["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "X", "value": "1"})
    assert not needs_apply(desired, live)


def test_a_render_change_that_only_removes_is_seen_through_the_hash() -> None:
    before = _deployment(replicas=2)
    after = _deployment(replicas=2, hfTokenSecretRef=None)
    assert (
        before["metadata"]["annotations"][HASH_ANNOTATION]
        == after["metadata"]["annotations"][HASH_ANNOTATION]
    )
    live = _as_server_stores(before)
    changed = _deployment(replicas=3)
    assert (
        changed["metadata"]["annotations"][HASH_ANNOTATION]
        != before["metadata"]["annotations"][HASH_ANNOTATION]
    )
    assert needs_apply(changed, live)


def test_quantities_compare_by_value_only_where_quantities_live() -> None:
    assert is_subset({"limits": {"memory": "2048Mi"}}, {"limits": {"memory": "2Gi"}})
    assert is_subset({"requests": {"nvidia.com/gpu": 1}}, {"requests": {"nvidia.com/gpu": "1"}})
    assert not is_subset({"limits": {"memory": "2049Mi"}}, {"limits": {"memory": "2Gi"}})
    assert not is_subset({"value": "1"}, {"value": 1})
    assert quantity_value("500m") == quantity_value("0.5")
    assert quantity_value("not-a-quantity") is None


def test_ordered_lists_must_match_in_order() -> None:
    assert not is_subset({"args": ["a", "b"]}, {"args": ["b", "a"]})
    assert not is_subset({"args": ["a"]}, {"args": ["a", "b"]})


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8))
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(json_value)
def test_everything_contains_itself(value: Any) -> None:
    assert is_subset(value, value)


@given(
    st.dictionaries(st.text(max_size=6), json_value, max_size=4), st.text(max_size=6), json_value
)
def test_adding_a_field_keeps_containment(desired: dict[str, Any], key: str, extra: Any) -> None:
    live = dict(desired)
    if key not in live:
        live[key] = extra
    assert is_subset(desired, live)

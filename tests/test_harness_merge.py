"""The harness's `deep_merge` is the JSON merge patch (RFC 7386) `kubectl patch --type=merge`
applies: the e2e tests describe a pod shape as a patch (`shape_patch` removes
`isolation.identity` with `None`), and a patch that means something else on the harness than
on the API server would render a resource nobody applied."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from harness.epp.rendered import deep_merge

_KEYS = st.sampled_from(["a", "b", "c"])
_LEAF = st.one_of(st.integers(), st.text(max_size=3), st.booleans())
_DOC = st.recursive(_LEAF, lambda inner: st.dictionaries(_KEYS, inner, max_size=3), max_leaves=8)
_PATCH = st.recursive(
    st.one_of(_LEAF, st.none()), lambda inner: st.dictionaries(_KEYS, inner, max_size=3),
    max_leaves=8,
)  # fmt: skip


def _rfc7386(target: Any, patch: Any) -> Any:
    """The RFC's own pseudocode, word for word."""
    if isinstance(patch, dict):
        if not isinstance(target, dict):
            target = {}
        target = dict(target)
        for name, value in patch.items():
            if value is None:
                target.pop(name, None)
            else:
                target[name] = _rfc7386(target.get(name), value)
        return target
    return patch


def test_a_removal_inside_a_mapping_the_base_lacks_is_not_a_value() -> None:
    base: dict[str, Any] = {"model": {"replicas": 1}}
    deep_merge(base, {"isolation": {"mode": "Shared", "identity": None}})
    assert base == {"model": {"replicas": 1}, "isolation": {"mode": "Shared"}}


@given(st.dictionaries(_KEYS, _DOC, max_size=3), st.dictionaries(_KEYS, _PATCH, max_size=3))
def test_deep_merge_is_rfc_7386(base: dict[str, Any], patch: dict[str, Any]) -> None:
    want = _rfc7386(copy.deepcopy(base), patch)
    deep_merge(base, patch)
    assert base == want

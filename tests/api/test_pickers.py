"""The picker profile table: one row per picker, and everything that says what a picker
does or refuses reads it."""

from __future__ import annotations

from typing import Any

import pytest

from promptcache.api import parse_resource
from promptcache.api.reference import api_reference_markdown
from promptcache.api.rules import GIE_LRU_CAPACITY, picker_refusals, picker_refused_fields
from promptcache.contract import DEFAULT_LRU_CAPACITY_PER_SERVER, PROFILES, PickerTarget, lacking
from promptcache.contract import PickerFeature as Feature


def test_every_picker_has_one_row() -> None:
    assert list(PROFILES) == list(PickerTarget)
    assert all(profile.picker is picker for picker, profile in PROFILES.items())


def test_the_lru_a_picker_falls_back_to_is_what_the_api_holds_it_to() -> None:
    for picker in lacking(Feature.LRU_CAPACITY):
        assert PROFILES[picker].default_lru_capacity == GIE_LRU_CAPACITY
    assert GIE_LRU_CAPACITY == DEFAULT_LRU_CAPACITY_PER_SERVER


def test_a_picker_that_derives_the_salt_itself_has_no_policy_step() -> None:
    for profile in PROFILES.values():
        assert profile.policy_step is (Feature.TENANT_SALT not in profile.features)


EVERYTHING: dict[str, Any] = {
    "sessionAffinity": {"enabled": True},
    "prefixCache": {
        "tiers": [{"name": "coarse"}],
        "tokenProducer": "VllmRender",
        "lruCapacityPerServer": 8000,
    },
    "isolation": {"mode": "PerKey"},
}


@pytest.mark.parametrize("picker", list(PickerTarget))
def test_the_rules_refuse_exactly_what_the_row_lacks(picker: PickerTarget) -> None:
    """Each optional field the picker's row lacks the feature for is refused, one message
    each, and nothing else; the docs table lists the same fields."""
    spec = parse_resource(
        {
            "apiVersion": "serving.promptcache.io/v1alpha1",
            "kind": "PromptCacheDeployment",
            "metadata": {"name": "t", "namespace": "ns"},
            "spec": {"model": {"name": "m"}, **EVERYTHING},
        }
    ).spec
    refused = picker_refusals(spec, picker)
    assert len(refused) == len(picker_refused_fields(picker))
    row = next(line for line in api_reference_markdown().splitlines() if f"| `{picker}` (" in line)
    for field in picker_refused_fields(picker):
        assert field in row

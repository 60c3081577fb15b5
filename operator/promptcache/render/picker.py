"""Which Endpoint Picker the resolved resource deploys, and that picker's row.

The generated config and the status both say what the picker will use, not what was
asked: the block size after its floor, the per-pod index capacity after autoTune. What
differs between pickers is one row each in `contract.PROFILES`; `picker_target` gives
the row of the picker the resource deploys (`spec.gateway.picker`, filled from the
operator's defaults by `api.resolved`, so callers pass the resolved resource).
"""

from __future__ import annotations

from promptcache.api import PromptCacheDeployment, filled
from promptcache.contract import PickerProfile, PickerTarget, profile_of

__all__ = ["PickerProfile", "picker_of", "picker_target"]


def picker_of(pcd: PromptCacheDeployment) -> PickerTarget:
    """The picker the resolved resource targets (`api.resolved` fills an empty field from
    the operator's defaults; read before that, `UnresolvedError`)."""
    return filled(pcd.spec.gateway.picker, "spec.gateway.picker")


def picker_target(pcd: PromptCacheDeployment) -> PickerProfile:
    """The row (`contract.PROFILES`) of the picker the resolved resource deploys."""
    return profile_of(picker_of(pcd))

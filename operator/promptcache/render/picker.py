"""Which Endpoint Picker the resolved resource deploys, and that picker's row.

The generated config and the status both say what the picker will use, not what was
asked: the block size after its floor, the per-pod index capacity after autoTune. What
differs between pickers is one row each in `api.pickers.PROFILES`; `picker_target` gives
the row of the picker the resource deploys (`spec.gateway.picker`, filled from the
operator's defaults by `api.resolved`, so callers pass the resolved resource).
"""

from __future__ import annotations

from promptcache.api import PromptCacheDeployment, filled
from promptcache.api.pickers import PickerProfile, profile_of
from promptcache.contract import PickerTarget

__all__ = ["PickerProfile", "picker_of", "picker_target"]


def picker_of(pcd: PromptCacheDeployment) -> PickerTarget:
    """The picker the resolved resource targets (`api.resolved` fills an empty field from
    the operator's defaults; read before that, `UnresolvedError`)."""
    return filled(pcd.spec.gateway.picker, "spec.gateway.picker")


def picker_target(pcd: PromptCacheDeployment) -> PickerProfile:
    """The row (`api.pickers.PROFILES`) of the picker the resolved resource deploys."""
    return profile_of(picker_of(pcd))

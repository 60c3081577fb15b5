"""What the Endpoint Picker really does with the prefix-cache settings, per picker release.

The generated config and the status both say what the picker will use, not what was
asked: the block size after its floor, the per-pod index capacity after autoTune. The
rules differ between pickers, so each is a `PickerTarget`; `picker_target` chooses the
one the resource deploys (`spec.gateway.picker`, filled from the operator's defaults by
`render.resolved`, so callers pass the resolved resource): llm-d-router, or the upstream
GIE v1.5 picker, which has no 64-token floor and ignores `lruCapacityPerServer`
(docs/endpoint-picker.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from promptcache.api import PromptCacheDeployment
from promptcache.api.constants import EPP_MIN_BLOCK_SIZE_TOKENS
from promptcache.contract import DEFAULT_PICKER

DEFAULT_LRU_CAPACITY_PER_SERVER = 31250
"""The approximate prefix producer's own default per-pod capacity (both pickers)."""


@dataclass(frozen=True)
class PickerTarget:
    """One Endpoint Picker release's prefix-cache behaviour."""

    name: str
    min_block_size_tokens: int
    """Block sizes below this are raised to it, configured or auto-tuned (1: no floor)."""
    honours_lru_capacity: bool
    """False: the per-pod index ignores `lruCapacityPerServer` (its own default applies)."""

    def effective_block_size(self, requested: int) -> int:
        """The block size the picker uses for `requested` tokens."""
        return max(requested, self.min_block_size_tokens)

    def block_size(self, *, auto_tune: bool, configured: int, scraped: int | None) -> int:
        """autoTune off: the configured size; on: the pods' size once seen, else the
        configured one; either way after the floor."""
        chosen = scraped if auto_tune and scraped is not None and scraped > 0 else configured
        return self.effective_block_size(chosen)

    def index_capacity(self, *, auto_tune: bool, configured: int, gpu_blocks: int | None) -> int:
        """Blocks the picker's approximate index keeps per pod: under autoTune the pods'
        `num_gpu_blocks` when reported, else the configured capacity (if the picker honours it)."""
        if auto_tune and gpu_blocks is not None and gpu_blocks > 0:
            return gpu_blocks
        return configured if self.honours_lru_capacity else DEFAULT_LRU_CAPACITY_PER_SERVER


LLM_D_ROUTER = PickerTarget(
    name="llm-d-router",
    min_block_size_tokens=EPP_MIN_BLOCK_SIZE_TOKENS,
    honours_lru_capacity=True,
)
"""llm-d-router v0.10.0 (the default image): 64-token floor (llm-d-router #1158)."""


GIE_V1_5 = PickerTarget(name="gie-v1.5", min_block_size_tokens=1, honours_lru_capacity=False)
"""The upstream GIE EPP v1.5.0: no floor; the per-pod LRU is `num_gpu_blocks` under autoTune,
else its own 31250 whatever `lruCapacityPerServer` says (so the API refuses another value)."""

PROMPTCACHE = PickerTarget(name="promptcache", min_block_size_tokens=1, honours_lru_capacity=False)
"""promptcache's build of the GIE v1.5.0 picker (`picker/`): GIE's prefix behaviour."""

TARGETS: dict[str, PickerTarget] = {t.name: t for t in (LLM_D_ROUTER, GIE_V1_5, PROMPTCACHE)}


def picker_target(pcd: PromptCacheDeployment) -> PickerTarget:
    """The picker the resource deploys (`spec.gateway.picker`, else the built-in default)."""
    return TARGETS[pcd.spec.gateway.picker or DEFAULT_PICKER]

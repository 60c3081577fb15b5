"""What the Endpoint Picker really does with the prefix-cache settings, per picker release.

The generated config and the status both say what the picker will use, not what was
asked: the block size after its floor, the per-pod index capacity after autoTune. The
rules differ between pickers, so each is a `PickerTarget`; `picker_target` chooses the
one the resource deploys (llm-d-router today; the upstream GIE v1.5 picker has no
64-token floor and ignores `lruCapacityPerServer`, see ../shared/reference/endpoint-picker.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from promptcache.api import PromptCacheDeployment
from promptcache.api.constants import EPP_MIN_BLOCK_SIZE_TOKENS

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


def picker_target(pcd: PromptCacheDeployment) -> PickerTarget:
    """The picker the resource deploys (one today; a spec field will choose it)."""
    del pcd
    return LLM_D_ROUTER

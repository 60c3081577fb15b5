"""Prompt-embeds cache arithmetic shared by the renderer and the status writer.

The cache is per process (spec/000): each of the `apiServerCount` serving
processes in a pod keeps its own cache of `cacheGiB`, so what a pod can really
hold is N times what the user configured. Both the pod environment and the
reported ceiling are computed here so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

from promptcache.contract.cache_size import GIB, cache_gib_to_bytes


@dataclass(frozen=True)
class PromptEmbedsCeiling:
    """Upper bounds on memory the prompt-embeds caches may take."""

    per_process_bytes: int
    per_pod_bytes: int
    total_bytes: int

    @property
    def per_pod_gib(self) -> float:
        return self.per_pod_bytes / GIB

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB


def prompt_embeds_ceiling(
    *, enabled: bool, cache_gib: float, processes_per_pod: int, replicas: int
) -> PromptEmbedsCeiling:
    """Compute the real ceiling: `cacheGiB` per process x processes x replicas.

    A disabled feature or a zero size holds nothing, whatever the counts.
    """
    per_process = cache_gib_to_bytes(cache_gib) if enabled and cache_gib > 0 else 0
    per_pod = per_process * processes_per_pod
    return PromptEmbedsCeiling(
        per_process_bytes=per_process, per_pod_bytes=per_pod, total_bytes=per_pod * replicas
    )

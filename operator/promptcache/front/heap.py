"""Keeping the front's import-time heap out of the garbage collector's full passes.

Why: CPython's full collection walks every tracked object, and the front's heap is mostly
what its imports made (about 210 000 objects once torch is loaded for prompt embeds): one
full pass held the event loop for ~200 ms on this project's 2-core machine, longer when
the machine was busy. Full passes come when enough new objects have survived, which is what
a client holding many connections causes (each held request's objects survive the young
collections); under `bench/hostile_load.py --attacks hold` they were the `/healthz` and
tenant tails of up to 1.3 s that no slot or share explained. Objects that live as long as
the process need no collecting: `freeze` moves them to the permanent generation, so a full
pass walks only what requests made since.
"""

from __future__ import annotations

import gc

__all__ = ["freeze"]


def freeze(*, collect: bool = False) -> int:
    """Move every object tracked now out of the collector's passes (`gc.freeze`); collect
    first when `collect` (at start-up, before any request: nothing in flight is frozen).
    Returns how many objects are frozen in all."""
    if collect:
        gc.collect()
    gc.freeze()
    return gc.get_freeze_count()

"""The front's long-lived heap is out of the collector's full passes (issue 43's measure).

A full collection walks every tracked object; the front's are mostly what its imports
made (about 210 000 once torch is loaded), and one full pass held its loop ~200 ms, more on
a busy machine: the tails under `bench/hostile_load.py --attacks hold`, whose held requests
make full passes come often. Counted, not timed: after `heap.freeze`, what a full pass
walks is what was made since, a small part of what was frozen.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from promptcache.front import heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # the rest of the test session collects as before


def test_a_full_pass_walks_only_what_was_made_after_the_freeze(unfrozen: None) -> None:
    before = len(gc.get_objects())
    frozen = heap.freeze(collect=True)
    assert frozen >= before // 2  # the session's modules, at least
    made = [[i] for i in range(1000)]  # a request's worth of new objects
    walked = len(gc.get_objects())
    assert 1000 <= walked < frozen // 10, (walked, frozen)
    del made

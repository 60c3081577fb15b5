"""The memory budget both data-plane processes admit requests under (`runtime.budget`).

One scope per request: it charges before memory is used, refuses with the same statuses
and codes in both processes (only the words naming the process differ), and gives back
everything when the request ends, however it ends.
"""

from __future__ import annotations

import pytest

from promptcache.front.state import MEMORY_WORDS
from promptcache.runtime.budget import BudgetWords, MemoryBudget
from promptcache.tenancy.errors import FrontError

WORDS = BudgetWords(server="this server", holder="the test", needs="", resource="test budget")


def test_a_scope_gives_everything_back_however_the_request_ends() -> None:
    budget = MemoryBudget(1000, 100, WORDS)

    def request() -> None:
        with budget.scope(b"a") as scope:
            scope.take(300)
            scope.hold(200)
            assert budget.used == 500
            raise RuntimeError("the request failed")

    with pytest.raises(RuntimeError):
        request()
    assert budget.used == 0
    assert budget.held(b"a") == 0


async def test_an_async_scope_gives_back_too() -> None:
    budget = MemoryBudget(1000, 100, WORDS)
    async with budget.scope(b"a") as scope:
        scope.take(400)
        scope.give_back(100)
        assert (budget.used, scope.held) == (300, 300)
    assert budget.used == 0


def test_the_three_refusals() -> None:
    refused: list[None] = []
    budget = MemoryBudget(1600, 50, WORDS, on_share_refused=lambda: refused.append(None))
    alone = budget.scope(b"alone")
    with pytest.raises(FrontError) as too_large:
        alone.take(801)  # more than one client's share: never served
    assert (too_large.value.status, too_large.value.code) == (413, "request_too_large")
    assert str(too_large.value.message).endswith("this server gives one client at most 800")
    other = budget.scope(b"other")
    other.take(100)
    alone.take(700)
    second = budget.scope(b"alone")  # another request of the same client
    with pytest.raises(FrontError) as over_share:
        second.take(200)  # its client would pass its share while another client holds some
    assert (over_share.value.status, over_share.value.code) == (429, "tenant_share_exceeded")
    assert refused == [None]
    third = budget.scope(b"third")
    third.take(700)
    with pytest.raises(FrontError) as exhausted:
        budget.scope(b"fourth").take(200)  # holds nothing; the budget is full
    assert (exhausted.value.status, exhausted.value.code) == (503, "memory_budget_exhausted")
    assert "the test's memory budget" in exhausted.value.message
    refusal = second.refusal(200)  # the same refusal, returned instead of raised
    assert refusal is not None
    assert refusal.status == 429
    assert len(refused) == 2
    for scope in (alone, other, third):
        scope.release()
    assert budget.used == 0


def test_the_front_words_its_refusals_as_before() -> None:
    budget = MemoryBudget(100, 100, MEMORY_WORDS)
    with pytest.raises(FrontError) as caught:
        budget.scope(b"a").take(101)
    assert caught.value.message == (
        "the request needs about 101 bytes of working memory (its body, parsed, with every "
        "prompt-embeds payload and reference at its full size); this server gives one client "
        "at most 100"
    )

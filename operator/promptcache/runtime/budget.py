"""The memory budget both data-plane processes admit requests under, as one scope per request.

The cache front and the gateway's policy step each hold requests in memory (a body as it
arrives, its parse, what is forwarded) under a byte budget shared by client identity
(`tenancy.shares.Ledger`). Each request charges a `MemoryScope` before it uses the
memory, and the scope gives everything back when it ends, however it ends (`with` or
`async with`, or `release()`), so no path can leak budget. The refusals are the same on
both processes: 413 `request_too_large` when the request alone needs more than one
client's share, 429 `tenant_share_exceeded` when its client holds its share while others
hold some (counted by the process' `tenant_share_refusals{resource="memory"}`), 503
`memory_budget_exhausted` when the process holds all it may. Only the words naming the
process and what its working memory is made of differ (`BudgetWords`).

Thread-safe: the front's decode threads charge too (one uncontended lock a take; the step,
one event loop, pays the same ~0.1 us for one implementation).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from promptcache.tenancy import errors
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.shares import Ledger, Verdict, share_of, share_refusal

__all__ = ["BudgetWords", "MemoryBudget", "MemoryScope"]

SHARE_RESOURCE = "memory"
"""The `resource` label both processes count a refused share of this budget under
(`<process>_tenant_share_refusals_total{resource="memory"}`)."""
USED_METRIC = "memory_budget_used_bytes"
USED_HELP = (
    "Bytes of the process' memory budget charged to requests now (bodies, their parse, "
    "what is forwarded); at the budget, new requests get 503 memory_budget_exhausted."
)
CAPACITY_METRIC = "memory_budget_bytes"
CAPACITY_HELP = "The process' memory budget for requests in flight, in bytes."
"""Both processes export `<prefix>_memory_budget_used_bytes` and `<prefix>_memory_budget_bytes`
(prefix `promptcache_front`, `promptcache_gateway_policy`): one name, one meaning."""


@dataclass(frozen=True, slots=True)
class BudgetWords:
    """How one process names itself and its working memory in the budget's refusals."""

    server: str
    """Who gives a client at most its share, e.g. "this server", "the gateway"."""
    holder: str
    """Whose budget is in use (503), e.g. "the cache front", "the gateway"."""
    needs: str
    """What the working memory is made of, after "bytes of working memory"."""
    resource: str
    """The budget as the 429 names it, e.g. "memory budget for requests in flight"."""


class MemoryBudget:
    """One process' in-flight byte budget, shared by client identity: the admission rules
    of `tenancy.shares` under a lock, and the refusals both processes answer with."""

    def __init__(
        self,
        capacity: int,
        share_percent: int,
        words: BudgetWords,
        on_share_refused: Callable[[], None] = lambda: None,
    ) -> None:
        self.ledger = Ledger(capacity, share_of(capacity, share_percent))
        self.words = words
        self.lock = threading.Lock()
        self._on_share_refused = on_share_refused

    @property
    def share(self) -> int:
        """The most one client may hold while others hold some (and one request ever)."""
        return self.ledger.share

    @property
    def capacity(self) -> int:
        return self.ledger.capacity

    @property
    def used(self) -> int:
        """Bytes charged to requests now."""
        return self.ledger.used

    def held(self, key: bytes) -> int:
        with self.lock:
            return self.ledger.held(key)

    def check(self, key: bytes, n: int) -> Verdict:
        """Whether `key` could take `n` more bytes now (nothing is taken)."""
        with self.lock:
            return self.ledger.check(key, n)

    def share_refusal(self, key: bytes) -> FrontError:
        """The 429 for `key` holding its share (counted as a refused share)."""
        self._on_share_refused()
        return share_refusal(self.words.resource, self.held(key), self.share, "bytes")

    def scope(self, key: bytes) -> MemoryScope:
        """A request's charge against this budget, counted against client `key`."""
        return MemoryScope(self, key)


class MemoryScope:
    """One request's share of a `MemoryBudget`, given back whole when the request ends.

    `take` charges before the memory is used, or raises the refusal; `hold` counts what
    can no longer be refused (an answer whose head was sent); `give_back` returns part
    whose memory is freed; `release` (or leaving `with`/`async with`) returns the rest."""

    __slots__ = ("_budget", "held", "key")

    def __init__(self, budget: MemoryBudget, key: bytes) -> None:
        self._budget = budget
        self.key = key
        """The client identity the charge counts against (`tenancy.shares.identity_key`)."""
        self.held = 0

    def take(self, n: int) -> None:
        """Charge `n` more bytes, or raise 413 / 429 / 503 (nothing charged then)."""
        budget = self._budget
        with budget.lock:
            ledger = budget.ledger
            if self.held + n > ledger.share:
                raise FrontError(
                    413,
                    errors.REQUEST_TOO_LARGE,
                    f"the request needs about {self.held + n} bytes of working memory"
                    f"{budget.words.needs}; {budget.words.server} gives one client at most "
                    f"{ledger.share}",
                )
            verdict = ledger.take(self.key, n)
            if verdict is Verdict.TAKE:
                self.held += n
                return
        if verdict is Verdict.OVER_SHARE:
            raise budget.share_refusal(self.key)
        raise FrontError(
            503,
            errors.MEMORY_BUDGET_EXHAUSTED,
            f"{budget.words.holder}'s memory budget for requests in flight is in use; "
            "retry shortly",
        )

    def refusal(self, n: int) -> FrontError | None:
        """`take`, returning the refusal instead of raising it (for a caller that answers
        it in its own wire format)."""
        try:
            self.take(n)
        except FrontError as error:
            return error
        return None

    def hold(self, n: int) -> None:
        """Count `n` bytes this request holds without refusing (negative `n` gives back)."""
        if n < 0:
            self.give_back(-n)
            return
        with self._budget.lock:
            self._budget.ledger.hold(self.key, n)
            self.held += n

    def give_back(self, n: int) -> None:
        """Return part of the charge whose memory is already freed (a finished decode)."""
        with self._budget.lock:
            n = min(n, self.held)
            self._budget.ledger.give(self.key, n)
            self.held -= n

    def release(self) -> None:
        """Give back everything this request holds (again: a no-op)."""
        with self._budget.lock:
            self._budget.ledger.give(self.key, self.held)
            self.held = 0

    def __enter__(self) -> MemoryScope:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()  # however the request ended

    async def __aenter__(self) -> MemoryScope:
        return self

    async def __aexit__(self, *_: object) -> None:
        self.release()

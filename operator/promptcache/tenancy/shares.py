"""Each client identity's share of what a process holds: slots, body reads, memory budget.

Why: deadlines bound how long a request may hold a concurrency slot or working memory,
not how many a client may hold. A client that stops reading its streams, stalls its
bodies or sends them slowly holds what it took until each deadline fires, reconnects, and
takes it again: with enough sockets it holds everything, and every other tenant is
refused for as long as it likes (issue 43). Both the cache front and the gateway's policy
step therefore count what each client identity holds of each bounded resource
(`Ledger`), and admit a request only under two rules:

- **the share, while others hold**: once another identity holds anything of the
  resource, an identity may take more only up to `share` of it (the rendered
  `tenantSharePercent`); one already over its share (it took more while it was alone) is
  refused further takes until it is back under. An identity *alone* is not held to its
  share: the share is what one identity may keep from others who want some, not a cap
  on a pod nobody else is using (behind a gateway with no keys or accounts all traffic is
  one identity, the gateway's address, and a hard cap would 429 it at half the engine's
  batch). An identity that took more than its share while alone keeps what it took until
  those requests end (nothing is taken back); the deadlines bound how long;
- **the last units go to the lightest holders**: an identity already holding `h` units may
  take `n` more only while at least min(`h`, `reserve`) stay free after it, `reserve` being
  a sixteenth of the resource (`RESERVE_FRACTION`). An identity asking for its first slot
  is served while any slot is free; one asking for its hundredth only while the reserve
  stays free. So a newcomer always finds the reserve, even beside an identity that took
  all it could while alone, and the busiest can use all but it (a reserve of `h` itself
  would leave a 1/(k+1) part idle with k tenants busy). A share of 100 % turns both
  rules off.

A refusal goes to the identity that holds too much, never to others: one that holds
something and is refused gets HTTP 429 `tenant_share_exceeded` with `Retry-After`
(`share_refusal`); one that holds nothing is refused only when the resource is exhausted
(the process's own 503). Per-identity counts exist only while something is held, so their
memory is bounded by what is in flight, whatever identities clients invent.

The identity (`identity_key`) is the account where there is one, else the isolation key,
else the bearer credential, else the connection's source: a share is as strong as the
identity behind it (keys a client chooses freely can be multiplied; accounts cannot).
This is the fair-share meter's key (`tenancy.fair_share.FairShare.key_of`, one hash and
one order for both). The meter itself does not fit here: it meters a *rate* of work by
one key over time (a token bucket, work-conserving, waits), while a slot or a byte of
working memory is *held* and must be refused at once rather than waited for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Final

from promptcache.tenancy import errors
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.fair_share import FairShare

RESERVE_FRACTION: Final[int] = 16
"""A sixteenth of each resource (at least one unit) is kept for identities holding little:
one holding `h` takes more only while min(`h`, reserve) stays free."""
RETRY_AFTER_SECONDS: Final[int] = 1
"""What a refused client is told to wait: held units come back as requests end, which is
often sooner than any deadline; a client that retries too early is refused again."""


def identity_key(
    *, account: str | bytes | None, isolation_key: str | bytes, credential: str | bytes,
    source: str | bytes,
) -> bytes:  # fmt: skip
    """The fixed-size key a request's holdings (and its fair share of work) are counted
    under: the first of account, isolation key, credential (the Authorization header) and
    connection source that is not empty, each in a namespace of its own (an isolation key
    spelled like an account is not that account)."""
    for tag, value in (
        (b"account\0", account),
        (b"key\0", isolation_key),
        (b"credential\0", credential),
        (b"source\0", source),
    ):
        if value:
            raw = value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")
            return FairShare.key_of(tag + raw)
    return FairShare.key_of(b"anonymous\0")


def share_of(capacity: int, percent: int) -> int:
    """An identity's share of `capacity` units at `percent` (at least one unit)."""
    return max(1, math.ceil(capacity * percent / 100))


class Verdict(Enum):
    """What `Ledger.check` decided."""

    TAKE = "take"
    OVER_SHARE = "over_share"
    """The identity holds something, and taking more would pass its share while another
    identity holds something, or leave less free than min(what it holds, the reserve):
    refuse it (429), not others."""
    EXHAUSTED = "exhausted"
    """The identity holds nothing and the resource has no room: the process is full (503)."""
    NEVER = "never"
    """`n` alone is more than one identity's share: it is never served (413, bytes), not
    even to an identity that is alone, so that whether one request fits does not depend on
    who else happens to be using the process (and one request cannot keep more than a share
    from others for its whole duration)."""


@dataclass
class Ledger:
    """What each identity holds of one bounded resource, and the admission rules (see the
    module's docstring). No lock: the front's byte ledger is used under its state's lock,
    every other ledger from one event loop."""

    capacity: int
    share: int
    used: int = 0

    def __post_init__(self) -> None:
        self._held: dict[bytes, int] = {}
        self.reserve = max(1, math.ceil(self.capacity / RESERVE_FRACTION))
        """Kept free for identities holding less than it (the second rule)."""

    def held(self, key: bytes) -> int:
        return self._held.get(key, 0)

    def holders(self) -> int:
        """How many identities hold something now."""
        return len(self._held)

    def heaviest(self) -> int:
        """The most any one identity holds now (0: none)."""
        return max(self._held.values(), default=0)

    @property
    def enforced(self) -> bool:
        """Whether shares apply (a share of the whole capacity, 100 %, turns them off)."""
        return self.share < self.capacity

    def others_hold(self, key: bytes) -> bool:
        """Whether an identity other than `key` holds something now (the share binds)."""
        return len(self._held) > (1 if key in self._held else 0)

    def check(self, key: bytes, n: int) -> Verdict:
        """Whether `key` may take `n` more units now (nothing is taken): the share binds only
        while another identity holds something; the reserve binds always (module docstring)."""
        held = self._held.get(key, 0)
        if not self.enforced:
            return Verdict.TAKE if self.used + n <= self.capacity else Verdict.EXHAUSTED
        if n > self.share:
            return Verdict.NEVER
        within_share = held + n <= self.share or not self.others_hold(key)
        if within_share and self.capacity - self.used - n >= min(held, self.reserve):
            return Verdict.TAKE
        return Verdict.OVER_SHARE if held else Verdict.EXHAUSTED

    def take(self, key: bytes, n: int) -> Verdict:
        """Take `n` units for `key` when `check` allows it; the verdict either way."""
        verdict = self.check(key, n)
        if verdict is Verdict.TAKE:
            self.hold(key, n)
        return verdict

    def hold(self, key: bytes, n: int) -> None:
        """Count `n` units `key` holds without asking (what cannot be refused any more,
        such as the pieces of an answer whose head was sent)."""
        if n <= 0:
            return
        self.used += n
        self._held[key] = self._held.get(key, 0) + n

    def give(self, key: bytes, n: int) -> None:
        """Give back `n` units `key` held (never more than it holds)."""
        held = self._held.get(key, 0)
        n = min(n, held)
        if n <= 0:
            return
        self.used -= n
        if held == n:
            del self._held[key]
        else:
            self._held[key] = held - n

    def snapshot(self) -> Mapping[bytes, int]:
        return dict(self._held)


def share_refusal(what: str, held: int, share: int, unit: str = "") -> FrontError:
    """The 429 both processes answer a client that holds too much of `what` with; the
    contract's error body, and `Retry-After`."""
    units = f" {unit}" if unit else ""
    return FrontError(
        429,
        errors.TENANT_SHARE_EXCEEDED,
        f"this client already holds {held}{units} of the server's {what}; while other clients "
        f"hold some too, one client may hold at most {share}{units}, and fewer while the "
        f"server is nearly full (the last free ones go to clients holding less). Retry in "
        f"{RETRY_AFTER_SECONDS} s, finish "
        "or read the requests you have open, or send fewer at once",
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )

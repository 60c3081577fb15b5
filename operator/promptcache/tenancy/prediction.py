"""What the picker predicted for a request, told to the chosen pod so that only it is believed.

promptcache's Endpoint Picker knows, at the pick, how much of the prompt's prefix GIE's
prefix producer believes the chosen pod holds. Its PreRequest plugin
(`picker/plugins/predicted`) sends that to the pod in one header,
`x-promptcache-predicted`; the cache front counts it beside what vLLM then reports as
`cached_tokens`, so predicted and delivered hit ratios can be compared over any window
(issue 39). The header is

    v1.<unix seconds>.<nonce>.<match blocks>.<total blocks>.<block tokens>[.<seen>.<held>].<mac>

- the figures are GIE's own (`PrefixCacheMatchInfo`): the blocks of the prompt the
  producer hashed, how many of them its index places on the chosen pod, and the block size
  in tokens. The predicted tokens are the matched share of the blocks times the prompt
  tokens vLLM reports (`Prediction.tokens`), not `match blocks * block tokens`: GIE cuts
  blocks of `block tokens * 4` characters, and a real tokenizer can be several times off
  that (measured on the real engine: hex text, 4x), which would make the prediction look
  far below what the engine delivered. Sending the blocks rather than a token count keeps
  the header the picker's raw belief and leaves the conversion in one place.
- `seen` and `held`, when the picker could estimate them (`picker/ladder`): of the same
  blocks, how many a perfect, infinitely large cache would have held (the prefix was seen
  in the pool, in this scope, within the window: the workload rung) and how many a cache
  of the pool's real KV size would have held (an LRU simulation: the capacity rung).
- `mac` is an HMAC-SHA256 under a key derived from the salt Secret that the picker and the
  front both mount (`prediction_key`; its own label, so the key signs nothing the
  identity attestation accepts, and back), over the header's text before it (version,
  time, random nonce, figures, as written): the front checks it without decoding
  anything but the match of one pattern.
- the front accepts it for `IDENTITY_ATTESTATION_MAX_AGE_SECONDS` (plus the clock skew)
  and once per front process (`attestation.ReplayGuard`, its own instance).

So a client that reaches a pod directly cannot skew the figures: without the salt key it
cannot make a header that verifies (counted `forged`, never believed), and a header it
somehow saw is good once, for a minute, in the process that already admitted it. Unlike the
identity attestation the header is not bound to the body: what it could gain by being
moved onto another request is one sample of a metric, not a tenant's scope, and a body
digest at the front would cost more per request than the whole accounting (issue 39 asks
for at most 2 % of a request's CPU). The front removes the header before vLLM whatever it
made of it.
"""

from __future__ import annotations

import binascii
import hmac
import re
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple

from promptcache.contract import (
    IDENTITY_ATTESTATION_MAX_AGE_SECONDS,
    IDENTITY_CLOCK_SKEW_SECONDS,
)
from promptcache.tenancy.attestation import NONCE_BYTES, Outcome, ReplayGuard
from promptcache.tenancy.keyed import KeyedMac

VERSION: Final[str] = "v1"
_KEY_LABEL: Final[bytes] = b"promptcache/prediction-key/v1"
_MAC_DOMAIN: Final[bytes] = b"promptcache/prediction/v1\0"
MAX_FIGURE: Final[int] = 1 << 24
"""Largest block count or block size a header may carry (16 Mi blocks: far beyond any
context window); a longer number is malformed, so parsing stays bounded."""
_FORM: Final = re.compile(
    r"v1\.(?P<ts>[0-9]{1,12})\.[A-Za-z0-9_-]{16}"
    r"\.(?P<match>0|[1-9][0-9]{0,7})\.(?P<total>0|[1-9][0-9]{0,7})\.(?P<block>[1-9][0-9]{0,7})"
    r"(?:\.(?P<seen>0|[1-9][0-9]{0,7})\.(?P<held>0|[1-9][0-9]{0,7}))?"
    r"\.(?P<mac>[A-Za-z0-9_-]{43})"
)
"""The header's one form (the nonce is only signed, never read). The MAC is its last 43
characters, after a dot: `_MAC_TAIL`."""
_MAC_TAIL: Final[int] = 44
_URLSAFE: Final[bytes] = bytes.maketrans(b"+/", b"-_")


def prediction_key(secret: bytes) -> bytes:
    """The signing key, derived from the salt key (never the salt key itself)."""
    return hmac.digest(secret, _KEY_LABEL, "sha256")


class Prediction(NamedTuple):
    """GIE's prefix match for the chosen pod, as the picker signed it.

    A named tuple rather than a frozen dataclass: as immutable, and a third of the cost to
    make, which the front pays on every request the picker predicted (issue 39's budget)."""

    match_blocks: int
    total_blocks: int
    block_tokens: int
    seen_blocks: int | None = None
    """Blocks a perfect, infinitely large cache would have held (None: not estimated)."""
    held_blocks: int | None = None
    """Blocks a cache of the pool's KV size would have held (set with `seen_blocks`)."""

    def _tokens(self, blocks: int, prompt_tokens: int) -> int:
        """`blocks` of the prompt's hashed blocks as a share of the tokens vLLM counted.

        Not `blocks x block_tokens`: GIE cuts its blocks at 4 characters a token, and real
        tokenizers differ by several times (hex text is about one character a token on the
        test model: a block of 128 characters is about 128 tokens, not 32), so that product
        would be in GIE's unit and not comparable with `cached_tokens`. The share of the
        blocks is unit-free; it is exact but for the partial last block, the chat template's
        own tokens, and a prompt longer than the producer's `maxPrefixBlocksToMatch` (its
        blocks then cover only the start of it, and the share overstates)."""
        if self.total_blocks <= 0 or prompt_tokens <= 0:
            return 0
        return max(0, min(prompt_tokens, round(prompt_tokens * blocks / self.total_blocks)))

    def ladder(self, prompt_tokens: int) -> tuple[int, int, int]:
        """`tokens`, `workload_tokens` and `capacity_tokens` in one call: what the front adds
        to its counters for each answered request the picker predicted."""
        total = self.total_blocks
        if total <= 0 or prompt_tokens <= 0:
            return 0, 0, 0
        match, seen, held = self.match_blocks, self.seen_blocks or 0, self.held_blocks or 0
        if 0 <= match <= total and 0 <= seen <= total and 0 <= held <= total:
            # as `check` guarantees: each share is within [0, 1], so each figure within
            # [0, prompt_tokens] (the float quotient of two exact integers is correctly
            # rounded) and `_tokens`'s clamps, most of its cost, change nothing
            return (
                round(prompt_tokens * match / total),
                round(prompt_tokens * seen / total),
                round(prompt_tokens * held / total),
            )
        return (
            self.tokens(prompt_tokens),
            self.workload_tokens(prompt_tokens),
            self.capacity_tokens(prompt_tokens),
        )

    def tokens(self, prompt_tokens: int) -> int:
        """The prompt tokens the picker expected the pod to hold: the share of the prompt's
        blocks it matched on that pod, in the tokens vLLM counted."""
        return self._tokens(self.match_blocks, prompt_tokens)

    def workload_tokens(self, prompt_tokens: int) -> int:
        """The tokens a perfect cache would have served (0 when not estimated)."""
        return self._tokens(self.seen_blocks or 0, prompt_tokens)

    def capacity_tokens(self, prompt_tokens: int) -> int:
        """The tokens a cache of the pool's KV size would have served (0 when not estimated)."""
        return self._tokens(self.held_blocks or 0, prompt_tokens)

    @property
    def estimated(self) -> bool:
        """Whether the workload and capacity figures came with it."""
        return self.seen_blocks is not None and self.held_blocks is not None

    @property
    def figures(self) -> str:
        """The signed part of the header: the figures, as written."""
        out = f"{self.match_blocks}.{self.total_blocks}.{self.block_tokens}"
        if self.estimated:
            out += f".{self.seen_blocks}.{self.held_blocks}"
        return out


def _b64(digest: bytes) -> bytes:
    """base64url without padding (`attestation._b64`), as ASCII bytes; the one-call C
    encoder, about half the cost of `base64.urlsafe_b64encode` and its strip and decode."""
    return binascii.b2a_base64(digest, newline=False).rstrip(b"=").translate(_URLSAFE)


def _keyed(key: bytes) -> KeyedMac:
    """The header's MAC under `key`: the domain absorbed with the key, once."""
    return KeyedMac(key, _MAC_DOMAIN)


def _mac(key: KeyedMac, signed: bytes) -> bytes:
    """The MAC of the header's text before it, as it is written (base64url, no padding)."""
    return _b64(key.digest(signed))


def sign(key: bytes, prediction: Prediction, *, now: int, nonce: bytes | None = None) -> str:
    """The header value the picker sends the chosen pod (the Go port: picker/prediction)."""
    nonce = secrets.token_bytes(NONCE_BYTES) if nonce is None else nonce
    signed = f"{VERSION}.{now}.{_b64(nonce).decode('ascii')}.{prediction.figures}"
    return f"{signed}.{_mac(_keyed(key), signed.encode('ascii')).decode('ascii')}"


class Verdict(NamedTuple):
    """What the front made of a request's predicted-match header."""

    prediction: Prediction | None
    outcome: Outcome


_REFUSED: Final[dict[Outcome, Verdict]] = {o: Verdict(None, o) for o in Outcome}
"""Every verdict without a prediction, made once."""
_VALID: Final = Outcome.VALID
_tuple: Final = tuple.__new__


def check(
    key: bytes | KeyedMac,
    values: Sequence[str],
    *,
    now: int,
    guard: ReplayGuard,
    max_age: int = IDENTITY_ATTESTATION_MAX_AGE_SECONDS,
    skew: int = IDENTITY_CLOCK_SKEW_SECONDS,
) -> Verdict:
    """The prediction the picker signed for this request, or why there is none. An empty
    value is no prediction (the picker blanks a client's copy when it has none to send).

    `key`: the derived key (`prediction_key`), or, on a path that checks many headers, the
    `KeyedMac` of it (`PredictionReader` keeps one). The order of the checks is the cost's:
    the form (one pattern), the signature (a constant-time compare), then the figures, the
    time, and last the replay guard, which only signed headers reach."""
    if len(values) == 1:  # as the picker sends it
        value = values[0].strip(" \t")
        if not value:
            return _REFUSED[Outcome.ABSENT]
    else:
        present = [v for v in values if v.strip(" \t")]
        if not present:
            return _REFUSED[Outcome.ABSENT]
        if len(present) > 1:
            return _REFUSED[Outcome.AMBIGUOUS]
        value = present[0].strip(" \t")
    form = _FORM.fullmatch(value)
    if form is None:
        return _REFUSED[Outcome.MALFORMED]
    ts, match_text, total_text, block_text, seen_text, held_text, mac_text = form.groups()
    mac = mac_text.encode("ascii")
    keyed = key if isinstance(key, KeyedMac) else _keyed(key)
    if not hmac.compare_digest(mac, _mac(keyed, value[:-_MAC_TAIL].encode("ascii"))):
        return _REFUSED[Outcome.FORGED]
    match, total, block = int(match_text), int(total_text), int(block_text)
    if seen_text is None:
        seen = held = None
        within = match <= total
    else:
        seen, held = int(seen_text), int(held_text)
        within = match <= total and seen <= total and held <= total
    if total > MAX_FIGURE or block > MAX_FIGURE or not within:
        return _REFUSED[Outcome.MALFORMED]
    issued = int(ts)
    if issued > now + skew:
        return _REFUSED[Outcome.FUTURE]
    if now - issued > max_age:
        return _REFUSED[Outcome.EXPIRED]
    if not guard.admit(mac, issued + max_age + skew, now):
        return _REFUSED[Outcome.REPLAYED]
    # what the named tuples' own __new__ does, without its Python frame (half the cost)
    return _tuple(Verdict, (_tuple(Prediction, (match, total, block, seen, held)), _VALID))


class PredictionReader:
    """The front's end: the derived key (keyed once), the clock and this process's replay
    guard."""

    def __init__(
        self,
        secret: bytes,
        clock: Callable[[], float] = time.time,
        guard: ReplayGuard | None = None,
    ) -> None:
        self._key = _keyed(prediction_key(secret))
        self._clock = clock
        self.guard = ReplayGuard() if guard is None else guard

    def read(self, values: Sequence[str]) -> Verdict:
        """The verdict on the header's values as received (all of them)."""
        if not values:
            return _REFUSED[Outcome.ABSENT]  # no clock needed
        return check(self._key, values, now=int(self._clock()), guard=self.guard)

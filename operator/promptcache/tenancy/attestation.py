"""How the cache front knows an account came through the gateway: the policy step signs it.

The gateway's policy step reads the caller's account behind the gateway's authentication
(`tenancy.identity`). The cache front, in the model-server pod, cannot read it again: a
client that reaches the pod directly (no NetworkPolicy, or a CNI that does not enforce one)
could send any identity header or bearer token it likes. So the step sends the account on
in one header, `x-promptcache-identity`, signed, and the front believes no other source:

    v1.<unix seconds>.<nonce>.<account>.<mac>

- `mac` is an HMAC-SHA256 under a key derived from the salt Secret (`attestation_key`: both
  processes mount that Secret already; the derivation keeps the two uses of the key apart);
- it binds the account to this request: its time, a random nonce, the isolation-key header
  it came with, and a digest of its body (`body_digest`), so an attestation lifted from one
  request says nothing about another;
- the front accepts it for `IDENTITY_ATTESTATION_MAX_AGE_SECONDS` after it was signed (plus
  a little clock skew) and once per front process (`ReplayGuard`): a copied header,
  replayed with the same body, gets no one's scope either.

A request with no valid attestation has no account at the front: in a deployment that
requires one it is refused, otherwise it is served in a scope no account has (by key, or
the keyless one). A forged header therefore reaches nothing, whether NetworkPolicy is
enforced or not: this is why the signature, not the network, carries the trust (the
rendered NetworkPolicy remains as a second wall; docs/isolation.md).

The body digest survives the Endpoint Picker: GIE v1.5's picker decodes the body into Go
values and encodes it again (`json.Marshal` of a `map[string]any`: keys sorted, every
number a float64, HTML characters escaped) and may rewrite `model`. So the digest is taken
over the parsed body, not its bytes: `model` left out, numbers as float64, keys sorted,
one encoding. The step and the front compute it with this one function.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from multidict import MultiMapping

from promptcache.contract import (
    IDENTITY_ATTESTATION_HEADER,
    IDENTITY_ATTESTATION_MAX_AGE_SECONDS,
    IDENTITY_CLOCK_SKEW_SECONDS,
)
from promptcache.tenancy.identity import Account

VERSION: Final[str] = "v1"
_KEY_LABEL: Final[bytes] = b"promptcache/attestation-key/v1"
_MAC_DOMAIN: Final[bytes] = b"promptcache/attestation/v1\0"
_REWRITTEN_BY_PICKER: Final[frozenset[str]] = frozenset({"model"})
"""Top-level members the picker may change (GIE's model rewrite): not bound."""
_FORM: Final = re.compile(
    r"v1\.(?P<ts>[0-9]{1,12})\.(?P<nonce>[A-Za-z0-9_-]{16})\.(?P<account>[A-Za-z0-9_-]{43})"
    r"\.(?P<mac>[A-Za-z0-9_-]{43})"
)
NONCE_BYTES: Final[int] = 12
REPLAY_CAPACITY: Final[int] = 1 << 16
"""Attestations one front process remembers (about 6 MiB); a full guard forgets the oldest."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def attestation_key(secret: bytes) -> bytes:
    """The signing key, derived from the salt key (never the salt key itself)."""
    return hmac.digest(secret, _KEY_LABEL, "sha256")


def _number(text: str) -> float:
    """A JSON number as the picker's Go decoding holds it: a float64, zero unsigned."""
    return float(text) or 0.0


def body_digest(body: Mapping[str, Any]) -> bytes:
    """SHA-256 of the body as the step and the front both see it, whatever the picker's
    re-encoding did: `model` out, numbers as float64, sorted keys, one encoding.

    Three passes of the C encoder and decoder (the numbers are re-read as floats on the
    way), much cheaper than a walk in Python over a body of many values."""
    kept = {k: v for k, v in body.items() if k not in _REWRITTEN_BY_PICKER}
    text = json.dumps(kept, ensure_ascii=False)
    floats = json.loads(text, parse_int=_number, parse_float=_number)
    canonical = json.dumps(floats, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).digest()


def key_binding(values: Sequence[str]) -> bytes:
    """The isolation-key header values, as the policy reads them (a set), in one form."""
    # each value with its length before it: no two lists of values give one string
    listed = "".join(f"{len(v)}:{v}" for v in sorted(set(values)))
    return hashlib.sha256(listed.encode("utf-8", "surrogatepass")).digest()


def _mac(
    key: bytes, ts: str, nonce: bytes, account: Account, *, binding: bytes, digest: bytes
) -> bytes:
    message = _MAC_DOMAIN + ts.encode("ascii") + b"\0" + nonce + account.digest + binding + digest
    return hmac.digest(key, message, "sha256")


def sign(
    key: bytes,
    account: Account,
    *,
    key_values: Sequence[str],
    digest: bytes,
    now: int,
    nonce: bytes | None = None,
) -> str:
    """The header value that carries `account` for this request to the cache front."""
    nonce = secrets.token_bytes(NONCE_BYTES) if nonce is None else nonce
    ts = str(now)
    mac = _mac(key, ts, nonce, account, binding=key_binding(key_values), digest=digest)
    return f"{VERSION}.{ts}.{_b64(nonce)}.{account.text}.{_b64(mac)}"


class Outcome(StrEnum):
    """What the front made of a request's attestation (a metric label)."""

    ABSENT = "absent"
    VALID = "valid"
    MALFORMED = "malformed"
    FORGED = "forged"
    """Well formed, but the signature does not match this request (or any key)."""
    EXPIRED = "expired"
    FUTURE = "future"
    REPLAYED = "replayed"
    AMBIGUOUS = "ambiguous"
    """More than one attestation header."""


@dataclass(frozen=True, slots=True)
class Verdict:
    account: Account | None
    outcome: Outcome
    ticket: tuple[bytes, int] | None = None
    """A signature that checked out (`check`): its MAC and when it expires, still to pass the
    replay guard of the process that serves the request (`Attester.admit`)."""


class ReplayGuard:
    """The attestations a front process has accepted and that are still fresh: each is
    accepted once. Bounded; only valid attestations enter it, so forgeries cannot fill it.

    The MACs in the order they came (with when each expires) and as a set: each admission
    forgets from the oldest end whatever has expired, or the oldest when full, then looks
    the MAC up. A deque and a set, not an OrderedDict: the same order and bounds, a third
    less per request (every request the picker predicted passes through one)."""

    def __init__(self, capacity: int = REPLAY_CAPACITY) -> None:
        self.capacity = capacity
        self._order: deque[tuple[int, bytes]] = deque()
        self._seen: set[bytes] = set()
        self._lock = threading.Lock()  # the front verifies large bodies on decode threads

    def __len__(self) -> int:
        return len(self._seen)

    def admit(self, mac: bytes, expires: int, now: int) -> bool:
        """Remember `mac` until `expires`; False when it was already seen."""
        with self._lock:
            order, seen = self._order, self._seen
            while order and (order[0][0] < now or len(order) >= self.capacity):
                seen.discard(order.popleft()[1])
            if mac in seen:
                return False
            seen.add(mac)
            order.append((expires, mac))
            return True


def check(
    key: bytes,
    values: Sequence[str],
    *,
    key_values: Sequence[str],
    digest: bytes,
    now: int,
    max_age: int = IDENTITY_ATTESTATION_MAX_AGE_SECONDS,
    skew: int = IDENTITY_CLOCK_SKEW_SECONDS,
) -> Verdict:
    """Everything `verify` checks but the replay guard: a worker process that decides a
    large body checks its attestation there, and the serving process, which holds the
    guard, admits the ticket (a guard per worker would let a replay through another)."""
    if not values:
        return Verdict(None, Outcome.ABSENT)
    if len(values) > 1:
        return Verdict(None, Outcome.AMBIGUOUS)
    form = _FORM.fullmatch(values[0].strip(" \t"))
    account = Account.from_text(form["account"]) if form else None
    if form is None or account is None:
        return Verdict(None, Outcome.MALFORMED)
    nonce, binding = _unb64(form["nonce"]), key_binding(key_values)
    expected = _mac(key, form["ts"], nonce, account, binding=binding, digest=digest)
    mac = _unb64(form["mac"])
    if not hmac.compare_digest(mac, expected):
        return Verdict(None, Outcome.FORGED)
    issued = int(form["ts"])
    if issued > now + skew:
        return Verdict(None, Outcome.FUTURE)
    if now - issued > max_age:
        return Verdict(None, Outcome.EXPIRED)
    return Verdict(account, Outcome.VALID, ticket=(mac, issued + max_age + skew))


def admit(verdict: Verdict, guard: ReplayGuard, now: int) -> Verdict:
    """A checked verdict through the replay guard: a valid attestation is accepted once."""
    if verdict.ticket is None:
        return verdict
    mac, expires = verdict.ticket
    if not guard.admit(mac, expires, now):
        return Verdict(None, Outcome.REPLAYED)
    return Verdict(verdict.account, verdict.outcome)


def verify(
    key: bytes,
    values: Sequence[str],
    *,
    key_values: Sequence[str],
    digest: bytes,
    now: int,
    guard: ReplayGuard,
    max_age: int = IDENTITY_ATTESTATION_MAX_AGE_SECONDS,
    skew: int = IDENTITY_CLOCK_SKEW_SECONDS,
) -> Verdict:
    """The account the step signed for this very request, or why there is none."""
    checked = check(
        key, values, key_values=key_values, digest=digest, now=now, max_age=max_age, skew=skew
    )
    return admit(checked, guard, now)


class Attester:
    """Both ends of the attestation for one process: the step signs, the front verifies.

    Holds the derived key, the isolation-key header the binding reads, the clock and (at
    the front) the replay guard, so neither process repeats how a binding is built."""

    def __init__(
        self,
        secret: bytes,
        key_header: str,
        clock: Callable[[], float] = time.time,
        guard: ReplayGuard | None = None,
    ) -> None:
        self._key = attestation_key(secret)
        self._key_header = key_header
        self._clock = clock
        self.guard = guard
        """The front's (it verifies); the step only signs, and its workers get a copy."""

    def _key_values(self, headers: MultiMapping[str]) -> list[str]:
        return list(headers.getall(self._key_header, ())) if self._key_header else []

    def sign(self, account: Account, headers: MultiMapping[str], body: Mapping[str, Any]) -> str:
        """The step: the header value vouching for `account` on this request."""
        return sign(
            self._key,
            account,
            key_values=self._key_values(headers),
            digest=body_digest(body),
            now=int(self._clock()),
        )

    def check(
        self, headers: MultiMapping[str], body: Mapping[str, Any], *, now: int | None = None
    ) -> Verdict:
        """The account the step vouched for on this very request, the replay guard apart
        (`admit`): what a worker process can decide. `body` as received, before the policy
        rewrites it."""
        values = headers.getall(IDENTITY_ATTESTATION_HEADER, ())
        if not values:
            return Verdict(None, Outcome.ABSENT)
        return check(
            self._key,
            values,
            key_values=self._key_values(headers),
            digest=body_digest(body),
            now=int(self._clock()) if now is None else now,
        )

    def admit(self, verdict: Verdict, *, now: int | None = None) -> Verdict:
        """The front: a checked verdict through this process's replay guard."""
        if self.guard is None:
            raise RuntimeError("an attester without a replay guard cannot admit")
        return admit(verdict, self.guard, int(self._clock()) if now is None else now)

    def verify(self, headers: MultiMapping[str], body: Mapping[str, Any]) -> Verdict:
        """The front: the account the step vouched for on this very request, if any.
        `body` as received, before the policy rewrites it."""
        if self.guard is None:
            raise RuntimeError("an attester without a replay guard cannot verify")
        if not headers.getall(IDENTITY_ATTESTATION_HEADER, ()):
            return Verdict(None, Outcome.ABSENT)  # no clock needed
        now = int(self._clock())  # one reading of the clock for the whole verdict
        return self.admit(self.check(headers, body, now=now), now=now)


def claimed_account(headers: MultiMapping[str]) -> str | None:
    """The account a well-formed attestation header names, unverified: the front reads its
    client's identity from it before the body has arrived (the MAC binds the body, so it is
    checked later), only to count what the request holds (`tenancy.shares`). A forged one
    gains nothing but a share of its own, as an invented isolation key would."""
    values = headers.getall(IDENTITY_ATTESTATION_HEADER, ())
    if len(values) != 1:
        return None
    form = _FORM.fullmatch(values[0].strip(" \t"))
    return form["account"] if form else None

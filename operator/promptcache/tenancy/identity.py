"""Who the caller is: the account a request belongs to, read where the gateway vouches for it.

Isolation by key (spec/004's dedicated deployments) scopes the cache by a string the client
chooses, so a tenant who learns or guesses another's key joins its scope. Isolation by
account (spec/004's serverless promise: "separate caches for each account") scopes it by who
the caller *is*. Two sources name the account, in this order:

- a header the gateway's own authentication sets (an auth filter that validated a JWT or an
  API key writes the user or tenant id into it, replacing any client copy), and
- the request's bearer token (`Authorization: Bearer ...`): whoever holds a token is its
  account, and another account's scope is out of reach without its token.

Only the gateway's policy step reads an account from these (`account_at_gateway`). It
passes the account on to the cache front signed (`tenancy.attestation`); the front never
takes an account from the raw header, which a client that reaches a pod directly could set
to anything. The front does refuse a malformed one as the step does (`check_identity_sources`):
refusing grants nothing, and behind promptcache's own picker, which has no step, the front
is where such a request is refused (the picker routes it with a one-off salt).

An account is never kept as the id or token itself: `account_digest` is the HMAC of the
source and the value under the salt key, so neither a log line nor the attestation header
leaks a token, and nobody without the key can compute another account's scope.

Values, as the hostile corpus (`tests/tenancy/test_identity_corpus.py`) pins them:
- surrounding spaces and tabs are not part of a value (RFC 9110 field values); anything
  else is: case, inner spaces and percent-escapes are kept, so `Alice` and `alice` are
  two accounts unless the gateway's authentication writes one spelling;
- several copies of the identity header, or several `Authorization` headers, with
  different values are refused (HTTP 400 `invalid_identity`): the step cannot tell which
  one the authentication wrote; equal copies count once;
- an empty header is no identity;
- the bearer scheme is case-insensitive (`bearer`, `BEARER`); the token is case-sensitive
  and must be an RFC 6750 token (`[A-Za-z0-9-._~+/]+=*`): a token with inner whitespace or
  other characters is refused rather than hashed as something the gateway never accepted.
  Another scheme (`Basic`) names no account.
"""

from __future__ import annotations

import base64
import hmac
import re
from dataclasses import dataclass
from typing import Final, Protocol

from multidict import MultiMapping

from promptcache.contract import AUTHORIZATION_HEADER
from promptcache.tenancy import errors
from promptcache.tenancy.errors import FrontError

MAX_IDENTITY_CHARS: Final[int] = 1024
"""Longer identity values are refused: no gateway writes a user id that long."""
ACCOUNT_DIGEST_BYTES: Final[int] = 32
_DOMAIN: Final[bytes] = b"promptcache/account/v1\0"
_HEADER_SOURCE: Final[str] = "header"
_BEARER_SOURCE: Final[str] = "bearer"
_BEARER_TOKEN: Final = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
_OWS: Final[str] = " \t"


class IdentityReader(Protocol):
    """The settings that say where the account comes from (both processes have them)."""

    @property
    def identity_header(self) -> str: ...
    @property
    def identity_bearer(self) -> bool: ...
    @property
    def identity_required(self) -> bool: ...


def identity_enabled(settings: IdentityReader) -> bool:
    """Whether this deployment isolates by account at all."""
    return bool(settings.identity_header) or settings.identity_bearer


def identity_carriers(settings: IdentityReader) -> str:
    """Where an account may come from, as a phrase for error messages."""
    carriers = []
    if settings.identity_header:
        carriers.append(f"the {settings.identity_header} header the gateway's authentication sets")
    if settings.identity_bearer:
        carriers.append("a bearer token (Authorization: Bearer ...)")
    return " or ".join(carriers) or "no source (isolation by account is off)"


@dataclass(frozen=True, slots=True)
class Account:
    """An authenticated caller, as the keyed digest of where it came from and its value."""

    digest: bytes

    def __post_init__(self) -> None:
        if len(self.digest) != ACCOUNT_DIGEST_BYTES:
            raise ValueError(f"an account digest has {ACCOUNT_DIGEST_BYTES} bytes")

    @property
    def text(self) -> str:
        """The digest in URL-safe base64 without padding (what the attestation carries)."""
        return base64.urlsafe_b64encode(self.digest).rstrip(b"=").decode("ascii")

    @classmethod
    def from_text(cls, text: str) -> Account | None:
        """The account `text` names, or None when it is not one."""
        if len(text) != 43 or not re.fullmatch(r"[A-Za-z0-9_-]+", text):
            return None
        return cls(base64.urlsafe_b64decode(text + "="))


def account_digest(secret: bytes, source: str, value: str) -> bytes:
    """The account `value` names from `source` ("header" or "bearer"): one function for
    every caller, so equal inputs give equal accounts and the two sources never collide."""
    message = _DOMAIN + source.encode("ascii") + b"\0" + value.encode("utf-8")
    return hmac.digest(secret, message, "sha256")


def _one_value(headers: MultiMapping[str], name: str, param: str) -> str | None:
    """The header's value with surrounding whitespace removed; None when absent or empty;
    several different values are refused."""
    values = {v.strip(_OWS) for v in headers.getall(name, ())}
    if len(values) > 1:
        raise FrontError(
            400,
            errors.INVALID_IDENTITY,
            f"the request carries {len(values)} different {name} headers; the account must "
            "come from exactly one (check that the gateway's authentication replaces a "
            "client's copy instead of adding to it)",
            param=param,
        )
    value = values.pop() if values else ""
    return value or None


def _checked(value: str, name: str) -> str:
    if len(value) > MAX_IDENTITY_CHARS:
        raise FrontError(
            400,
            errors.INVALID_IDENTITY,
            f"the {name} value has {len(value)} characters; at most {MAX_IDENTITY_CHARS} "
            "are allowed",
            param=name,
        )
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise FrontError(
            400,
            errors.INVALID_IDENTITY,
            f"the {name} value holds control characters; an account name cannot",
            param=name,
        )
    return value


def header_identity(headers: MultiMapping[str], name: str) -> str | None:
    """The account name the gateway's authentication wrote into header `name`, or None."""
    value = _one_value(headers, name, name)
    return None if value is None else _checked(value, name)


def bearer_identity(headers: MultiMapping[str]) -> str | None:
    """The request's bearer token, or None when it has none (or another scheme)."""
    value = _one_value(headers, AUTHORIZATION_HEADER, "Authorization")
    if value is None:
        return None
    scheme, *rest = re.split(r"[ \t]+", value, maxsplit=1)
    if scheme.lower() != "bearer":
        return None
    token = rest[0].strip(_OWS) if rest else ""
    if not _BEARER_TOKEN.fullmatch(token):
        raise FrontError(
            400,
            errors.INVALID_IDENTITY,
            "the bearer token is empty or holds characters a token cannot (whitespace, "
            "quotes, ...); send Authorization: Bearer <token> with the token as issued",
            param="Authorization",
        )
    return _checked(token, "Authorization")


def _identity_source(
    headers: MultiMapping[str], settings: IdentityReader
) -> tuple[str, str] | None:
    """(source, value) of the account the deployment's sources name (the identity header
    first, then the bearer token), or None; malformed sources raise `FrontError`."""
    if settings.identity_header:
        value = header_identity(headers, settings.identity_header)
        if value is not None:
            return _HEADER_SOURCE, value
    if settings.identity_bearer:
        token = bearer_identity(headers)
        if token is not None:
            return _BEARER_SOURCE, token
    return None


def account_at_gateway(
    headers: MultiMapping[str], settings: IdentityReader, secret: bytes | None
) -> Account | None:
    """The caller's account from the sources the deployment names (the identity header
    first, then the bearer token), or None; malformed sources raise `FrontError`.

    Only the gateway's policy step may call this: it runs behind the gateway's
    authentication, so the header is the one the authentication wrote."""
    if not identity_enabled(settings):
        return None
    if secret is None:  # settings guarantee a secret whenever identity is on
        raise RuntimeError("isolation by account is running without the salt key")
    source = _identity_source(headers, settings)
    return None if source is None else Account(account_digest(secret, *source))


def check_identity_sources(headers: MultiMapping[str], settings: IdentityReader) -> None:
    """Raise the `FrontError` `account_at_gateway` raises for these headers, reading no
    account: the cache front's half of the step's identity refusals. Behind the step it
    never fires (the step refused those already); behind promptcache's picker, which routes
    such a request with a one-off salt, it gives the client the step's very answer."""
    if identity_enabled(settings):
        _identity_source(headers, settings)

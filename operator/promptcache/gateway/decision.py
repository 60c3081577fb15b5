"""What the policy step decides on one complete request (`decide`, pure): the salt the front
would derive in the canonical body the picker hashes, the session, the attestation, or
the front's refusal; and the client identity a held request counts against.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from multidict import CIMultiDict, MultiMapping

from promptcache.contract import (
    CACHE_SALT_FIELD,
)
from promptcache.contract.session import session_of
from promptcache.tenancy import errors as front_errors
from promptcache.tenancy.attestation import Attester
from promptcache.tenancy.canonical import (
    POLICY_FIELDS,
    check_headers,
    check_json_media_type,
    encode_body,
    json_charge,
    parse_body,
)
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.identity import account_at_gateway
from promptcache.tenancy.policy import apply_policy
from promptcache.tenancy.routes import Route, RouteClass, canonical_target, check_route
from promptcache.tenancy.settings import PolicyReader
from promptcache.tenancy.shares import identity_key


def session_from_body(raw: bytes, field: str = "user") -> str | None:
    """The body's session (`prompt_cache_key`, else `field`), or None."""
    try:
        body = parse_body(raw, acted_on=())
    except FrontError:
        return None
    return session_of(body, field)


@dataclass(frozen=True, slots=True)
class Decision:
    """What the step does with one complete request."""

    body: bytes | None = None
    """The canonical body to forward instead of the client's (every salted JSON request)."""
    session: str | None = None
    """The session header value to add, when the body names one."""
    refusal: FrontError | None = None
    """The front's answer, sent to the client instead of asking the picker."""
    attestation: str | None = None
    """The signed account for the cache front (`tenancy.attestation`), when there is one."""
    salted: bool = False
    """A salted route: the gateway must not pass a client's attestation header on."""


def _policy_copy(body: dict[str, Any]) -> dict[str, Any]:
    """A copy `apply_policy` may rewrite without touching `body`: it changes top-level
    members and `stream_options`' members only (no deep copy of a large body)."""
    work = dict(body)
    options = work.get("stream_options")
    if isinstance(options, dict):
        work["stream_options"] = dict(options)
    return work


def check_head(method: str, target: str, headers: CIMultiDict[str]) -> Route | None:
    """Pure: what of the front's checks the request head alone decides, in the front's
    order (`front.app._proxy`): the route (None: the front's own paths, nothing to decide),
    the headers, and a salted route's media type. Raises the front's refusal.

    `decide` runs it first; the step also runs it when it starts holding a body, so a
    request refused for its head is refused before its body is held or metered, as the
    front refuses it before reading the body."""
    route = check_route(method, canonical_target(target).path)
    if route.kind is RouteClass.FRONT:
        return None
    check_headers(headers)
    if route.kind is RouteClass.SALTED:
        check_json_media_type(headers)
    return route


def decide(
    method: str,
    target: str,
    headers: Mapping[str, str] | MultiMapping[str],
    raw: bytes | bytearray,
    *,
    policy: PolicyReader,
    secret: bytes | None,
    session_header: str,
    user_field: str,
    attester: Attester | None = None,
) -> Decision:
    """Pure: the salt the front would derive, in the canonical body the picker hashes.

    Classifies the request target, checks the headers and parses the body with the
    functions the front uses too (`tenancy.canonical`), and runs the same `apply_policy` on
    a copy, so every decision (salt, refusal, error body) is the one the front makes. What
    is forwarded on a salted route is always the canonical encoding of the client's body minus any
    `cache_salt` it sent, plus the derived one: one spelling of every field, UTF-8, which
    Go's `encoding/json` (the picker) reads as this step did. `headers`: every entry, as
    aiohttp would present them (`tenancy.canonical.header_multidict`)."""
    lowered = headers if isinstance(headers, CIMultiDict) else CIMultiDict(headers)
    try:
        route = check_head(method, target, lowered)
        if route is None:
            return Decision()  # the front answers its own paths; nothing to salt
        if route.kind is not RouteClass.SALTED:
            if raw:
                raise FrontError(
                    400, front_errors.BODY_NOT_ALLOWED, f"{route.path} takes no request body"
                )
            return Decision()
        body = parse_body(raw, acted_on=(*POLICY_FIELDS, policy.isolation_field, user_field))
        account = account_at_gateway(lowered, policy, secret)  # behind the gateway's auth
        plan = apply_policy(route, lowered, _policy_copy(body), policy, secret, account=account)
        body.pop(CACHE_SALT_FIELD, None)
        if plan.salt is not None:
            body[CACHE_SALT_FIELD] = plan.salt
        session = None
        if session_header and not (lowered.get(session_header) or "").strip():
            session = session_of(body, user_field)
        attestation = None
        if account is not None and attester is not None:
            attestation = attester.sign(account, lowered, body)
        # the C encoder: on the loop only cheap bodies are decided (`JsonScan.work`), and a
        # worker process holds no GIL anyone else waits for
        return Decision(
            body=encode_body(body), session=session, attestation=attestation, salted=True
        )
    except FrontError as error:
        return Decision(refusal=error)


def decide_cost(raw: bytes | bytearray) -> int:
    """Working memory deciding on `raw` takes beyond the raw bytes: the parse (the front's
    own estimate, `front.state.json_charge`) and the canonical re-encoding."""
    return json_charge(raw) + len(raw)


FORWARDED_FOR: Final[str] = "x-forwarded-for"
"""Where the gateway names the connection a request came from: its last entry is the one the
gateway itself appended (earlier ones are what the client claimed)."""


def step_identity(headers: Sequence[tuple[str, bytes]], policy: PolicyReader) -> bytes:
    """The client identity a held request counts against (`tenancy.shares.identity_key`):
    the account header the gateway's authentication sets (the step runs behind it), else the
    isolation header, else the Authorization header (a bearer account is its token), else
    the connection's source as the gateway appended it to X-Forwarded-For. The first value
    of a repeated header, as the front reads it."""
    first: dict[str, bytes] = {}
    for name, value in headers:
        first.setdefault(name, value)
    identity, isolation = policy.identity_header, policy.isolation_header
    forwarded = [v.strip() for v in headers_named(headers, FORWARDED_FOR)]
    source = forwarded[-1].rsplit(b",", 1)[-1].strip() if forwarded else b""
    return identity_key(
        account=first.get(identity.lower(), b"") if identity else None,
        isolation_key=first.get(isolation.lower(), b"") if isolation else b"",
        credential=first.get("authorization", b""),
        source=source,
    )


def headers_named(headers: Sequence[tuple[str, bytes]], name: str) -> list[bytes]:
    return [value for key, value in headers if key == name]

"""A large or dense request decided in a worker process, so the front's event loop never
shares its GIL with the work.

Parsing a body dense in JSON values, walking it for prompt embeds, deciding its policy and
encoding it are linear in its values, and a tenant chooses how many there are. In a thread
of the front's own process that work holds the GIL the event loop needs: measured under
`bench/hostile_load.py`, two decode threads held it about 60 % of the time, and whenever the
machine descheduled the holder, `/healthz` waited with it (p99 0.8 s). In a worker process it
costs only CPU, and the C parser and encoder (several times cheaper than the interruptible
pure-Python ones a thread needs) can be used.

Prompt embeds need the process's cache and torch: the worker encodes the body with a marker
in place of each payload or reference and hands back the values; the front resolves and
verifies them and splices them in. What comes back is bytes, the plan and those values: no
parsed structure crosses back.

This module imports neither aiohttp nor torch: a spawned worker stays small.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from multidict import CIMultiDict

from promptcache.front.references import find_slots, serialize
from promptcache.front.settings import FrontSettings
from promptcache.tenancy.attestation import Attester, Verdict
from promptcache.tenancy.canonical import POLICY_FIELDS, parse_body, refusing_unencodable
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.policy import Plan, apply_policy
from promptcache.tenancy.routes import Route


@dataclass(frozen=True, slots=True)
class Prepared:
    """What the worker decided about one request body."""

    data: bytes = b""
    """The body vLLM receives (compact canonical JSON, the policy applied), with every
    prompt-embeds slot's value replaced by `marker` and its index (`references.splice`)."""
    plan: Plan | None = None
    slots: tuple[tuple[str, str | None, str], ...] = ()
    """Each prompt-embeds slot's (value, named identifier, parameter path), in order: the
    front resolves and verifies them itself (its cache, torch) and splices them in."""
    marker: str = ""
    parse_refusal: FrontError | None = None
    """The body cannot be read (the front's 400s); no policy was applied."""
    policy_refusal: FrontError | None = None
    """The policy refuses the request."""
    late_refusal: FrontError | None = None
    """Malformed prompt-embeds fields or a string JSON cannot encode: refused after the
    policy's own checks, as `_salted` refuses them."""
    verdict: Verdict | None = None
    """The identity attestation as checked here (`attest`), its replay guard still to
    pass in the serving process; the policy was applied with its account."""


def prepare(
    raw: bytes | bytearray,
    route: Route,
    headers: list[tuple[str, str]],
    settings: FrontSettings,
    secret: bytes | None,
    *,
    attest: bool = False,
) -> Prepared:
    """Parse, find prompt-embeds slots, apply the policy and encode: `_salted`'s steps, in
    its order, all but resolving the slots. `headers`: the request's, as aiohttp read
    them. `attest`: check the identity attestation (identity on) and apply the policy
    with its account; the caller admits the verdict or, replayed, asks again without."""
    try:
        body = parse_body(raw, acted_on=(*POLICY_FIELDS, settings.isolation_field))
    except FrontError as refusal:
        return Prepared(parse_refusal=refusal)
    late_refusal = None
    slots = []
    try:
        slots = find_slots(route.embeds, body)
    except FrontError as refusal:
        late_refusal = refusal
    request_headers = CIMultiDict(headers)
    verdict = None
    if attest and secret:
        verdict = Attester(secret, settings.isolation_header).check(request_headers, body)
    account = verdict.account if verdict is not None else None
    try:
        plan = apply_policy(route, request_headers, body, settings, secret, account=account)
    except FrontError as refusal:
        return Prepared(policy_refusal=refusal, verdict=verdict)
    if late_refusal is not None:
        return Prepared(plan=plan, late_refusal=late_refusal, verdict=verdict)
    marker = f"promptcache-slot-{secrets.token_hex(8)}-"
    for i, slot in enumerate(slots):
        slot.container[slot.key] = f"{marker}{i}"
    try:
        with refusing_unencodable():
            data = serialize(body, [])
    except FrontError as refusal:
        return Prepared(plan=plan, late_refusal=refusal, verdict=verdict)
    found = tuple((slot.value, slot.named_id, slot.param) for slot in slots)
    return Prepared(data=data, plan=plan, slots=found, marker=marker, verdict=verdict)

"""The JSON pipeline of a salted route: parse, decide the policy, resolve prompt embeds and
forward, on the loop for a cheap body or in a worker process for a large or dense one
(`offload`). `salted` is its entry.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import Any, Final

from aiohttp import web
from multidict import CIMultiDictProxy

from promptcache.contract import PREDICTED_MATCH_HEADER
from promptcache.front import heap
from promptcache.front.forwarding import admitted, count_controls
from promptcache.front.hits import Tally, scope_class
from promptcache.front.offload import Prepared, prepare
from promptcache.front.references import (
    Outcome,
    Slot,
    VerifiedLike,
    find_slots,
    forward_size,
    resolve,
    serialize,
    splice,
)
from promptcache.front.state import Charge, FrontState
from promptcache.front.upstream import (
    forward_headers,
    new_request_id,
)
from promptcache.tenancy import errors
from promptcache.tenancy.attestation import Outcome as AttestationOutcome
from promptcache.tenancy.canonical import (
    OFFLOAD_BYTES,
    POLICY_FIELDS,
    JsonScan,
    parse_body,
    refusing_unencodable,
)
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.identity import Account
from promptcache.tenancy.policy import Isolation, Plan, apply_policy
from promptcache.tenancy.routes import (
    Route,
    Target,
)

FORWARD_EXPANSION: Final = 4
"""Resolving references and densifying TurboQuant may grow a body up to this factor."""
UPLOAD_FACTOR: Final = 2
"""Verifying an uploaded payload holds its decoded bytes and the loaded tensor."""


async def _off_loop(state: FrontState, off_loop: bool, job: Callable[[], Any]) -> Any:
    """Run `job` on a decode thread when `off_loop` (joining a large forwarded body)."""
    if not off_loop:
        return job()
    return await state.submit(state.executor, job)


def _parse_and_find(
    raw: bytearray, fields: tuple[str, ...], shape: str | None
) -> tuple[dict[str, Any], list[Slot] | FrontError]:
    """A cheap body parsed and walked for prompt-embeds slots, on the loop (a large or
    dense one goes to a worker whole, `offload.prepare`). A refusal finding the slots is
    returned, to be raised after the policy's own checks, which come first."""
    body = parse_body(raw, acted_on=fields)
    try:
        return body, find_slots(shape, body)
    except FrontError as refusal:
        return body, refusal


_VERIFY_MODULE: Final = "promptcache.front.verify"


async def _verify(state: FrontState, charge: Charge, payload: str) -> VerifiedLike:
    # torch loads only once a request carries prompt embeds; what it made lives as long as
    # the process: out of the collector's full passes (`front.heap`)
    first = _VERIFY_MODULE not in sys.modules
    from promptcache.front.verify import verify_payload  # noqa: PLC0415

    if first:
        heap.freeze()

    transient = UPLOAD_FACTOR * len(payload)  # decoded bytes and the loaded tensor
    charge.take(transient)
    job = partial(
        verify_payload,
        payload,
        max_bytes=state.settings.max_body_bytes,
        dense_dtype=state.settings.turboquant_dtype,
        reserve=charge.take,
    )
    try:
        return await state.submit(state.executor, job)
    finally:
        charge.give_back(transient)


def _account(
    state: FrontState, headers: CIMultiDictProxy[str], body: dict[str, Any]
) -> Account | None:
    """The account the gateway's policy step vouched for on this request, or None (off,
    or no valid attestation: a pod reached directly gets no one's scope). Checked on the
    body as received, before the policy rewrites it; on the loop, as the body is cheap
    (a large or dense one is checked by its worker, `offload.prepare`)."""
    if state.attester is None:
        return None
    verdict = state.attester.verify(headers, body)
    state.metrics.attestations.labels(outcome=verdict.outcome.value).inc()
    return verdict.account


def _count_policy(state: FrontState, isolation: Isolation) -> None:
    state.metrics.decided(state.settings.isolation_mode.value, isolation.value)


async def _encode(
    state: FrontState, body: dict[str, Any], placed: list[Any], *, size: int
) -> bytes:
    """The body vLLM receives: its resolved payloads are spliced in, not encoded, so only
    a large result (references to large payloads) is joined off the loop."""
    with refusing_unencodable():
        job = partial(serialize, body, placed)
        data = await _off_loop(state, size >= OFFLOAD_BYTES, job)
    return data  # type: ignore[no-any-return]


async def salted(
    request: web.BaseRequest,
    state: FrontState,
    route: Route,
    target: Target,
    *,
    raw: bytearray,
    scan: JsonScan,
    charge: Charge,
) -> web.StreamResponse:
    """A JSON request on a salted route: decided here when its body is cheap to work on,
    else in a worker process (`offload`), so no large structure is ever built in the
    process whose event loop answers everyone (`canonical.JsonScan.work`)."""
    if scan.work().off_loop:
        prepared = await _prepare_in_worker(
            state, raw, route, scan=scan, headers=request.headers, charge=charge
        )
        size = len(raw)
        raw.clear()  # decided: the raw bytes are no longer needed
        charge.give_back(size)
        return await _salted_prepared(
            request, state, route, target, prepared=prepared, charge=charge
        )
    return await _salted_here(request, state, route, target, raw=raw, scan=scan, charge=charge)


async def _prepare_in_worker(
    state: FrontState,
    raw: bytearray,
    route: Route,
    *,
    scan: JsonScan,
    headers: CIMultiDictProxy[str],
    charge: Charge,
) -> Prepared:
    """`offload.prepare` on the JSON worker processes, charged for the worker's copy of
    the body, its parse and its encoding while it runs."""
    cost = scan.charge + 2 * len(raw)
    charge.take(cost)
    attest = state.attester is not None
    job = partial(
        prepare, raw, route, list(headers.items()), state.settings, state.secret, attest=attest
    )  # fmt: skip
    try:
        prepared = await state.submit(state.json_pool(), job)
        if prepared.verdict is None or state.attester is None:
            return prepared
        verdict = state.attester.admit(prepared.verdict)  # this process holds the guard
        state.metrics.attestations.labels(outcome=verdict.outcome.value).inc()
        if verdict.outcome is not AttestationOutcome.REPLAYED:
            return prepared
        # decided with an account this request may not claim: decided again without one
        again = partial(
            prepare, raw, route, list(headers.items()), state.settings, state.secret
        )  # fmt: skip
        return await state.submit(state.json_pool(), again)
    except BrokenProcessPool:
        state.drop_json_pool()  # a worker died (killed, out of memory): a new pool next time
        raise
    finally:
        charge.give_back(cost)


async def _salted_prepared(
    request: web.BaseRequest,
    state: FrontState,
    route: Route,
    target: Target,
    *,
    prepared: Prepared,
    charge: Charge,
) -> web.StreamResponse:
    """Forward what a worker decided, its prompt embeds resolved here; counted and refused
    as `_salted_here` counts and refuses."""
    if prepared.parse_refusal is not None:
        raise prepared.parse_refusal
    if prepared.policy_refusal is not None:
        _count_policy(state, Isolation.REJECTED)
        raise prepared.policy_refusal
    plan = prepared.plan
    assert plan is not None
    _count_plan(state, plan)
    holders = [{"value": value} for value, _, _ in prepared.slots]
    slots: list[Slot] | FrontError = prepared.late_refusal or [
        Slot(holder, "value", value, named, param)
        for holder, (value, named, param) in zip(holders, prepared.slots, strict=True)
    ]
    outcome = await _resolve(state, route, plan, slots, charge)
    expected = _expected_size(state, len(prepared.data), outcome)
    charge.take(2 * expected)  # the spliced pieces, then the joined body
    values = [holder["value"] for holder in holders]
    job = partial(splice, prepared.data, prepared.marker, values)
    data = await _off_loop(state, expected >= OFFLOAD_BYTES, job)
    return await _forward_json(request, state, route, target, plan=plan, data=data, charge=charge)


async def _resolve(
    state: FrontState,
    route: Route,
    plan: Plan,
    slots: list[Slot] | FrontError,
    charge: Charge,
) -> Outcome:
    """Resolve references and verify uploads in the slots (`references.resolve`), counted."""
    settings = state.settings
    use_cache = plan.use_embeds_cache and state.cache.enabled
    scope = plan.salt if plan.isolation in (Isolation.KEYED, Isolation.ACCOUNT) else None
    try:
        if isinstance(slots, FrontError):
            raise slots
        outcome = await resolve(
            slots,
            cache=state.cache if use_cache else None,
            scope=scope,
            verifier=partial(_verify, state, charge),
            kinds=state.kinds,
            max_slots=settings.max_prompt_embeds_references,
        )
    except FrontError as exc:
        missing = exc.extra.get("missing_prompt_embeds_ids")
        if isinstance(missing, list):
            state.metrics.id_lookups.labels(endpoint=route.label, result="miss").inc(len(missing))
        if exc.code in (errors.INVALID_PROMPT_EMBEDS, errors.PROMPT_EMBEDS_ID_MISMATCH):
            state.metrics.uploads.labels(result="rejected").inc()
        raise
    if outcome.hits:
        state.metrics.id_lookups.labels(endpoint=route.label, result="hit").inc(outcome.hits)
        state.metrics.bytes_saved.inc(max(outcome.bytes_saved, 0))
    if outcome.uploads_verified:
        state.metrics.uploads.labels(result="verified").inc(outcome.uploads_verified)
    return outcome


def _expected_size(state: FrontState, size: int, outcome: Outcome) -> int:
    """The forwarded body's size with every payload at its full size, refused (413) past
    `FORWARD_EXPANSION` times the body limit before anything is built."""
    limit = state.settings.max_body_bytes * FORWARD_EXPANSION
    expected = size + forward_size(outcome.placed)
    if expected > limit:
        raise FrontError(
            413,
            errors.REQUEST_TOO_LARGE,
            f"with its prompt embeddings resolved (every reference at its full size) the "
            f"request would have about {expected} bytes; this server forwards at most {limit}",
        )
    return expected


def _count_plan(state: FrontState, plan: Plan) -> None:
    _count_policy(state, plan.isolation)
    if plan.client_salt_removed:
        state.metrics.client_salt_removed.inc()
    if plan.max_len_not_enforced:
        state.metrics.max_len_not_enforced.inc()


async def _forward_json(
    request: web.BaseRequest,
    state: FrontState,
    route: Route,
    target: Target,
    *,
    plan: Plan,
    data: bytes,
    charge: Charge,
) -> web.StreamResponse:
    """Forward the decided body with the headers vLLM gets, under the concurrency cap."""
    settings = state.settings
    headers = forward_headers(
        request.headers, settings, json_body=True, request_id=new_request_id()
    )
    count_controls(state, request.headers)
    if plan.client_request_id_removed:
        state.metrics.control_removed("request_id")
    if plan.session_header_value is not None:
        headers[settings.session_header] = plan.session_header_value
    strip = plan.strip_usage_chunk
    tally = _tally(state, request.headers, plan)
    return await admitted(
        request, state, route, target, data=data, headers=headers, strip_usage=strip,
        charge=charge, tally=tally,
    )  # fmt: skip


def _tally(state: FrontState, headers: CIMultiDictProxy[str], plan: Plan) -> Tally | None:
    """The request's scope class and the picker's prediction, verified (`front.hits`): only
    a header signed with the salt key counts; whatever else arrives is counted by its
    verdict and dropped (`forward_headers` never passes it to vLLM). Above a modest rate
    only a weighted random sample is checked and counted (`front.sampling`)."""
    values = headers.getall(PREDICTED_MATCH_HEADER, ())
    prediction, weight = None, 1.0
    if state.predictions is not None:
        if values:  # a sample above `sampling.CHECKS_PER_SECOND`: the rest stay unchecked
            weight = state.sampler.weight()
        if weight:
            verdict = state.predictions.read(values)
            state.metrics.predicted(verdict.outcome.value, weight)
            prediction = verdict.prediction
    elif any(v.strip(" \t") for v in values):
        state.metrics.predicted("unverifiable")
    scope = scope_class(plan.isolation)
    return None if scope is None else Tally(scope, prediction, weight)


async def _salted_here(
    request: web.BaseRequest,
    state: FrontState,
    route: Route,
    target: Target,
    *,
    raw: bytearray,
    scan: JsonScan,
    charge: Charge,
) -> web.StreamResponse:
    """A cheap body (`JsonScan.work`): parsed, decided and encoded on the loop."""
    settings = state.settings
    charge.take(scan.charge)
    fields = (*POLICY_FIELDS, settings.isolation_field)
    body, slots = _parse_and_find(raw, fields, route.embeds)
    size = len(raw)
    raw.clear()  # parsed: the raw bytes are no longer needed
    charge.give_back(size)
    account = _account(state, request.headers, body)
    try:
        plan = apply_policy(route, request.headers, body, settings, state.secret, account=account)
    except FrontError:
        _count_policy(state, Isolation.REJECTED)
        raise
    _count_plan(state, plan)
    outcome = await _resolve(state, route, plan, slots, charge)
    expected = _expected_size(state, size, outcome)
    charge.take(2 * expected)  # the encoded pieces, then the joined body
    data = await _encode(state, body, outcome.placed, size=expected)
    return await _forward_json(request, state, route, target, plan=plan, data=data, charge=charge)

"""The cache front as an aiohttp application: a thin shell around policy and references.

Every request to the serving port lands in `handle`: its raw target is
canonicalised once (`routes.canonical_target`) and classified
(`routes.check_route`); the front's own paths (`/metrics`, `/healthz`,
`/readyz`) are answered here, salted routes are rewritten by the per-request
rules, read-only routes pass, everything else is refused with a JSON error.
What is forwarded to vLLM on localhost is exactly the target that was checked;
vLLM's answer (status and body) is passed back, streamed when vLLM streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import Any, Final, cast

from aiohttp import web
from aiohttp.http_exceptions import (
    BadStatusLine,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
)
from aiohttp.web_protocol import RequestPayloadError
from multidict import CIMultiDict, CIMultiDictProxy

from promptcache.contract import FRONT_HEALTH_PATH, FRONT_READY_PATH, PREDICTED_MATCH_HEADER
from promptcache.contract.front import VLLM_PRIORITY_HEADER, VLLM_REQUEST_ID_HEADER
from promptcache.embeds.cache import PromptEmbedsCache
from promptcache.front import heap
from promptcache.front.hits import Tally, scope_class
from promptcache.front.metrics import CONTENT_TYPE, FrontMetrics, merge_expositions
from promptcache.front.offload import Prepared, prepare
from promptcache.front.pool import UpstreamError, UpstreamPool
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
from promptcache.front.settings import FrontSettings
from promptcache.front.state import Charge, FrontState
from promptcache.front.upstream import (
    bound_send_buffer,
    forward,
    forward_headers,
    new_request_id,
)
from promptcache.tenancy import errors
from promptcache.tenancy.attestation import Attester, ReplayGuard, claimed_account
from promptcache.tenancy.attestation import Outcome as AttestationOutcome
from promptcache.tenancy.canonical import (
    OFFLOAD_BYTES,
    POLICY_FIELDS,
    JsonScan,
    check_headers,
    check_json_media_type,
    parse_body,
    refusing_unencodable,
)
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.fair_share import FairShare, share_exceeded
from promptcache.tenancy.identity import Account, identity_enabled
from promptcache.tenancy.policy import Isolation, Plan, apply_policy
from promptcache.tenancy.prediction import PredictionReader
from promptcache.tenancy.routes import (
    METRICS_PATH,
    Route,
    RouteClass,
    Target,
    canonical_target,
    check_route,
)
from promptcache.tenancy.shares import Verdict, identity_key, share_refusal

log = logging.getLogger("promptcache.front")

FORWARD_EXPANSION: Final = 4
"""Resolving references and densifying TurboQuant may grow a body up to this factor."""
PROBE_SECONDS: Final = 5.0
"""How long /metrics and /readyz wait for vLLM's own /metrics and /health."""
MAX_UPSTREAM_METRICS_BYTES: Final = 64 * 1024 * 1024
CONNECT_TIMEOUT_SECONDS: Final = 10.0
JSON_POOL_STOP_SECONDS: Final = 10.0
"""How long stopping waits for the JSON workers to finish their jobs and exit."""
LINGER_SECONDS: Final = 2.0
"""aiohttp drains an unread request body this long before closing (its default: 10 s)."""
SMALL_BODY_BYTES: Final = 1 << 20
"""Bodies up to this size with a Content-Length are read in one call."""
UPLOAD_FACTOR: Final = 2
"""Verifying an uploaded payload holds its decoded bytes and the loaded tensor."""


def _json_error(exc: FrontError) -> web.Response:
    headers = dict(exc.headers)
    if exc.status == 503:
        headers.setdefault("Retry-After", "1")
    return web.Response(
        status=exc.status,
        body=exc.body_bytes(),
        content_type="application/json",
        headers=headers or None,
    )


def _has_body(request: web.BaseRequest) -> bool:
    return bool(request.content_length) or request.headers.get("Transfer-Encoding") is not None


async def _read_body(
    request: web.BaseRequest, state: FrontState, charge: Charge, scan: JsonScan
) -> bytearray:
    """The whole body, under the size limit, the body-read cap, the timeout and the budget,
    counted into `scan` piece by piece as it arrives.

    Returned as the buffer it was read into (no second copy of a large body).
    """
    settings = state.settings
    limit = settings.max_body_bytes
    declared = request.content_length
    if declared is not None and declared > limit:
        raise _too_large(declared, limit)
    reads = state.reads
    verdict = reads.take(charge.key, 1)
    if verdict is Verdict.OVER_SHARE:
        state.metrics.share_refused("body_reads")
        raise share_refusal("request bodies being received", reads.held(charge.key), reads.share)
    if verdict is not Verdict.TAKE:
        raise FrontError(
            503,
            errors.BODY_READS_SATURATED,
            f"the cache front is already receiving {settings.max_body_reads} request bodies; "
            "retry shortly",
        )
    try:
        if declared is not None:
            charge.take(declared)
        buffer = bytearray()
        await _continue(request)
        if declared is not None and declared <= SMALL_BODY_BYTES:
            # the common case: the whole body came with the head, no timer needed
            buffer += request.content.read_nowait(declared)
            if len(buffer) < declared:
                async with asyncio.timeout(settings.body_timeout_seconds):
                    buffer += await request.content.readexactly(declared - len(buffer))
            scan.add(buffer)  # at most SMALL_BODY_BYTES: a few milliseconds
        else:
            async with asyncio.timeout(settings.body_timeout_seconds):
                async for chunk in request.content.iter_chunked(1 << 16):
                    if declared is None:
                        charge.take(len(chunk))
                    buffer += chunk
                    scan.add(chunk)
                    if len(buffer) > limit:
                        raise _too_large(len(buffer), limit)
    except asyncio.IncompleteReadError:
        raise FrontError(
            400, errors.INVALID_JSON, "the request body ended before its Content-Length"
        ) from None
    except (HttpProcessingError, RequestPayloadError) as exc:
        # the parser found the body's framing broken after the handler started reading
        cause = exc.__cause__ if isinstance(exc, RequestPayloadError) else exc
        refusal = parse_refusal(400, cause if isinstance(cause, HttpProcessingError) else exc)
        if refusal.status >= 500:
            refusal = FrontError(
                400, errors.MALFORMED_REQUEST, "the request body's framing is not valid HTTP/1.1"
            )
        raise refusal from None
    except TimeoutError:
        state.metrics.deadline_fired("body")
        raise FrontError(
            408,
            errors.BODY_TIMEOUT,
            f"the request body did not arrive within {settings.body_timeout_seconds:g} seconds",
        ) from None
    finally:
        reads.give(charge.key, 1)
    return buffer


async def _continue(request: web.BaseRequest) -> None:
    """Answer `Expect: 100-continue` once the front has decided to read the body.

    (aiohttp's router does this for applications; the front's low-level server
    does it here, after every check that can refuse the request unread.)
    """
    expect = request.headers.get("Expect")
    if expect is None or request.version < (1, 1):
        return
    if expect.lower() != "100-continue":
        raise FrontError(
            417,
            errors.EXPECTATION_FAILED,
            f"Expect: {expect[:40]!r} is not supported; only 100-continue is",
            param="Expect",
        )
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")


def _too_large(size: int, limit: int) -> FrontError:
    return FrontError(
        413,
        errors.REQUEST_TOO_LARGE,
        f"the request body has at least {size} bytes; this server accepts at most {limit}. "
        "Send prompt embeddings the server has seen by identifier instead of inline",
    )


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


def _count_controls(state: FrontState, headers: CIMultiDictProxy[str]) -> None:
    """Count the vLLM controls the client sent that the front did not forward."""
    if VLLM_REQUEST_ID_HEADER in headers:
        state.metrics.control_removed(VLLM_REQUEST_ID_HEADER)
    if not state.settings.allow_client_priority and VLLM_PRIORITY_HEADER in headers:
        state.metrics.control_removed(VLLM_PRIORITY_HEADER)


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


async def handle(state: FrontState, request: web.BaseRequest) -> web.StreamResponse:
    """Every request: canonical target, classified route, then the front or the proxy."""
    label = "unknown"
    try:
        target = canonical_target(request.raw_path)
        route = check_route(request.method, target.path)
        label = route.label
        if route.kind is RouteClass.FRONT:
            return await _FRONT_HANDLERS[route.path](request, state)
        response = await _proxy(request, state, route, target)
    except FrontError as exc:
        state.metrics.refuse(exc.code)
        response = _json_error(exc)
        if not request.content.at_eof():
            # an unread body (too large, too slow, refused unread): no keep-alive
            response.force_close()
    state.metrics.answered(label, response.status)
    if state.draining:
        response.force_close()  # the client reconnects, to a pod that is not stopping
    return response


async def _proxy(
    request: web.BaseRequest, state: FrontState, route: Route, target: Target
) -> web.StreamResponse:
    settings = state.settings
    check_headers(request.headers)
    charge = Charge(state, _identity(state, request))
    try:
        if route.kind is RouteClass.READ_ONLY:
            if _has_body(request):
                raise FrontError(
                    400, errors.BODY_NOT_ALLOWED, f"{route.path} takes no request body"
                )
            headers = forward_headers(
                request.headers, settings, json_body=False, request_id=new_request_id()
            )
            _count_controls(state, request.headers)
            return await _admitted(
                request, state, route, target, data=b"", headers=headers, strip_usage=False,
                charge=charge,
            )  # fmt: skip
        check_json_media_type(request.headers)
        metered = state.fair_share.enabled
        if metered:
            state.fair_share.seen(charge.key)
            await _fair_share(state, charge.key)
        scan = JsonScan()
        raw = await _read_body(request, state, charge, scan)
        if metered:
            state.fair_share.charge(charge.key, scan.charge)
        return await _salted(request, state, route, target, raw=raw, scan=scan, charge=charge)
    finally:
        charge.release()


def _identity(state: FrontState, request: web.BaseRequest) -> bytes:
    """The client identity a request's holdings and its fair share of work count against
    (`tenancy.shares.identity_key`), read from its head: the account the policy step's
    attestation names (checked only once the body has arrived, which it binds), else the
    isolation header, else the Authorization header, else the connection's source address."""
    headers = request.headers
    isolation = state.settings.isolation_header
    return identity_key(
        account=claimed_account(headers) if state.attester is not None else None,
        isolation_key=headers.get(isolation, "") if isolation else "",
        credential=headers.get("Authorization", ""),
        source=request.remote or "",
    )


async def _fair_share(state: FrontState, key: bytes) -> None:
    """Hold a request back, before its body is read, while its key owes the pod work
    (`tenancy.fair_share`); 429 (`fair_share_exceeded`) when too many of its requests wait."""
    refusal = await state.fair_share.admit(key)
    if refusal is not None:
        raise share_exceeded(refusal)


async def _admitted(
    request: web.BaseRequest,
    state: FrontState,
    route: Route,
    target: Target,
    *,
    data: bytes,
    headers: CIMultiDict[str],
    strip_usage: bool,
    charge: Charge,
    tally: Tally | None = None,
) -> web.StreamResponse:
    """Forward under the concurrency cap (bodies are read before a slot is taken); the
    answer is sent inside the slot, under the write deadline."""
    slots, key = state.slots, charge.key
    verdict = slots.take(key, 1)
    if verdict is Verdict.OVER_SHARE:
        state.metrics.share_refused("slots")
        raise share_refusal("concurrency slots", slots.held(key), slots.share)
    if verdict is not Verdict.TAKE:
        cap = state.settings.max_in_flight
        raise FrontError(
            503,
            errors.FRONT_OVERLOADED,
            f"the cache front is already working on {cap} requests; retry shortly",
        )
    try:
        return await forward(
            request, state, route, target, data=data, headers=headers, strip_usage=strip_usage,
            charge=charge, tally=tally,
        )  # fmt: skip
    except asyncio.CancelledError:
        state.metrics.client_disconnects.inc()
        raise
    finally:
        slots.give(key, 1)


async def _encode(
    state: FrontState, body: dict[str, Any], placed: list[Any], *, size: int
) -> bytes:
    """The body vLLM receives: its resolved payloads are spliced in, not encoded, so only
    a large result (references to large payloads) is joined off the loop."""
    with refusing_unencodable():
        job = partial(serialize, body, placed)
        data = await _off_loop(state, size >= OFFLOAD_BYTES, job)
    return data  # type: ignore[no-any-return]


async def _salted(
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
    _count_controls(state, request.headers)
    if plan.client_request_id_removed:
        state.metrics.control_removed("request_id")
    if plan.session_header_value is not None:
        headers[settings.session_header] = plan.session_header_value
    strip = plan.strip_usage_chunk
    tally = _tally(state, request.headers, plan)
    return await _admitted(
        request, state, route, target, data=data, headers=headers, strip_usage=strip,
        charge=charge, tally=tally,
    )  # fmt: skip


def _tally(state: FrontState, headers: CIMultiDictProxy[str], plan: Plan) -> Tally | None:
    """The request's scope class and the picker's prediction, verified (`front.hits`): only
    a header signed with the salt key counts; whatever else arrives is counted by its
    verdict and dropped (`forward_headers` never passes it to vLLM)."""
    values = headers.getall(PREDICTED_MATCH_HEADER, ())
    prediction = None
    if state.predictions is not None:
        verdict = state.predictions.read(values)
        state.metrics.predicted(verdict.outcome.value)
        prediction = verdict.prediction
    elif any(v.strip(" \t") for v in values):
        state.metrics.predicted("unverifiable")
    scope = scope_class(plan.isolation)
    return None if scope is None else Tally(scope, prediction)


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


async def _probe(state: FrontState, path: str) -> tuple[int, bytes]:
    """GET one of vLLM's own paths (metrics, health) within `PROBE_SECONDS`."""
    assert state.pool is not None
    async with asyncio.timeout(PROBE_SECONDS):
        answer = await state.pool.request("GET", path, [("Accept-Encoding", "identity")], b"")
        try:
            body = await answer.read(MAX_UPSTREAM_METRICS_BYTES)
        finally:
            answer.release()
    return answer.status, body


async def metrics(request: web.BaseRequest, state: FrontState) -> web.Response:
    """vLLM's metrics followed by the front's, for the Endpoint Picker's scrape (vLLM's
    exposition is held whole to merge it: counted in the memory budget meanwhile)."""
    upstream: bytes | None = None
    charge = Charge(state)
    try:
        try:
            status, body = await _probe(state, METRICS_PATH)
            charge.hold(len(body))
            if status == 200 and len(body) <= MAX_UPSTREAM_METRICS_BYTES:
                upstream = body
        except (UpstreamError, TimeoutError):
            upstream = None
        state.metrics.upstream_metrics_up.set(1 if upstream is not None else 0)
        merged = merge_expositions(upstream, state.metrics.render())
    finally:
        charge.release()
    return web.Response(body=merged, headers={"Content-Type": CONTENT_TYPE})


async def healthz(request: web.BaseRequest, state: FrontState) -> web.Response:
    """Liveness: the front's event loop answers, and its workers make progress.

    Answering at all proves the loop is not wedged (the kubelet's timeout catches that).
    A loop that answers while a decode thread or JSON worker never finishes (a hung
    decoder, a deadlock) serves nothing that needs one and would never be restarted: an
    unfinished job older than `stuck_after` (far beyond any admitted job, queue
    included, so load alone never fails it) fails the probe. Nothing here waits on
    vLLM or on a worker: the answer itself takes microseconds, under attack too.
    """
    oldest = state.oldest_job_seconds()
    if oldest > state.stuck_after:
        return web.json_response(
            {
                "status": "stuck",
                "reason": f"a decode or JSON job has not finished for {oldest:.0f} s "
                f"(limit {state.stuck_after:g} s)",
            },
            status=503,
        )
    return web.json_response({"status": "ok"})


async def readyz(request: web.BaseRequest, state: FrontState) -> web.Response:
    """Readiness: vLLM behind the front answers its /health with 200, and the front is not
    stopping."""
    if state.draining:
        return web.json_response({"status": "not ready", "reason": "stopping"}, status=503)
    try:
        status, _ = await _probe(state, "/health")
    except (UpstreamError, TimeoutError) as exc:
        return web.json_response(
            {"status": "not ready", "reason": f"model server unreachable: {type(exc).__name__}"},
            status=503,
        )
    if status != 200:
        return web.json_response(
            {"status": "not ready", "reason": f"model server /health answered {status}"},
            status=503,
        )
    return web.json_response({"status": "ready"})


_FRONT_HANDLERS: Final[
    dict[str, Callable[[web.BaseRequest, FrontState], Awaitable[web.StreamResponse]]]
] = {
    METRICS_PATH: metrics,
    FRONT_HEALTH_PATH: healthz,
    FRONT_READY_PATH: readyz,
}


def server_options(settings: FrontSettings) -> dict[str, Any]:
    """How the front's HTTP server is built (aiohttp `RequestHandler` options).

    aiohttp's keep-alive timer runs from the moment a connection opens (or its
    last answer ends) and closes the connection if no complete request head
    arrived by then, whatever bytes trickled in: that is the header timeout.
    `handler_cancellation`: a client that leaves cancels its handler, which
    closes the upstream connection, which makes vLLM abort the request. After
    refusing a body unread, the front drains it for at most `LINGER_SECONDS`
    (so the client can read the error) and then closes. No access log (one log
    line per request costs more CPU than the front's own checks), and request
    bodies are never decompressed (any Content-Encoding is refused anyway).
    """
    return {
        "handler_cancellation": True,
        "access_log": None,
        "keepalive_timeout": settings.header_timeout_seconds,
        "lingering_time": LINGER_SECONDS,
        "auto_decompress": False,
    }


class FrontRequestHandler(web.RequestHandler):
    """aiohttp's connection handler, answering what its HTTP parser refuses as the front does.

    A request line or header block aiohttp's parser cannot accept (bad method or
    version, a non-ASCII target, an invalid header byte, a duplicate
    Content-Length, oversized lines, too many headers) never reaches `handle`:
    aiohttp answers it from `handle_error` with a plain-text 400. This override
    gives it the front's JSON error with a stable code, counted like every other
    refusal; an unexpected failure inside the front becomes a JSON 500
    `internal_error` (logged with its traceback, never sent to the client).
    """

    def __init__(self, manager: web.Server, *, state: FrontState, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._front_state = state

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # uvloop's transports implement the interface without subclassing it
        bound_send_buffer(
            cast(asyncio.Transport, transport), self._front_state.settings.send_buffer_bytes
        )

    def _process_keepalive(self) -> None:
        """aiohttp's header (and idle keep-alive) deadline, counted when it closes one."""
        was_closing = self._force_close
        super()._process_keepalive()
        if self._force_close and not was_closing:
            self._front_state.metrics.deadline_fired("header")

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        error = parse_refusal(status, exc)
        if error.status >= 500:
            log.error("the cache front failed on a request", exc_info=exc)
        else:
            log.debug("refused a malformed request: %s", exc)
        if request.writer.output_size > 0:
            # an answer already started: cut the connection (aiohttp's behaviour)
            raise ConnectionError("the answer was already started; closing the connection")
        metrics = self._front_state.metrics
        if error.status < 500:
            metrics.refuse(error.code)
        metrics.answered("unknown", error.status)
        response = _json_error(error)
        response.force_close()
        return response


_DUPLICATE: Final = re.compile(r"Duplicate '?([A-Za-z0-9!#$%&*+.^_`|~-]{1,64})'?")
_DETAIL_CHARS: Final = 100


def _detail(exc: HttpProcessingError) -> str:
    """The first line of aiohttp's message (llhttp's reason), short; never the raw bytes."""
    first = exc.message.split("\n", 1)[0].rstrip(":").strip()
    return first if len(first) <= _DETAIL_CHARS else first[: _DETAIL_CHARS - 3] + "..."


def parse_refusal(status: int, exc: BaseException | None) -> FrontError:
    """The front's error for what aiohttp's `handle_error` is asked to answer.

    aiohttp's parser raises `HttpProcessingError`s (llhttp's reasons); everything
    else reaching `handle_error` is a failure inside the front, a 500 with no
    detail (the traceback goes to the log).
    """
    if status >= 500 or not isinstance(exc, HttpProcessingError):
        return errors.internal_error()
    if isinstance(exc, LineTooLong) or "Too many headers" in exc.message:
        return FrontError(
            431,
            errors.REQUEST_HEAD_TOO_LARGE,
            "the request line or a header is longer than 8190 bytes, or there are more than "
            "128 headers",
        )
    detail = _detail(exc)
    if isinstance(exc, (BadStatusLine, InvalidURLError)):
        return FrontError(
            400,
            errors.INVALID_REQUEST_LINE,
            f"the request line is not 'METHOD /path HTTP/1.1' with a token method and an "
            f"ASCII target ({detail})",
        )
    duplicate = _DUPLICATE.match(detail)
    if duplicate:
        name = duplicate.group(1)
        return FrontError(
            400, errors.DUPLICATE_HEADER, f"send one {name} header, not several", param=name
        )
    if isinstance(exc, InvalidHeader) or "header" in detail.lower():
        return FrontError(
            400,
            errors.INVALID_HEADER,
            f"a header is malformed: names are tokens, values hold no control characters, no "
            f"line folding, and Host is required ({detail})",
        )
    return FrontError(
        400,
        errors.MALFORMED_REQUEST,
        f"the request's framing is not valid HTTP/1.1 ({detail}): one Content-Length of "
        "digits, or Transfer-Encoding: chunked alone",
    )


class FrontServer(web.Server):
    """aiohttp's low-level server with the front's handler and error answers.

    No `web.Application`: the front has one handler for every target (the route
    table in `routes.py` decides, on the raw target), so aiohttp's router,
    middleware chain and app signals would only cost time per request.
    """

    def __init__(self, state: FrontState, **kwargs: Any) -> None:
        self.state = state
        self._handler_kwargs = {
            k: v for k, v in kwargs.items() if k not in ("handler_cancellation",)
        }
        super().__init__(
            partial(handle, state),
            handler_cancellation=kwargs.get("handler_cancellation", False),
            **self._handler_kwargs,
        )

    def __call__(self) -> web.RequestHandler:
        return FrontRequestHandler(
            self, state=self.state, loop=asyncio.get_running_loop(), **self._handler_kwargs
        )


class FrontRunner(web.ServerRunner):
    """Runs a `FrontServer`; cleaning up also closes the upstream pool and decode threads."""

    def __init__(self, server: FrontServer, **kwargs: Any) -> None:
        super().__init__(server, **kwargs)
        self.front = server

    async def cleanup(self) -> None:
        await super().cleanup()
        state = self.front.state
        if state.pool is not None:
            state.pool.close()
        state.executor.shutdown(wait=False, cancel_futures=True)
        # Waited for: a front started as a multiprocessing child (`--workers`) runs its
        # exit finalizers right after this returns, which stop the pool's queue feeder
        # before a shutdown that does not wait has sent its workers their stop sentinels;
        # the workers then never exit and the child hangs joining them (seen).
        stopping = asyncio.get_running_loop().run_in_executor(None, state.drop_json_pool, True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping, JSON_POOL_STOP_SECONDS)


def create_state(
    settings: FrontSettings, *, secret: bytes | None, cache: PromptEmbedsCache
) -> FrontState:
    """Everything the handlers share; `secret` must be set in a salting mode."""
    if settings.needs_salt_key and not secret:
        raise ValueError(f"isolation mode {settings.isolation_mode.value} needs a salt key")
    state = FrontState(
        settings=settings,
        secret=secret,
        cache=cache,
        metrics=FrontMetrics(cache.stats),
        executor=ThreadPoolExecutor(
            max_workers=settings.decode_workers, thread_name_prefix="promptcache-decode"
        ),
        pool=UpstreamPool(
            settings.upstream_base,
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
            read_timeout=settings.upstream_timeout_seconds,
        ),
    )
    state.fair_share = FairShare(
        settings.fair_share_bytes_per_second, on_wait=state.metrics.waited_for_share
    )
    if identity_enabled(settings) and secret:
        state.attester = Attester(secret, settings.isolation_header, guard=ReplayGuard())
    if secret:
        state.predictions = PredictionReader(secret)
    # read at scrape time: no gauge update (and its lock) on every request
    state.metrics.in_flight.set_function(lambda: state.in_flight)
    return state


def create_runner(
    settings: FrontSettings,
    *,
    secret: bytes | None,
    cache: PromptEmbedsCache,
    **runner_kwargs: Any,
) -> FrontRunner:
    """The front, ready for `await runner.setup()` and a site (call in a running loop).

    runner = create_runner(settings, secret=secret, cache=cache)
    await runner.setup()
    await listening_site(runner, "0.0.0.0", 8000).start()
    """
    state = create_state(settings, secret=secret, cache=cache)
    return FrontRunner(FrontServer(state, **server_options(settings)), **runner_kwargs)


LISTEN_BACKLOG: Final = 4096
"""Connections the kernel completes and queues for the front before it accepts them (the
kernel caps it at `net.core.somaxconn`, 4096 by default). aiohttp's default is 128: under
a client's reconnect storm (`bench/hostile_load.py --attacks hold` opens 256 connections at
once, and its refused ones come back together each `Retry-After`) the queue overflowed
whenever the loop was a moment late, the kernel dropped the next handshakes, and another
tenant's new connection waited for TCP's retransmissions (1 s, then 3 s, then 7 s): the
multi-second tails of the well-behaved tenants under that attack (`TcpExtListenOverflows`
counted them). A queued connection costs the kernel a socket, no slot or byte of ours."""


def listening_site(
    runner: web.BaseRunner, host: str | None, port: int, *, reuse_port: bool = False
) -> web.TCPSite:
    """Where the front listens: a TCP site with `LISTEN_BACKLOG` (start it with
    `await site.start()`)."""
    return web.TCPSite(runner, host, port, backlog=LISTEN_BACKLOG, reuse_port=reuse_port or None)

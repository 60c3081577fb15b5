"""The cache front as an aiohttp application: a thin shell around policy and references.

Every request to the serving port lands in `handle`: its raw target is
canonicalised once (`routes.canonical_target`) and classified
(`routes.check_route`); the front's own paths (`/metrics`, `/healthz`,
`/readyz`) are answered here, salted routes are rewritten by the per-request
rules, read-only routes pass, everything else is refused with a JSON error.
What is forwarded to vLLM on localhost is exactly the target that was checked;
vLLM's answer (status and body) is passed back, streamed when vLLM streams.

This module is the request pipeline; its pieces, on the policy step's seams: reading the
body (`front.body`), the salted JSON pipeline (`front.salted`), forwarding under the
concurrency cap (`front.forwarding`), the front's own paths (`front.endpoints`), the
refusals (`front.refusals`) and the HTTP server (`front.http_server`, where
`create_runner` and `listening_site` live).
"""

from __future__ import annotations

from aiohttp import web

from promptcache.front.body import has_body, read_body
from promptcache.front.endpoints import FRONT_HANDLERS
from promptcache.front.forwarding import admitted, count_controls
from promptcache.front.refusals import json_error
from promptcache.front.salted import salted
from promptcache.front.state import Charge, FrontState
from promptcache.front.upstream import (
    forward_headers,
    new_request_id,
)
from promptcache.tenancy import errors
from promptcache.tenancy.attestation import claimed_account
from promptcache.tenancy.canonical import (
    JsonScan,
    check_headers,
    check_json_media_type,
)
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.fair_share import share_exceeded
from promptcache.tenancy.routes import (
    Route,
    RouteClass,
    Target,
    canonical_target,
    check_route,
)
from promptcache.tenancy.shares import identity_key


async def handle(state: FrontState, request: web.BaseRequest) -> web.StreamResponse:
    """Every request: canonical target, classified route, then the front or the proxy."""
    label = "unknown"
    try:
        target = canonical_target(request.raw_path)
        route = check_route(request.method, target.path)
        label = route.label
        if route.kind is RouteClass.FRONT:
            return await FRONT_HANDLERS[route.path](request, state)
        response = await _proxy(request, state, route, target)
    except FrontError as exc:
        state.metrics.refuse(exc.code)
        response = json_error(exc)
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
            if has_body(request):
                raise FrontError(
                    400, errors.BODY_NOT_ALLOWED, f"{route.path} takes no request body"
                )
            headers = forward_headers(
                request.headers, settings, json_body=False, request_id=new_request_id()
            )
            count_controls(state, request.headers)
            return await admitted(
                request, state, route, target, data=b"", headers=headers, strip_usage=False,
                charge=charge,
            )  # fmt: skip
        check_json_media_type(request.headers)
        metered = state.fair_share.enabled
        if metered:
            state.fair_share.seen(charge.key)
            await _fair_share(state, charge.key)
        scan = JsonScan()
        raw = await read_body(request, state, charge, scan)
        if metered:
            state.fair_share.charge(charge.key, scan.charge)
        return await salted(request, state, route, target, raw=raw, scan=scan, charge=charge)
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

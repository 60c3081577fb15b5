"""The cache front as an aiohttp application: a thin shell around policy and references.

Every request to the serving port lands here. Requests to the front's own
paths (`/metrics`, `/healthz`, `/readyz`) are answered here; everything else is
rewritten by the per-request rules and forwarded to vLLM on localhost, whose
answer (status and body) is passed back, streamed when vLLM streams.
"""

from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Final

import aiohttp
from aiohttp import web

from promptcache.contract import FRONT_HEALTH_PATH, FRONT_READY_PATH
from promptcache.embeds.cache import PromptEmbedsCache
from promptcache.front import errors
from promptcache.front.errors import FrontError
from promptcache.front.metrics import CONTENT_TYPE, FrontMetrics, merge_expositions
from promptcache.front.policy import SALTED_PATHS, Isolation, apply_policy
from promptcache.front.references import VerifiedLike, resolve, serialize
from promptcache.front.settings import FrontSettings
from promptcache.front.state import PARSE_FACTOR, STATE, Charge, FrontState
from promptcache.front.upstream import forward, forward_headers

log = logging.getLogger("promptcache.front")

METRICS_PATH: Final = "/metrics"
FORWARD_EXPANSION: Final = 4
"""Resolving references and densifying TurboQuant may grow a body up to this factor."""
PROBE_TIMEOUT: Final = aiohttp.ClientTimeout(total=5)
DENIED_PATHS: Final[frozenset[str]] = frozenset(
    {
        "/reset_prefix_cache",
        "/reset_mm_cache",
        "/reset_encoder_cache",
        "/sleep",
        "/wake_up",
        "/collective_rpc",
        "/start_profile",
        "/stop_profile",
        "/scale_elastic_ep",
        "/pause",
        "/resume",
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
    }
)
"""vLLM admin endpoints: a client must not flush or stall the shared cache through the front."""


def _json_error(exc: FrontError) -> web.Response:
    headers = {"Retry-After": "1"} if exc.status == 503 else None
    return web.Response(
        status=exc.status,
        body=exc.body_bytes(),
        content_type="application/json",
        headers=headers,
    )


def _endpoint_label(path: str) -> str:
    # Bounded label values: only known API paths are named, the rest are "other".
    if path in SALTED_PATHS:
        return path
    return "/v1/models" if path.startswith("/v1/models") else "other"


async def _read_body(request: web.Request, limit: int, charge: Charge) -> bytes:
    declared = request.content_length
    if declared is not None:
        if declared > limit:
            raise _too_large(declared, limit)
        charge.take(PARSE_FACTOR * declared)
    buffer = bytearray()
    async for chunk in request.content.iter_chunked(1 << 16):
        buffer += chunk
        if len(buffer) > limit:
            raise _too_large(len(buffer), limit)
        if declared is None:
            charge.take(PARSE_FACTOR * len(chunk))
    return bytes(buffer)


def _too_large(size: int, limit: int) -> FrontError:
    return FrontError(
        413,
        errors.REQUEST_TOO_LARGE,
        f"the request body has at least {size} bytes; this server accepts at most {limit}. "
        "Send prompt embeddings the server has seen by identifier instead of inline",
    )


def _parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise FrontError(
            400, errors.INVALID_JSON, f"the request body is not valid JSON: {exc}"
        ) from None
    if not isinstance(body, dict):
        raise FrontError(
            400,
            errors.BODY_NOT_OBJECT,
            f"the request body must be a JSON object, got a JSON {type(body).__name__}",
        )
    return body


async def _verify(state: FrontState, payload: str) -> VerifiedLike:
    # torch loads only once a request carries prompt embeds
    from promptcache.front.verify import verify_payload  # noqa: PLC0415

    loop = asyncio.get_running_loop()
    job = partial(
        verify_payload,
        payload,
        max_bytes=state.settings.max_body_bytes,
        dense_dtype=state.settings.turboquant_dtype,
    )
    return await loop.run_in_executor(state.executor, job)


def _count_policy(state: FrontState, path: str, isolation: Isolation) -> None:
    if path in SALTED_PATHS:
        state.metrics.isolation.labels(
            mode=state.settings.isolation_mode.value, decision=isolation.value
        ).inc()


async def proxy(request: web.Request) -> web.StreamResponse:
    """Apply the per-request rules, forward to vLLM and pass its answer back."""
    state = request.app[STATE]
    path = request.path
    label = _endpoint_label(path)
    if state.in_flight >= state.settings.max_in_flight:
        response: web.StreamResponse = _json_error(
            FrontError(
                503,
                errors.FRONT_OVERLOADED,
                f"the cache front is already working on {state.settings.max_in_flight} requests; "
                "retry shortly",
            )
        )
    else:
        state.in_flight += 1
        state.metrics.in_flight.inc()
        charge = Charge(state)
        try:
            response = await _proxy(request, state, path, label, charge)
        except FrontError as exc:
            response = _json_error(exc)
        except asyncio.CancelledError:
            state.metrics.client_disconnects.inc()
            raise
        finally:
            charge.release()
            state.in_flight -= 1
            state.metrics.in_flight.dec()
    state.metrics.requests.labels(endpoint=label, code=str(response.status)).inc()
    return response


async def _proxy(
    request: web.Request, state: FrontState, path: str, label: str, charge: Charge
) -> web.StreamResponse:
    settings = state.settings
    if path in DENIED_PATHS:
        raise FrontError(
            403,
            errors.PATH_FORBIDDEN,
            f"{path} is an administrative endpoint of the model server and is not served "
            "through the cache front",
        )
    raw = await _read_body(request, settings.max_body_bytes, charge)
    content_type = request.headers.get("Content-Type", "")
    is_json = request.method in ("POST", "PUT", "PATCH") and (
        path in SALTED_PATHS or (bool(raw) and content_type.startswith("application/json"))
    )
    strip_usage = False
    session_value: str | None = None
    if is_json:
        body = _parse_json(raw)
        try:
            plan = apply_policy(path, request.headers, body, settings, state.secret)
        except FrontError:
            _count_policy(state, path, Isolation.REJECTED)
            raise
        _count_policy(state, path, plan.isolation)
        if plan.client_salt_removed:
            state.metrics.client_salt_removed.inc()
        if plan.max_len_not_enforced:
            state.metrics.max_len_not_enforced.inc()
        strip_usage, session_value = plan.strip_usage_chunk, plan.session_header_value
        use_cache = plan.use_embeds_cache and state.cache.enabled
        scope = plan.salt if plan.isolation is Isolation.KEYED else None
        try:
            outcome = await resolve(
                path,
                body,
                cache=state.cache if use_cache else None,
                scope=scope,
                verifier=partial(_verify, state),
                kinds=state.kinds,
            )
        except FrontError as exc:
            missing = exc.extra.get("missing_prompt_embeds_ids")
            if isinstance(missing, list):
                state.metrics.id_lookups.labels(endpoint=label, result="miss").inc(len(missing))
            if exc.code in (errors.INVALID_PROMPT_EMBEDS, errors.PROMPT_EMBEDS_ID_MISMATCH):
                state.metrics.uploads.labels(result="rejected").inc()
            raise
        if outcome.hits:
            state.metrics.id_lookups.labels(endpoint=label, result="hit").inc(outcome.hits)
            state.metrics.bytes_saved.inc(max(outcome.bytes_saved, 0))
        if outcome.uploads_verified:
            state.metrics.uploads.labels(result="verified").inc(outcome.uploads_verified)
        data = serialize(body, outcome.placed)
        limit = settings.max_body_bytes * FORWARD_EXPANSION
        if len(data) > limit:
            raise FrontError(
                413,
                errors.REQUEST_TOO_LARGE,
                f"with its prompt embeddings resolved the request has {len(data)} bytes; "
                f"this server forwards at most {limit}",
            )
        charge.take(len(data))
    else:
        data = raw
    headers = forward_headers(request.headers, settings, json_body=is_json)
    if session_value is not None:
        headers[settings.session_header] = session_value
    return await forward(request, state, path, data=data, headers=headers, strip_usage=strip_usage)


async def metrics(request: web.Request) -> web.Response:
    """vLLM's metrics followed by the front's, for the Endpoint Picker's scrape."""
    state = request.app[STATE]
    assert state.session is not None
    upstream: bytes | None = None
    try:
        async with state.session.get(
            state.settings.upstream_base + METRICS_PATH, timeout=PROBE_TIMEOUT
        ) as resp:
            if resp.status == 200:
                upstream = await resp.read()
    except (aiohttp.ClientError, TimeoutError):
        upstream = None
    state.metrics.upstream_metrics_up.set(1 if upstream is not None else 0)
    body = merge_expositions(upstream, state.metrics.render())
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the front's event loop answers."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Readiness: vLLM behind the front answers its /health with 200."""
    state = request.app[STATE]
    assert state.session is not None
    try:
        async with state.session.get(
            state.settings.upstream_base + "/health", timeout=PROBE_TIMEOUT
        ) as resp:
            status = resp.status
    except (aiohttp.ClientError, TimeoutError) as exc:
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


async def _on_startup(app: web.Application) -> None:
    state = app[STATE]
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=10, sock_read=state.settings.upstream_timeout_seconds
    )
    connector = aiohttp.TCPConnector(limit=0)
    state.session = aiohttp.ClientSession(
        timeout=timeout,
        connector=connector,
        auto_decompress=True,
        skip_auto_headers=("User-Agent",),
    )


async def _on_cleanup(app: web.Application) -> None:
    state = app[STATE]
    if state.session is not None:
        await state.session.close()
    state.executor.shutdown(wait=False, cancel_futures=True)


def create_app(
    settings: FrontSettings,
    *,
    secret: bytes | None,
    cache: PromptEmbedsCache,
) -> web.Application:
    """Build the front; `secret` must be set in a salting mode (see `settings.read_salt_key`)."""
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
    )
    # aiohttp's own cap is a backstop; _read_body answers first with a clear message.
    app = web.Application(client_max_size=settings.max_body_bytes + (1 << 20))
    app[STATE] = state
    app.router.add_get(METRICS_PATH, metrics)
    app.router.add_get(FRONT_HEALTH_PATH, healthz)
    app.router.add_get(FRONT_READY_PATH, readyz)
    app.router.add_route("*", "/{tail:.*}", proxy)
    app.on_startup.append(_on_startup)
    app.on_cleanup.append(_on_cleanup)
    return app

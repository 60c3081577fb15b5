"""The front's positive security model: one canonical request target, every route classified.

A request is served only when its target is canonical (checked once, then
forwarded byte for byte) and names a route this table knows:

* `SALTED`: a vLLM route that accepts a prompt or a `cache_salt`. The
  isolation policy applies in full (a key is required in Required mode, the
  client's `cache_salt` is removed, the front's salt is set).
* `READ_ONLY`: a vLLM route that reads nothing tenant-specific and changes
  nothing (health, model list, version).
* `FRONT`: answered by the front itself (`/metrics`, `/healthz`, `/readyz`).
* `REFUSED`: a vLLM route that is not served through the front (administration,
  state other tenants share, bodies the front cannot inspect), with the reason.

Anything else is refused too. The table covers every route of the vLLM
release the renderer deploys (`VLLM_ROUTES_VERSION`); `tests/front/
test_front_routes.py` reads that release's route table out of vLLM's own source
(`tools/vllm_routes.py`) and fails when a route is missing here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Literal

from promptcache.contract import FRONT_HEALTH_PATH, FRONT_READY_PATH
from promptcache.tenancy import errors
from promptcache.tenancy.errors import FrontError

VLLM_ROUTES_VERSION: Final = "0.33.0"
"""The vLLM release this table was checked against (the renderer's default image tag)."""

METRICS_PATH: Final = "/metrics"


class RouteClass(StrEnum):
    """What the front does with a route (also the `route_class` metric label)."""

    SALTED = "salted"
    READ_ONLY = "read_only"
    FRONT = "front"
    REFUSED = "refused"


EmbedsShape = Literal["completion", "chat", "by_body"]
"""Where a route's body can carry prompt embeds (`front.references.find_slots`), derived
from vLLM's request models by `tools/vllm_routes.py` and checked against them by
`tests/front/test_front_vllm_fields.py`."""


@dataclass(frozen=True, slots=True)
class Route:
    """One route of vLLM (or of the front) and how the front treats it."""

    path: str
    """vLLM's path template, e.g. `/v1/responses/{response_id}`."""
    methods: frozenset[str]
    kind: RouteClass
    why: str
    """What the route is; for refused routes, the reason the client is told."""
    reaches_kv_cache: bool = False
    """Salted routes: the prompt is prefilled by the engine, so it shares KV blocks."""
    salt_field: bool = False
    """Salted routes: vLLM's request model has `cache_salt` (so the salt isolates)."""
    usage_stream: bool = False
    """The stream ends with a usage chunk when `stream_options.include_usage` is true."""
    embeds: EmbedsShape | None = None
    """Where prompt-embeds references sit in the body, if the route takes them."""

    @property
    def label(self) -> str:
        """The metric label for this route: its template (a bounded set)."""
        return self.path


def _salted(
    path: str,
    why: str,
    *,
    kv: bool = True,
    salt: bool = True,
    usage: bool = False,
    embeds: EmbedsShape | None = None,
) -> Route:
    return Route(
        path,
        frozenset({"POST"}),
        RouteClass.SALTED,
        why,
        reaches_kv_cache=kv,
        salt_field=salt,
        usage_stream=usage,
        embeds=embeds,
    )


def _read(path: str, why: str, methods: tuple[str, ...] = ("GET",)) -> Route:
    return Route(path, frozenset(methods), RouteClass.READ_ONLY, why)


def _refused(path: str, why: str, methods: tuple[str, ...] = ("POST",)) -> Route:
    return Route(path, frozenset(methods), RouteClass.REFUSED, why)


_ADMIN = "an administrative endpoint of the model server, not served through the cache front"
_RL = "a weight-update (RL) endpoint of the model server, not served through the cache front"
_SHARED_STATE = (
    "it reads or changes state other tenants share (stored responses, running requests), "
    "which the cache front cannot scope to one tenant"
)
_DOCS = "vLLM's API documentation is not served through the cache front"

ROUTES: Final[tuple[Route, ...]] = (
    # --- the front's own -----------------------------------------------------------------
    Route(METRICS_PATH, frozenset({"GET"}), RouteClass.FRONT, "vLLM's metrics and the front's"),
    Route(FRONT_HEALTH_PATH, frozenset({"GET"}), RouteClass.FRONT, "the front's liveness"),
    Route(FRONT_READY_PATH, frozenset({"GET"}), RouteClass.FRONT, "the front's readiness"),
    # --- generation: the prompt reaches the prefix cache ---------------------------------
    _salted("/v1/completions", "OpenAI completions", usage=True, embeds="completion"),
    _salted("/v1/chat/completions", "OpenAI chat completions", usage=True, embeds="chat"),
    _salted("/v1/chat/completions/batch", "batched chat completions", embeds="chat"),
    _salted("/v1/responses", "OpenAI responses"),
    _salted("/v1/messages", "Anthropic messages"),
    _salted("/inference/v1/generate", "token-in/token-out generation"),
    _salted("/generative_scoring", "generative scoring"),
    _salted("/v1/systemone", "structured decisions"),
    _salted("/v1/decisions", "decisions"),
    _salted(
        "/invocations",
        "SageMaker invocations (dispatched to completions, chat or pooling by body shape)",
        usage=True,
        embeds="by_body",
    ),
    _salted("/cohere/v2/chat", "Cohere chat v2 (its request model has no cache_salt)", salt=False),
    # --- pooling: the prompt is prefilled too (cache_salt is accepted) -------------------
    _salted("/v1/embeddings", "OpenAI embeddings", embeds="chat"),
    _salted("/v2/embed", "Cohere embed v2"),
    _salted("/pooling", "pooling", embeds="chat"),
    _salted("/classify", "classification", embeds="chat"),
    _salted("/score", "scoring"),
    _salted("/v1/score", "scoring"),
    _salted("/rerank", "reranking"),
    _salted("/v1/rerank", "reranking"),
    _salted("/v2/rerank", "reranking"),
    # --- prompts that are only rendered or tokenized (no KV cache) -----------------------
    _salted("/tokenize", "tokenization", kv=False, salt=False, embeds="chat"),
    _salted("/detokenize", "detokenization", kv=False, salt=False),
    _salted("/v1/messages/count_tokens", "Anthropic token counting", kv=False, salt=False),
    _salted(
        "/v1/chat/completions/render",
        "chat prompt rendering",
        kv=False,
        salt=False,
        embeds="chat",
    ),
    _salted(
        "/v1/completions/render",
        "completion prompt rendering",
        kv=False,
        salt=False,
        embeds="completion",
    ),
    _salted("/v1/messages/render", "messages prompt rendering", kv=False, salt=False),
    _salted("/v1/responses/render", "responses prompt rendering", kv=False, salt=False),
    _salted("/v1/chat/completions/derender", "chat de-rendering", kv=False, salt=False),
    _salted("/v1/completions/derender", "completion de-rendering", kv=False, salt=False),
    _salted("/cohere/v2/chat/render", "Cohere chat rendering", kv=False, salt=False),
    # --- read-only ------------------------------------------------------------------------
    _read("/health", "vLLM's health"),
    _read("/ready", "readiness of vLLM's data-parallel supervisor"),
    _read("/ping", "SageMaker health", ("GET", "POST")),
    _read("/v1/models", "the served models"),
    _read("/version", "vLLM's version"),
    _read("/load", "vLLM's current load"),
    _read("/tokenizer_info", "the tokenizer's configuration"),
    _read("/is_sleeping", "whether the engine sleeps"),
    _read("/is_paused", "whether generation is paused"),
    # --- refused: bodies the front cannot inspect -----------------------------------------
    _refused(
        "/v1/audio/transcriptions",
        "multipart (audio) bodies cannot be inspected by the cache front, so the isolation "
        "policy could not be applied",
    ),
    _refused(
        "/v1/audio/translations",
        "multipart (audio) bodies cannot be inspected by the cache front, so the isolation "
        "policy could not be applied",
    ),
    _refused(
        "/v1/realtime",
        "websocket sessions cannot be inspected by the cache front",
        ("GET",),
    ),
    # --- refused: state other tenants share ------------------------------------------------
    _refused("/v1/responses/{response_id}", _SHARED_STATE, ("GET",)),
    _refused("/v1/responses/{response_id}/cancel", _SHARED_STATE),
    _refused("/abort_requests", _SHARED_STATE),
    _refused("/inference/v1/abort_requests", _SHARED_STATE),
    # --- refused: administration -----------------------------------------------------------
    _refused("/reset_prefix_cache", _ADMIN),
    _refused("/reset_mm_cache", _ADMIN),
    _refused("/reset_encoder_cache", _ADMIN),
    _refused("/sleep", _ADMIN),
    _refused("/wake_up", _ADMIN),
    _refused("/release_kv_cache_memory", _ADMIN),
    _refused("/collective_rpc", _ADMIN),
    _refused("/server_info", _ADMIN, ("GET",)),
    _refused("/kv_event_sources", _ADMIN, ("GET",)),
    _refused("/start_profile", _ADMIN),
    _refused("/stop_profile", _ADMIN),
    _refused("/scale_elastic_ep", _ADMIN),
    _refused("/is_scaling_elastic_ep", _ADMIN),
    _refused("/fault_tolerance/apply", _ADMIN),
    _refused("/fault_tolerance/status", _ADMIN, ("GET",)),
    _refused("/v1/load_lora_adapter", _ADMIN),
    _refused("/v1/unload_lora_adapter", _ADMIN),
    _refused("/pause", _RL),
    _refused("/resume", _RL),
    _refused("/init_weight_transfer_engine", _RL),
    _refused("/shutdown_weight_transfer_engine", _RL),
    _refused("/start_weight_update", _RL),
    _refused("/start_draft_weight_update", _RL),
    _refused("/update_weights", _RL),
    _refused("/finish_weight_update", _RL),
    _refused("/update_weight_version", _RL),
    _refused("/weight_info", _RL, ("GET",)),
    _refused("/weight_checker", _RL),
    _refused("/get_world_size", _RL, ("GET",)),
    # --- refused: documentation (FastAPI's own routes) ------------------------------------
    _refused("/docs", _DOCS, ("GET",)),
    _refused("/docs/oauth2-redirect", _DOCS, ("GET",)),
    _refused("/redoc", _DOCS, ("GET",)),
    _refused("/openapi.json", _DOCS, ("GET",)),
    _refused("/static", _DOCS, ("GET",)),
)

_EXACT: Final[dict[str, Route]] = {r.path: r for r in ROUTES if "{" not in r.path}
_TEMPLATED: Final[tuple[tuple[tuple[str, ...], Route], ...]] = tuple(
    (tuple(r.path.split("/")), r) for r in ROUTES if "{" in r.path
)
_BELOW_MOUNT: Final = Route(
    "/metrics/*", frozenset({"GET"}), RouteClass.REFUSED, "only /metrics itself is served"
)
_PREFIXES: Final[tuple[str, ...]] = ("/metrics/", "/static/")
"""Mounts: vLLM serves everything below these paths; the front refuses it."""

_PATH_RE: Final = re.compile(r"/|(?:/[A-Za-z0-9_~.-]+)+")
_QUERY_RE: Final = re.compile(r"(?:[A-Za-z0-9_~.!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})*")


@dataclass(frozen=True, slots=True)
class Target:
    """A canonical request target: what was checked is exactly what is forwarded."""

    path: str
    query: str | None

    @property
    def raw(self) -> str:
        return self.path if self.query is None else f"{self.path}?{self.query}"


def _bad_target(raw: str, why: str) -> FrontError:
    shown = raw if len(raw) <= 120 else raw[:117] + "..."
    return FrontError(
        400,
        errors.INVALID_REQUEST_TARGET,
        f"the request target {shown!r} is not canonical: {why}. Send the plain path, "
        "e.g. /v1/chat/completions",
    )


def canonical_target(raw: str) -> Target:
    """Split a raw request target into path and query, refusing anything non-canonical.

    Canonical: origin form (starts with one `/`), ASCII, a path of non-empty
    segments of unreserved characters (no percent-encoding at all, so no
    encoded slash or dot can hide a segment), no `.` or `..` segment, no
    trailing slash, no fragment; a query of RFC 3986 query characters with
    well-formed percent escapes.
    """
    if not raw.startswith("/"):
        raise _bad_target(raw, "only origin-form targets (starting with '/') are accepted")
    if not raw.isascii():
        raise _bad_target(raw, "it contains non-ASCII characters")
    if "#" in raw:
        raise _bad_target(raw, "it contains a fragment ('#')")
    path, sep, query = raw.partition("?")
    if "%" in path:
        raise _bad_target(raw, "the path contains percent-encoding")
    if not _PATH_RE.fullmatch(path):
        if "//" in path:
            raise _bad_target(raw, "the path contains an empty segment ('//')")
        if path.endswith("/"):
            raise _bad_target(raw, "the path ends with '/'")
        raise _bad_target(raw, "the path contains characters outside A-Z a-z 0-9 - . _ ~")
    segments = path.split("/")
    if "." in segments or ".." in segments:
        raise _bad_target(raw, "the path contains a '.' or '..' segment")
    if sep and not _QUERY_RE.fullmatch(query):
        raise _bad_target(raw, "the query contains characters that must be percent-encoded")
    return Target(path=path, query=query if sep else None)


def find_route(path: str) -> Route | None:
    """The route a canonical path names, or None when vLLM has no such route."""
    route = _EXACT.get(path)
    if route is not None:
        return route
    parts = tuple(path.split("/"))
    for template, candidate in _TEMPLATED:
        if len(template) == len(parts) and all(
            t == p or (t.startswith("{") and p) for t, p in zip(template, parts, strict=True)
        ):
            return candidate
    if path.startswith(_PREFIXES):
        return _BELOW_MOUNT
    return None


def check_route(method: str, path: str) -> Route:
    """The route for this method and canonical path, or the refusal the client gets."""
    route = find_route(path)
    if route is None:
        raise FrontError(
            404,
            errors.ROUTE_NOT_FOUND,
            f"{path} is not a route of the model server (vLLM {VLLM_ROUTES_VERSION}); "
            "see docs/cache-front.md for the routes the cache front serves",
        )
    if route.kind is RouteClass.REFUSED:
        raise FrontError(
            403, errors.PATH_FORBIDDEN, f"{route.path} is not served here: {route.why}"
        )
    if method not in route.methods:
        allowed = ", ".join(sorted(route.methods))
        raise FrontError(
            405,
            errors.METHOD_NOT_ALLOWED,
            f"{route.path} accepts {allowed}, not {method}",
            headers={"Allow": allowed},
        )
    return route

"""The model-list responder: `GET /v1/models` for a shared Gateway, and the Gateway's
answer to a request no resource on it serves.

The chart routes two rules of each shared Gateway here (docs/multi-model.md): `GET` on the
exact path `/v1/models`, which outranks every resource's `PathPrefix /` rule, and a bare
`PathPrefix /`, which every resource's rule outranks (it matches one header more), so it
only gets what no resource takes. Both rules set `contract.GATEWAY_HEADER` to the Gateway,
so one responder answers for every Gateway with that Gateway's list.

Boundary rules, as at the cache front: nothing is read from a request but its head (the
model name comes from the header the body-based router set); `/v1/models` takes GET and
HEAD only and no body; identifiers (the Gateway header, a model id in the path) are checked
before any lookup; every refusal is a JSON error in vLLM's own shape (`{"error": {message,
type, param, code}}`, what a client of vLLM already handles), including those of aiohttp's
HTTP parser; an unread body is never drained past a second (the connection is closed).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong

from promptcache.contract.router import GATEWAY_HEADER, MODEL_HEADER, MODELS_PATH
from promptcache.render.model_list import Arrival, known_names, model_list

log = logging.getLogger(__name__)

_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
GATEWAY_VALUE: Final = re.compile(rf"^({_LABEL})/({_LABEL}(?:\.{_LABEL})*)(?:/({_LABEL}))?$")
"""`<namespace>/<name>[/<listener>]`: DNS labels (a name may hold dots), as the API server
allows them."""
HOST: Final = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
MAX_MODEL_ID: Final = 256
"""Longer ids exist nowhere (adapter and served names are at most 256 characters)."""
MAX_CACHED: Final = 256
"""Distinct (Gateway, Host) answers kept per version of the resources."""
RETRY_AFTER_S: Final = 5
LINGER_SECONDS: Final = 1.0


@dataclass(frozen=True)
class Refusal:
    status: int
    type: str
    message: str
    param: str | None = None
    headers: tuple[tuple[str, str], ...] = ()

    def response(self) -> web.Response:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.status}}  # fmt: skip
        return web.Response(
            status=self.status,
            body=json.dumps(body).encode(),
            content_type="application/json",
            headers=dict(self.headers),
        )


MAX_ALIASES: Final = 32
"""Base models named in an unknown model's error, at most (the rest is elided)."""


def not_found_model(name: str, aliases: list[str]) -> Refusal:
    """vLLM's own answer for a model it does not serve (`OpenAIServing._check_model` in
    vLLM 0.32 and 0.33): its served base models are the "valid aliases"; here, those the
    Gateway serves now (an adapter is no alias in vLLM's sense, and is in `/v1/models`)."""
    message = f"The model `{name}` does not exist."
    if aliases:
        shown = aliases[:MAX_ALIASES] + (["..."] if len(aliases) > MAX_ALIASES else [])
        message += f" Valid aliases: {', '.join(shown)}."
    return Refusal(404, "NotFoundError", message, "model")


class Catalog:
    """What the responder answers from: the watched resources (see `watch.ResourceCache`)."""

    def __init__(self, resources: Callable[[], list[Any]], created: Callable[[], dict[str, int]],
                 version: Callable[[], int], ready: Callable[[], bool]) -> None:  # fmt: skip
        self._resources = resources
        self._created = created
        self._version = version
        self.ready = ready
        self._cache: dict[Arrival, bytes] = {}
        self._cached_version = -1

    def listing(self, at: Arrival) -> bytes:
        """The encoded `/v1/models` answer, cached until the resources change."""
        if self._version() != self._cached_version or len(self._cache) >= MAX_CACHED:
            self._cache = {}
            self._cached_version = self._version()
        if at not in self._cache:
            answer = model_list(self._resources(), at, created=self._created())
            self._cache[at] = json.dumps(answer, separators=(",", ":")).encode()
        return self._cache[at]

    def entries(self, at: Arrival) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = json.loads(self.listing(at))["data"]
        return data

    def known(self, at: Arrival) -> set[str]:
        return known_names(self._resources(), at)

    def aliases(self, at: Arrival) -> list[str]:
        """The base models served at `at` now, sorted."""
        return sorted({e["id"] for e in self.entries(at) if "parent" not in e})


def arrival(request: web.BaseRequest) -> Arrival | Refusal:
    """The Gateway and Host a request came through, from the head only."""
    values = request.headers.getall(GATEWAY_HEADER, [])
    if len(values) != 1 or not (match := GATEWAY_VALUE.match(values[0])):
        return Refusal(
            400,
            "BadRequestError",
            f"this answer needs the {GATEWAY_HEADER} header, once, as <namespace>/<name> of the "
            "Gateway: the responder's HTTPRoute sets it (bodyBasedRouter.modelList.gateways in "
            "the chart); a request that reaches the responder without it did not come through "
            "that route",
            GATEWAY_HEADER,
        )
    host = (request.host or "").lower()
    if host.startswith("["):
        host = ""  # an IPv6 literal: no route names one
    host = host.rsplit(":", 1)[0].rstrip(".")
    return Arrival(match[1], match[2], match[3] or "", host if HOST.match(host) else "")


def _has_body(request: web.BaseRequest) -> bool:
    return request.body_exists


def _models(request: web.BaseRequest, catalog: Catalog, at: Arrival) -> web.StreamResponse:
    if request.method not in ("GET", "HEAD"):
        return Refusal(405, "MethodNotAllowed", f"{MODELS_PATH} takes GET (or HEAD) only, not "
                       f"{request.method}", None, (("Allow", "GET, HEAD"),)).response()  # fmt: skip
    if _has_body(request):
        return Refusal(400, "BadRequestError", f"GET {MODELS_PATH} takes no body").response()
    return web.Response(body=catalog.listing(at), content_type="application/json")


def _model(request: web.BaseRequest, catalog: Catalog, at: Arrival, name: str) -> web.Response:
    """`GET /v1/models/{id}` (OpenAI's retrieve): the entry, or vLLM's not-found error."""
    if request.method not in ("GET", "HEAD"):
        return Refusal(405, "MethodNotAllowed", f"{MODELS_PATH}/{{model}} takes GET only",
                       None, (("Allow", "GET, HEAD"),)).response()  # fmt: skip
    if len(name) > MAX_MODEL_ID or not name.isprintable():
        return Refusal(400, "BadRequestError", f"a model id is at most {MAX_MODEL_ID} printable "
                       "characters", "model").response()  # fmt: skip
    for entry in catalog.entries(at):
        if entry["id"] == name:
            return web.json_response(entry)
    return not_found_model(name, catalog.aliases(at)).response()


def _unrouted(request: web.BaseRequest, catalog: Catalog, at: Arrival) -> Refusal:
    """A request no resource's rule took: why, as precisely as the head tells."""
    names = request.headers.getall(MODEL_HEADER, [])
    name = names[0] if len(names) == 1 else ""
    if len(name) > MAX_MODEL_ID or not name.isprintable():
        return Refusal(400, "BadRequestError", f"`model` is at most {MAX_MODEL_ID} printable "
                       "characters", "model")  # fmt: skip
    if name:
        if name in {e["id"] for e in catalog.entries(at)} or name in catalog.known(at):
            return Refusal(
                503,
                "ServiceUnavailableError",
                f"The model `{name}` is not ready yet: no ready pod serves it on this Gateway "
                "(its pods are starting, or its resource scales to zero); retry later.",
                "model",
                (("Retry-After", str(RETRY_AFTER_S)),),
            )
        return not_found_model(name, catalog.aliases(at))
    if request.method == "POST":
        return Refusal(
            400,
            "BadRequestError",
            "The request names no model. This Gateway serves several: set `model` in the JSON "
            f"body to one of those GET {MODELS_PATH} lists.",
            "model",
        )
    where = f"{request.method} {request.path[:200]}"
    return Refusal(404, "NotFoundError", f"No route for {where} on this Gateway.")


async def handle(catalog: Catalog, request: web.BaseRequest) -> web.StreamResponse:
    """Every request of the serving port."""
    at = arrival(request)
    if isinstance(at, Refusal):
        response: web.StreamResponse = at.response()
    elif not catalog.ready():
        response = Refusal(503, "ServiceUnavailableError", "the model list is loading; retry",
                           None, (("Retry-After", "1"),)).response()  # fmt: skip
    elif request.path == MODELS_PATH:
        response = _models(request, catalog, at)
    elif request.path.startswith(MODELS_PATH + "/"):
        response = _model(request, catalog, at, request.path[len(MODELS_PATH) + 1 :])
    else:
        response = _unrouted(request, catalog, at).response()
    if _has_body(request):
        response.force_close()  # the body stays unread: never drain it
    return response


class CatalogRequestHandler(web.RequestHandler):
    """What aiohttp's HTTP parser refuses, answered in the same JSON shape (never its plain
    text), and a failure of ours as a JSON 500 with the traceback only in the log."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500 or not isinstance(exc, HttpProcessingError):
            log.error("the model-list responder failed on a request", exc_info=exc)
            refusal = Refusal(500, "InternalServerError", "the model-list responder failed; "
                              "see its log")  # fmt: skip
        elif isinstance(exc, LineTooLong) or "Too many headers" in exc.message:
            refusal = Refusal(431, "BadRequestError", "the request line or a header is longer "
                              "than 8190 bytes, or there are more than 128 headers")  # fmt: skip
        else:
            first = exc.message.split("\n", 1)[0][:100]
            refusal = Refusal(
                400, "BadRequestError", f"the request is not valid HTTP/1.1 ({first})"
            )
        if request.writer.output_size > 0:
            raise ConnectionError("the answer was already started; closing the connection")
        response = refusal.response()
        response.force_close()
        return response


class CatalogServer(web.Server):
    """aiohttp's low-level server (one handler for every target: no router needed)."""

    def __init__(self, catalog: Catalog, **kwargs: Any) -> None:
        self._kwargs = kwargs

        async def handler(request: web.BaseRequest) -> web.StreamResponse:
            return await handle(catalog, request)

        super().__init__(handler, **kwargs)

    def __call__(self) -> web.RequestHandler:
        return CatalogRequestHandler(self, loop=asyncio.get_running_loop(), **self._kwargs)


SERVER_OPTIONS: Final[dict[str, Any]] = {
    "access_log": None,
    "keepalive_timeout": 15.0,
    "lingering_time": LINGER_SECONDS,
    "auto_decompress": False,
}
"""No access log; the keep-alive timer doubles as the header timeout; bodies are never read,
so never decompressed."""


def health_app(ready: Callable[[], bool]) -> web.Application:
    """`/healthz` (the loop answers) and `/readyz` (the first list arrived), on their own port:
    the Gateway routes the serving port's every path here, never these."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="the first list of resources has not arrived\n")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app

"""The gateway's policy step: an ext_proc proxy in the Endpoint Picker pod, before the picker.

The picker hashes the body's `cache_salt` into the first prefix block, but the cache front
derives the tenant's salt inside the model-server pod, after the pick: too late. So this
step, on the port the EPP Service targets, relays every ext_proc stream to the picker on
the pod's loopback and, per request, before the picker sees it:

- derives the tenant's `cache_salt` from the isolation key with the policy function the
  cache front runs too (`promptcache.tenancy.policy.apply_policy`: same HMAC, same secret,
  same modes, same errors) and puts it in the body, so tenants with the same prompt build
  separate prefix entries and the front, re-deriving the same salt, forwards the same value;
- drops any `cache_salt` the client sent, so a forged salt cannot steer routing;
- answers a request the front would refuse (Required mode without a key, a malformed key)
  itself, with the front's status and error body, without asking the picker;
- names the session, for pickers with a session plugin, from `prompt_cache_key` (OpenAI's
  cache-routing hint) or the body's `user` when the session header is absent. A session
  names routing only, never isolation. An explicit header always wins.

It holds a request's headers until its body has arrived. Memory is bounded: a request may
hold at most `max_body_bytes` of body (more gets the front's HTTP 413) and all requests
together at most `max_buffered_bytes` (more gets HTTP 503, retryable); nothing passes
unread, since that would route without the tenant's salt or session. Every other message,
both ways, passes through unchanged, and the picker's status ends the gateway's stream as it
is. See docs/endpoint-picker.md.

    >>> settings = GatewayPolicySettings(listen="127.0.0.1:0", upstream="127.0.0.1:9012")
    >>> running = await start(settings)
    >>> running.port  # the gateway (or a test) dials 127.0.0.1:<port>
    >>> await running.stop(grace_s=5)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import multiprocessing
import os
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Final

import grpc
import grpc.aio
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from envoy.type.v3 import http_status_pb2
from multidict import CIMultiDict, MultiMapping
from prometheus_client import CollectorRegistry, Counter, start_http_server

from promptcache.contract import (
    CACHE_SALT_FIELD,
    IDENTITY_ATTESTATION_HEADER,
    needs_salt_key,
)
from promptcache.contract.session import session_of
from promptcache.contract.settings import split_host_port
from promptcache.gateway.settings import GatewayPolicySettings
from promptcache.stopping import STOP_SIGNALS, stop_event
from promptcache.tenancy import errors as front_errors
from promptcache.tenancy.attestation import Attester
from promptcache.tenancy.canonical import (
    POLICY_FIELDS,
    JsonScan,
    check_headers,
    check_json_media_type,
    encode_body,
    header_multidict,
    json_charge,
    parse_body,
)
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.fair_share import FairShare, share_exceeded
from promptcache.tenancy.identity import account_at_gateway, identity_enabled
from promptcache.tenancy.policy import apply_policy
from promptcache.tenancy.routes import Route, RouteClass, canonical_target, check_route
from promptcache.tenancy.settings import PolicyReader
from promptcache.tenancy.shares import Ledger, Verdict, identity_key, share_of, share_refusal

log = logging.getLogger("promptcache.gateway_policy")

_CHUNK_BYTES: Final[int] = 1024 * 1024
"""Largest body message sent to the picker (gRPC servers refuse messages over 4 MiB)."""
_DECIDE_WORKERS: Final[int] = 2
"""Worker processes deciding large bodies: bounded, so a burst cannot take every core."""
_WORKER_NICENESS: Final[int] = 10
"""The workers run nicer than the loop that routes every tenant (the front's reason too,
`front.state.WORKER_NICENESS`): an attacker's bodies get the CPU the loop leaves."""
_NOT_FORWARDED_METADATA: Final[frozenset[str]] = frozenset(
    {"content-type", "te", "user-agent", "host", "content-length", "accept-encoding"}
)


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


def _budget(limit: int, percent: int) -> Ledger:
    """Body bytes held by all streams at once, and by each client identity (`tenancy.shares`;
    one event loop: no lock needed)."""
    return Ledger(limit, share_of(limit, percent))


def declared_length(headers: Sequence[tuple[str, bytes]]) -> int:
    """The body size a request's Content-Length announces (its first value), at least 1: what
    its body will ask of the budget at least. 1 when absent or not a plain decimal (the
    front refuses a malformed one; here it only sizes an early refusal)."""
    for name, value in headers:
        if name == "content-length":
            text = value.strip()
            return max(int(text), 1) if text.isdigit() and len(text) <= 18 else 1
    return 1


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


class _Inspector:
    """Per-stream state: hold the request headers until the whole body has arrived.

    `feed` returns the messages to forward now, or a `FrontError` to answer with; when it
    returns None the request is complete (its body ended, or trailers or a headers-only
    request ended it) and the caller decides (`body()`, then `apply()`). Nothing leaves
    undecided: a message the protocol does not allow while a request is held is a
    refusal, never a reason to let the held request through."""

    def __init__(self, max_body_bytes: int, budget: Ledger) -> None:
        self.max_body_bytes = max_body_bytes
        self.budget = budget
        self.active = True
        self.held: Any = None
        self.chunks: list[Any] = []
        self.tail: list[Any] = []
        """Trailers that ended the request: forwarded after the decided body."""
        self.size = 0
        self.scan = JsonScan()
        """The body's structural bytes, counted per message as it arrives (at once, a
        large body's count held the loop for tens of milliseconds)."""
        self.charged = 0
        self.share_key: bytes = b""
        """The client identity the held request counts against: its share of the budget
        (`tenancy.shares`) and of decoding work (`tenancy.fair_share`); set when its headers
        arrive."""
        self.deadline = 0.0
        """Loop time by which a held request's body must have ended."""

    @property
    def holding(self) -> bool:
        return self.active and self.held is not None

    def feed(self, msg: Any) -> list[Any] | FrontError | None:
        if not self.active:
            return [msg]
        kind = msg.WhichOneof("request")
        if self.held is None:
            if kind != "request_headers":
                return [msg]  # nothing held (a stream the gateway opened oddly): pass on
            self.held = msg
            return None if msg.request_headers.end_of_stream else []
        if kind == "request_body":
            n = len(msg.request_body.body)
            if self.size + n > self.max_body_bytes:
                size, limit = self.size + n, self.max_body_bytes
                self.release()
                return too_large(size, limit)
            refusal = self.take(n)
            if refusal is not None:
                self.release()
                return refusal
            self.size += n
            self.scan.add(msg.request_body.body)
            self.chunks.append(msg)
            return None if msg.request_body.end_of_stream else []
        if kind == "request_trailers":
            self.tail.append(msg)
            return None  # trailers end the request: decide on the body so far
        self.release()
        return protocol_error(kind)

    def take(self, n: int) -> FrontError | None:
        """Charge `n` more bytes to the held request and its client, or the refusal: 413 when
        the request alone would pass one client's share, 429 when its client holds its
        share while another client holds some (or asks into the reserve kept for lighter
        holders), 503 when the step holds
        all it may."""
        budget = self.budget
        if self.charged + n > budget.share:
            return parse_too_large(self.charged + n, budget.share)
        verdict = budget.take(self.share_key, n)
        if verdict is Verdict.TAKE:
            self.charged += n
            return None
        if verdict is Verdict.OVER_SHARE:
            held = budget.held(self.share_key)
            return share_refusal("budget for request bodies", held, budget.share, "bytes")
        return busy()

    def headers(self) -> list[tuple[str, bytes]]:
        """Every header entry, in order, keys lower-cased, values as bytes."""
        if self.held is None:
            return []
        return [
            (h.key.lower(), h.raw_value if h.raw_value else h.value.encode())
            for h in self.held.request_headers.headers.headers
        ]

    def body(self) -> bytes:
        return b"".join(c.request_body.body for c in self.chunks)

    def apply(self, decision: Decision, session_header: str) -> list[Any]:
        """Rewrite what was held per the decision, then forward it."""
        if self.held is None:
            return self.release()
        entries = self.held.request_headers.headers.headers
        if decision.salted:
            for i in reversed(range(len(entries))):
                if entries[i].key.lower() == IDENTITY_ATTESTATION_HEADER:
                    del entries[i]  # a client's copy: the picker must not echo it back
        if decision.session is not None:
            for i in reversed(range(len(entries))):
                if entries[i].key.lower() == session_header:
                    del entries[i]  # present but empty: the EPP would ignore it anyway
            entries.append(
                base_pb2.HeaderValue(key=session_header, raw_value=decision.session.encode())
            )
        if decision.body is not None:
            for entry in entries:
                if entry.key.lower() == "content-length":
                    entry.raw_value, entry.value = str(len(decision.body)).encode(), ""
            # The rewritten body, in chunks no bigger than gRPC's default message limit
            # allows (the picker's server keeps it); the last one ends the stream unless
            # trailers follow.
            end = not self.tail
            pieces = [
                decision.body[i : i + _CHUNK_BYTES]
                for i in range(0, len(decision.body), _CHUNK_BYTES)
            ] or [b""]
            self.chunks = [
                pb.ProcessingRequest(
                    request_body=pb.HttpBody(body=piece, end_of_stream=end and i == len(pieces) - 1)
                )
                for i, piece in enumerate(pieces)
            ]
        return self.release()

    def release(self) -> list[Any]:
        """Stop inspecting; return what was held, in order, and free its budget."""
        out = ([self.held] if self.held is not None else []) + self.chunks + self.tail
        self.budget.give(self.share_key, self.charged)
        self.held, self.chunks, self.tail, self.size, self.charged = None, [], [], 0, 0
        self.scan = JsonScan()
        self.active = False
        return out


def too_large(size: int, limit: int) -> FrontError:
    """The front's 413, said at the gateway (what the front would answer anyway)."""
    return FrontError(
        413,
        front_errors.REQUEST_TOO_LARGE,
        f"the request body has at least {size} bytes; this server accepts at most {limit}. "
        "Send prompt embeddings the server has seen by identifier instead of inline",
    )


def busy() -> FrontError:
    return FrontError(
        503,
        front_errors.FRONT_OVERLOADED,
        "the gateway is holding as many request bytes as it may; retry shortly",
    )


def parse_too_large(need: int, limit: int) -> FrontError:
    return FrontError(
        413,
        front_errors.REQUEST_TOO_LARGE,
        f"the request needs about {need} bytes of working memory to be checked at the "
        f"gateway (its body, parsed and re-encoded); the gateway gives one client at most "
        f"{limit}",
    )


def body_timeout(seconds: float) -> FrontError:
    """The front's 408 for a body that arrives too slowly."""
    return FrontError(
        408,
        front_errors.BODY_TIMEOUT,
        f"the request body did not arrive within {seconds:g} seconds",
    )


def ended_early() -> FrontError:
    return FrontError(
        400,
        front_errors.INVALID_JSON,
        "the request ended before its body did (the stream closed mid-body)",
    )


def protocol_error(kind: str | None) -> FrontError:
    log.error("refused a request: the gateway sent %s while its body was incomplete", kind)
    return internal_error()


def internal_error() -> FrontError:
    """The front's 500 (its very message): the step failed, so it refuses (fails closed)."""
    return front_errors.internal_error()


def immediate(error: FrontError) -> Any:
    """The ext_proc answer that sends the front's error to the client directly."""
    headers = [("content-type", b"application/json")]
    if error.status == 503:
        headers.append(("retry-after", b"1"))
    headers.extend((k.lower(), v.encode()) for k, v in error.headers.items())
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=error.status),
            headers=pb.HeaderMutation(
                set_headers=[
                    base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=k, raw_value=v))
                    for k, v in headers
                ]
            ),
            body=error.body_bytes(),
            details=error.code,
        )
    )


class _AccountHeader:
    """Puts the step's decision about the account onto the picker's answer to the request
    headers: the gateway removes a client's attestation header and, when the step read an
    account, sets the signed one (removals apply before sets in Envoy's ext_proc), so the
    model-server pod receives exactly the step's. Done here, not through the picker's echo
    of request headers, so it holds whatever the picker echoes."""

    def __init__(self) -> None:
        self.decision: Decision | None = None
        self._done = False

    def onto(self, response: Any) -> Any:
        decision = self.decision
        if self._done or decision is None or not decision.salted:
            return response
        if response.WhichOneof("response") != "request_headers":
            return response
        self._done = True
        mutation = response.request_headers.response.header_mutation
        mutation.remove_headers.append(IDENTITY_ATTESTATION_HEADER)
        if decision.attestation is not None:
            mutation.set_headers.append(
                base_pb2.HeaderValueOption(
                    header=base_pb2.HeaderValue(
                        key=IDENTITY_ATTESTATION_HEADER, raw_value=decision.attestation.encode()
                    ),
                    append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
                )
            )
        return response


class PolicyMetrics:
    """The step's own counters (served by `serve` on `--metrics-listen`)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.refusals = Counter(
            "promptcache_gateway_policy_refusals",
            "Requests the policy step answered itself, by error code",
            ["code"],
            registry=self.registry,
        )
        self.internal_errors = Counter(
            "promptcache_gateway_policy_internal_errors",
            "Failures inside the step, each answered with a refusal (it fails closed)",
            registry=self.registry,
        )
        self.fair_share_waits = Counter(
            "promptcache_gateway_policy_fair_share_waits",
            "Requests held back for their key's fair share while other keys were active "
            '(those refused instead are refusals{code="fair_share_exceeded"})',
            registry=self.registry,
        )
        self.fair_share_wait_seconds = Counter(
            "promptcache_gateway_policy_fair_share_wait_seconds",
            "Time requests spent waiting for their key's fair share",
            registry=self.registry,
        )
        self.deadlines = Counter(
            "promptcache_gateway_policy_deadlines",
            "Deadlines that fired, by deadline: body (a held request's body did not end "
            "within the body timeout; 408, and what it held is freed)",
            ["deadline"],
            registry=self.registry,
        )
        self.share_refusals = Counter(
            "promptcache_gateway_policy_tenant_share_refusals",
            "Requests refused (429 tenant_share_exceeded) because their client identity held "
            "its share of the step's budget for request bodies",
            registry=self.registry,
        )
        self.decided = Counter(
            "promptcache_gateway_policy_decided",
            "Requests decided and forwarded to the picker",
            registry=self.registry,
        )

    def waited_for_share(self, seconds: float) -> None:
        self.fair_share_waits.inc()
        self.fair_share_wait_seconds.inc(seconds)

    def refused(self, error: FrontError) -> None:
        self.refusals.labels(code=error.code).inc()

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


def _forwarded_metadata(context: grpc.aio.ServicerContext[Any, Any]) -> list[tuple[str, Any]]:
    """The gateway's call metadata minus what gRPC itself sets per hop."""
    out: list[tuple[str, Any]] = []
    for key, value in context.invocation_metadata() or ():
        if key.startswith((":", "grpc-")) or key in _NOT_FORWARDED_METADATA:
            continue
        out.append((key, value))
    return out


class GatewayPolicyServicer(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """Relays ext_proc streams to the picker after applying the gateway's policy."""

    def __init__(
        self,
        settings: GatewayPolicySettings,
        channel: grpc.aio.Channel,
        secret: bytes | None = None,
    ) -> None:
        self.settings = settings
        self.policy = settings.policy()
        self.secret = secret
        self._stub = pb_grpc.ExternalProcessorStub(channel)
        self.budget = _budget(settings.worker_budget, settings.tenant_share_percent)
        self.metrics = PolicyMetrics()
        self.share = FairShare(
            settings.fair_share_bytes_per_second, on_wait=self.metrics.waited_for_share
        )
        self._processes: ProcessPoolExecutor | None = None
        self.attester = (
            Attester(secret, self.policy.isolation_header)
            if secret is not None and identity_enabled(self.policy)
            else None
        )

    def _pool(self) -> ProcessPoolExecutor:
        """Worker processes for large bodies, started on first use (spawned: no fork of a
        process running gRPC). Parsing in a thread would hold this process's GIL for
        seconds; in a worker it costs only CPU, and other tenants keep being routed."""
        if self._processes is None:
            self._processes = ProcessPoolExecutor(
                max_workers=_DECIDE_WORKERS,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=os.nice,
                initargs=(_WORKER_NICENESS,),
            )
        return self._processes

    def close(self) -> None:
        if self._processes is not None:
            self._processes.shutdown(wait=False, cancel_futures=True)
            self._processes = None

    @staticmethod
    def _head(inspector: _Inspector) -> tuple[str, str, CIMultiDict[str]]:
        """The held request's method, target and headers, as aiohttp would present them."""
        entries = inspector.headers()
        pseudo = {k: v.decode("utf-8", "surrogateescape") for k, v in entries if k[:1] == ":"}
        method, target = pseudo.get(":method", "POST"), pseudo.get(":path", "")
        return method, target, header_multidict((k, v) for k, v in entries if k[:1] != ":")

    async def _decide(self, inspector: _Inspector) -> Decision:
        method, target, headers = self._head(inspector)
        raw = inspector.body()
        if self.share.enabled:
            self.share.charge(inspector.share_key, inspector.scan.charge)
        cost = inspector.scan.charge + len(raw)  # `decide_cost`, counted as the body came
        refusal = inspector.take(cost)
        if refusal is not None:
            return Decision(refusal=refusal)
        run = functools.partial(
            decide, method, target, headers, raw, policy=self.policy, secret=self.secret,
            session_header=self.settings.session_header, user_field=self.settings.user_field,
            attester=self.attester,
        )  # fmt: skip
        if inspector.scan.work().off_loop:
            # Large or dense: in a worker process, on a bounded pool, by the C parser (no
            # GIL to share there); other streams keep being routed meanwhile.
            try:
                return await asyncio.get_running_loop().run_in_executor(self._pool(), run)
            except BrokenProcessPool:
                self._processes = None  # a worker died (killed, out of memory): a new pool
                raise
        return run()

    def _failed(self, error: BaseException) -> FrontError:
        """Fail closed: an exception inside the step is a refusal, logged and counted."""
        log.error("the gateway policy step failed on a request; refused it", exc_info=error)
        self.metrics.internal_errors.inc()
        return internal_error()

    async def _next(self, incoming: AsyncIterator[Any], inspector: _Inspector) -> Any:
        """The gateway's next message; a held body must end within the body timeout."""
        if not inspector.holding:
            return await anext(incoming)
        remaining = inspector.deadline - asyncio.get_running_loop().time()
        async with asyncio.timeout(max(remaining, 0)):
            return await anext(incoming)

    async def _advance(
        self, incoming: AsyncIterator[Any], inspector: _Inspector, account: _AccountHeader
    ) -> list[Any] | FrontError | None:
        """Read one message from the gateway: what to forward now (nothing while a request
        is held; the decided request once its body ended), the refusal to answer with, or
        None when the gateway half-closed. Every request is decided before anything of it
        is forwarded; a failure is a refusal."""
        try:
            msg = await self._next(incoming, inspector)
        except StopAsyncIteration:
            return ended_early() if inspector.holding else None  # never undecided
        except TimeoutError:
            self.metrics.deadlines.labels(deadline="body").inc()
            return body_timeout(self.settings.body_timeout_seconds)
        try:
            was_holding = inspector.holding
            forward = inspector.feed(msg)
            if inspector.holding and not was_holding:
                inspector.share_key = step_identity(inspector.headers(), self.policy)
                refusal = (
                    self._head_refused(inspector)
                    or self._over_share(inspector)
                    or await self._fair_share(inspector)
                )
                if refusal is not None:
                    return refusal
                loop = asyncio.get_running_loop()
                inspector.deadline = loop.time() + self.settings.body_timeout_seconds
            if forward is None:
                decision = await self._decide(inspector)
                if decision.refusal is not None:
                    return decision.refusal
                account.decision = decision
                forward = inspector.apply(decision, self.settings.session_header)
                self.metrics.decided.inc()
            return forward
        except Exception as error:
            return self._failed(error)

    def _head_refused(self, inspector: _Inspector) -> FrontError | None:
        """The front's refusal of the request's head (`check_head`), before its body is
        held: a bad header costs the step no body bytes and no one's fair share."""
        try:
            check_head(*self._head(inspector))
        except FrontError as refusal:
            return refusal
        return None

    def _over_share(self, inspector: _Inspector) -> FrontError | None:
        """The share refusal (429) on a request's headers, when its client already holds more
        than its share of the budget while others hold some, or taking the body its
        Content-Length announces would (`tenancy.shares`, `declared_length`): that body would
        be refused anyway, so it is never received.

        Why on the headers: refused at its first body message, an over-share client had sent
        that message whole first, and gRPC had received, copied and parsed it (a 4 MiB piece
        per retry under `bench/hostile_load.py --attacks hold`, CPU and memory the
        well-behaved tenants' requests waited behind). The front charges a declared body on
        its head too (`front.body.read_body`). A body with no Content-Length (chunked) is
        still refused at its first message, as before. A request whose headers end it holds
        no body and is not checked."""
        if inspector.held.request_headers.end_of_stream:
            return None
        budget, key = self.budget, inspector.share_key
        if budget.check(key, declared_length(inspector.headers())) is not Verdict.OVER_SHARE:
            return None
        return share_refusal("budget for request bodies", budget.held(key), budget.share, "bytes")

    async def _fair_share(self, inspector: _Inspector) -> FrontError | None:
        """Before a held request's body is read: wait while its key owes this process
        decoding work (`tenancy.fair_share`), or refuse it (429) when too many of its
        requests already wait. The body's timeout starts after the wait."""
        if not self.share.enabled:
            return None
        key = inspector.share_key
        self.share.seen(key)
        refusal = await self.share.admit(key)
        return None if refusal is None else share_exceeded(refusal)

    def _refused(self, refusal: FrontError, inspector: _Inspector) -> None:
        inspector.release()
        self.metrics.refused(refusal)
        if refusal.code == front_errors.TENANT_SHARE_EXCEEDED:
            self.metrics.share_refusals.inc()

    async def Process(  # noqa: N802 - the gRPC method name
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        inspector = _Inspector(self.settings.max_body_bytes, self.budget)
        incoming = aiter(request_iterator)
        account = _AccountHeader()
        try:
            # The picker is dialled only once there is something to ask it: a request the
            # step answers itself never reaches it. Nothing else reads from the gateway
            # meanwhile, so no read is pending when a refusal's status goes out (that would
            # turn it into INTERNAL).
            first: list[Any] = []
            while not first:
                step = await self._advance(incoming, inspector, account)
                if step is None:
                    return
                if isinstance(step, FrontError):
                    self._refused(step, inspector)
                    yield immediate(step)
                    return
                first = step
            async for response in self._relay(first, incoming, inspector, account, context):
                yield account.onto(response)
        finally:
            inspector.release()

    async def _pump(
        self,
        first: list[Any],
        incoming: AsyncIterator[Any],
        inspector: _Inspector,
        account: _AccountHeader,
        call: Any,
    ) -> None:
        """Gateway → picker, in order, written straight into the picker's call (no queue, no
        request iterator: each costs a task and a hand-over per message). A refusal after
        the picker was dialled is never forwarded: the picker's side is half-closed."""
        try:
            for item in first:
                await call.write(item)
            while (step := await self._advance(incoming, inspector, account)) is not None:
                if isinstance(step, FrontError):
                    self._refused(step, inspector)
                    break
                for item in step:
                    await call.write(item)
            await call.done_writing()
        except BaseException:
            # Reading from the gateway (or writing to a picker that ended) failed: the
            # picker's side must not wait for more; its status, if any, is reported.
            call.cancel()
            raise

    async def _relay(
        self,
        first: list[Any],
        incoming: AsyncIterator[Any],
        inspector: _Inspector,
        account: _AccountHeader,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[Any]:
        call = self._stub.Process(
            metadata=_forwarded_metadata(context), timeout=context.time_remaining()
        )
        pump = asyncio.create_task(self._pump(first, incoming, inspector, account, call))
        failed: grpc.aio.AioRpcError | None = None
        try:
            async for response in call:
                yield response
        except grpc.aio.AioRpcError as error:
            failed = error
        finally:
            call.cancel()
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pump
        if failed is not None:
            # The picker's own verdict (or UNAVAILABLE when it is down) ends the gateway's
            # stream as it is, so the gateway's failure mode applies unchanged.
            await context.abort(failed.code(), failed.details() or "")


@dataclass
class RunningGatewayPolicy:
    """A started policy step: where it listens, and how to stop it."""

    server: grpc.aio.Server
    channel: grpc.aio.Channel
    servicer: GatewayPolicyServicer
    port: int

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self, grace_s: float | None = None) -> None:
        """Refuse new streams, let open ones finish for `grace_s`, then close."""
        grace = self.servicer.settings.drain_seconds if grace_s is None else grace_s
        await self.server.stop(grace)
        await self.channel.close()
        self.servicer.close()


async def start(
    settings: GatewayPolicySettings, secret: bytes | None = None, *, reuse_port: bool = False
) -> RunningGatewayPolicy:
    """Bind `settings.listen` (port 0 picks a free one) and relay to `settings.upstream`.

    `secret`: the salt HMAC key (`tenancy.settings.read_salt_key`), needed by salting modes.
    `reuse_port`: one of `settings.workers` processes sharing the port (`gateway.workers`,
    which also keeps a second step off it)."""
    if secret is None and needs_salt_key(settings.isolation_mode):
        raise ValueError(f"isolation mode {settings.isolation_mode.value} needs the salt key")
    # Plain gRPC: the picker is on the pod's loopback (docs/endpoint-picker.md, 'Transport').
    channel = grpc.aio.insecure_channel(settings.upstream)
    servicer = GatewayPolicyServicer(settings, channel, secret)
    # No SO_REUSEPORT unless the step's own workers share the port: a second policy step on
    # the port must fail, not take half the streams.
    server = grpc.aio.server(options=[("grpc.so_reuseport", int(reuse_port))])
    pb_grpc.add_ExternalProcessorServicer_to_server(servicer, server)
    try:
        port = server.add_insecure_port(settings.listen)
    except RuntimeError:
        port = 0
    if port == 0:
        await channel.close()
        raise OSError(f"cannot listen on {settings.listen}")
    await server.start()
    return RunningGatewayPolicy(server, channel, servicer, port)


async def _serve(
    settings: GatewayPolicySettings, secret: bytes | None, signals: Sequence[signal.Signals]
) -> None:
    running = await start(settings, secret)
    if settings.metrics_listen:
        host, port = split_host_port("--metrics-listen", settings.metrics_listen)
        start_http_server(port, addr=host, registry=running.servicer.metrics.registry)
    log.info(
        "gateway policy step listening on %s (port %d), relaying ext_proc to the Endpoint "
        "Picker at %s; isolation %s (header %r, field %r); session header %r from "
        "prompt_cache_key or body field %r when absent; bodies up to %d bytes (%d bytes for "
        "all requests)",
        settings.listen, running.port, settings.upstream, settings.isolation_mode.value,
        settings.isolation_header, settings.isolation_field, settings.session_header,
        settings.user_field, settings.max_body_bytes, settings.max_buffered_bytes,
    )  # fmt: skip
    stopping = stop_event(signals)
    try:
        await stopping.wait()
    finally:
        log.info(
            "gateway policy step stopping: draining open streams for %ss", settings.drain_seconds
        )
        await running.stop()
        log.info("gateway policy step stopped")


def serve(settings: GatewayPolicySettings, secret: bytes | None = None) -> int:
    """Run until SIGTERM or SIGINT, then drain; the `gateway-policy` sub-command's body."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        asyncio.run(_serve(settings, secret, STOP_SIGNALS))
    except OSError as error:
        log.error("gateway policy step cannot start: %s", error)
        return 1
    return 0

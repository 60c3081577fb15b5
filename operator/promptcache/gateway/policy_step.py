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

This module is the per-stream pipeline (`GatewayPolicyServicer`); its pieces, on the cache
front's seams: the decision (`gateway.decision`), holding the body (`gateway.body`), the
refusals (`gateway.refusals`), the counters (`gateway.metrics`) and the server
(`gateway.server`, where `start` and `serve` live).

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
from collections.abc import AsyncIterator
from concurrent.futures import Executor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Final

import grpc
import grpc.aio
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from multidict import CIMultiDict

from promptcache.contract import (
    IDENTITY_ATTESTATION_HEADER,
)
from promptcache.gateway.body import Inspector, body_budget, declared_length
from promptcache.gateway.decision import Decision, check_head, decide, step_identity
from promptcache.gateway.metrics import PolicyMetrics
from promptcache.gateway.refusals import ended_early, immediate
from promptcache.gateway.settings import GatewayPolicySettings
from promptcache.runtime.refusals import body_timeout, internal_error
from promptcache.runtime.spawn import SpawnPool
from promptcache.tenancy import errors as front_errors
from promptcache.tenancy.attestation import Attester
from promptcache.tenancy.canonical import (
    header_multidict,
)
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.fair_share import FairShare, share_exceeded
from promptcache.tenancy.identity import identity_enabled
from promptcache.tenancy.shares import Verdict, share_refusal

log = logging.getLogger("promptcache.gateway_policy")

_DECIDE_WORKERS: Final[int] = 2
"""Worker processes deciding large bodies: bounded, so a burst cannot take every core."""
_NOT_FORWARDED_METADATA: Final[frozenset[str]] = frozenset(
    {"content-type", "te", "user-agent", "host", "content-length", "accept-encoding"}
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
        self.budget = body_budget(settings.worker_budget, settings.tenant_share_percent)
        self.metrics = PolicyMetrics()
        self.share = FairShare(
            settings.fair_share_bytes_per_second, on_wait=self.metrics.waited_for_share
        )
        self.workers = SpawnPool(_DECIDE_WORKERS)
        self.attester = (
            Attester(secret, self.policy.isolation_header)
            if secret is not None and identity_enabled(self.policy)
            else None
        )

    def _pool(self) -> Executor:
        """Worker processes for large bodies (`runtime.spawn.SpawnPool`: started on first use,
        spawned, bounded, nicer than the loop). Parsing in a thread would hold this process's
        GIL for seconds; in a worker it costs only CPU, and other tenants keep being routed."""
        return self.workers.executor()

    def close(self) -> None:
        self.workers.drop()

    @staticmethod
    def _head(inspector: Inspector) -> tuple[str, str, CIMultiDict[str]]:
        """The held request's method, target and headers, as aiohttp would present them."""
        entries = inspector.headers()
        pseudo = {k: v.decode("utf-8", "surrogateescape") for k, v in entries if k[:1] == ":"}
        method, target = pseudo.get(":method", "POST"), pseudo.get(":path", "")
        return method, target, header_multidict((k, v) for k, v in entries if k[:1] != ":")

    async def _decide(self, inspector: Inspector) -> Decision:
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
                self.workers.drop()  # a worker died (killed, out of memory): a new pool
                raise
        return run()

    def _failed(self, error: BaseException) -> FrontError:
        """Fail closed: an exception inside the step is a refusal, logged and counted."""
        log.error("the gateway policy step failed on a request; refused it", exc_info=error)
        self.metrics.internal_errors.inc()
        return internal_error()

    async def _next(self, incoming: AsyncIterator[Any], inspector: Inspector) -> Any:
        """The gateway's next message; a held body must end within the body timeout."""
        if not inspector.holding:
            return await anext(incoming)
        remaining = inspector.deadline - asyncio.get_running_loop().time()
        async with asyncio.timeout(max(remaining, 0)):
            return await anext(incoming)

    async def _advance(
        self, incoming: AsyncIterator[Any], inspector: Inspector, account: _AccountHeader
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

    def _head_refused(self, inspector: Inspector) -> FrontError | None:
        """The front's refusal of the request's head (`check_head`), before its body is
        held: a bad header costs the step no body bytes and no one's fair share."""
        try:
            check_head(*self._head(inspector))
        except FrontError as refusal:
            return refusal
        return None

    def _over_share(self, inspector: Inspector) -> FrontError | None:
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

    async def _fair_share(self, inspector: Inspector) -> FrontError | None:
        """Before a held request's body is read: wait while its key owes this process
        decoding work (`tenancy.fair_share`), or refuse it (429) when too many of its
        requests already wait. The body's timeout starts after the wait."""
        if not self.share.enabled:
            return None
        key = inspector.share_key
        self.share.seen(key)
        refusal = await self.share.admit(key)
        return None if refusal is None else share_exceeded(refusal)

    def _refused(self, refusal: FrontError, inspector: Inspector) -> None:
        inspector.release()
        self.metrics.refused(refusal)
        if refusal.code == front_errors.TENANT_SHARE_EXCEEDED:
            self.metrics.share_refusals.inc()

    async def Process(  # noqa: N802 - the gRPC method name
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        inspector = Inspector(self.settings.max_body_bytes, self.budget)
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
        inspector: Inspector,
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
        inspector: Inspector,
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

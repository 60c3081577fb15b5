"""A recording stand-in Endpoint Picker and an Envoy-like gateway client, for the real
gateway policy step between them (its unit tests and bench/hostile_load.py).

The stand-in is at the system boundary (the EPP is not this project's code): a gRPC
ExternalProcessor on 127.0.0.1 that records every message it receives and, like the EPP,
answers the request body with a header mutation echoing the session header it saw. The
policy step is the product module, started on a kernel-chosen loopback port.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from promptcache.gateway.server import RunningGatewayPolicy
from promptcache.tenancy.canonical import encode_body

SESSION = "x-session-affinity"
ECHO = "x-seen-session"
"""What the stand-in answers with: the session header value it received, or `-`."""
TIMEOUT = 30.0

GatewayPolicyFactory = Callable[..., Awaitable[RunningGatewayPolicy]]
"""The `make_gateway_policy` fixture (tests/gateway/conftest.py): settings overrides in, a
running policy step out."""
JSON = {"content-type": "application/json"}
"""What a gateway sends with a JSON body (the front refuses one without it)."""


def canonical(raw: bytes) -> bytes:
    """The body the step forwards for a JSON body it accepts: its canonical encoding."""
    return encode_body(json.loads(raw))


@dataclass
class Stream:
    """One stream as the stand-in saw it."""

    received: list[Any] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    peer: str = ""
    """Who dialled: the policy step's connection (one per step process)."""
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    def headers(self) -> list[tuple[str, str]]:
        first = self.received[0]
        assert first.WhichOneof("request") == "request_headers", first
        return [
            (h.key, (h.raw_value or h.value.encode()).decode())
            for h in first.request_headers.headers.headers
        ]

    def session(self) -> list[str]:
        return [v for k, v in self.headers() if k == SESSION]


class FakeEpp(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """Records each stream; answers every message at once (so streaming is visible)."""

    def __init__(self) -> None:
        self.streams: list[Stream] = []
        self.abort_with: tuple[grpc.StatusCode, str] | None = None
        """Fail each stream at once with this status."""
        self.abort_after_body: tuple[grpc.StatusCode, str] | None = None
        """Fail each stream with this status once the whole request body has arrived."""

    async def Process(  # noqa: N802 - the gRPC method name
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        stream = Stream(
            metadata={k: str(v) for k, v in context.invocation_metadata() or ()},
            peer=context.peer(),
        )
        self.streams.append(stream)
        if self.abort_with is not None:
            await context.abort(*self.abort_with)
        seen = "-"
        try:
            async for msg in request_iterator:
                stream.received.append(msg)
                kind = msg.WhichOneof("request")
                if kind == "request_headers":
                    seen = next(
                        (
                            (h.raw_value or h.value.encode()).decode()
                            for h in msg.request_headers.headers.headers
                            if h.key == SESSION
                        ),
                        "-",
                    )
                    yield pb.ProcessingResponse(request_headers=pb.HeadersResponse())
                elif kind == "request_body":
                    if self.abort_after_body and msg.request_body.end_of_stream:
                        await context.abort(*self.abort_after_body)
                    mutation = pb.HeaderMutation(
                        set_headers=[
                            base_pb2.HeaderValueOption(
                                header=base_pb2.HeaderValue(key=ECHO, raw_value=seen.encode())
                            )
                        ]
                    )
                    yield pb.ProcessingResponse(
                        request_body=pb.BodyResponse(
                            response=pb.CommonResponse(header_mutation=mutation)
                        )
                    )
                elif kind == "response_headers":
                    yield pb.ProcessingResponse(response_headers=pb.HeadersResponse())
                elif kind == "response_body":
                    yield pb.ProcessingResponse(response_body=pb.BodyResponse())
        finally:
            stream.ended.set()


@dataclass
class Upstream:
    fake: FakeEpp
    server: grpc.aio.Server
    port: int

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


async def start_upstream(port: int = 0) -> Upstream:
    fake = FakeEpp()
    server = grpc.aio.server()
    pb_grpc.add_ExternalProcessorServicer_to_server(fake, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return Upstream(fake, server, bound)


def headers_msg(headers: Mapping[str, str], end_of_stream: bool = False) -> Any:
    base = {":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json"}
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=k, raw_value=v.encode())
                    for k, v in {**base, **headers}.items()
                ]
            ),
            end_of_stream=end_of_stream,
        )
    )


def body_msg(raw: bytes, end_of_stream: bool = True) -> Any:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=raw, end_of_stream=end_of_stream))


def chat(user: Any = None, pad: int = 0) -> bytes:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x" * pad}]}
    if user is not None:
        body["user"] = user
    return json.dumps(body).encode()


class Gateway:
    """The gateway's side: a bidirectional stream whose messages the test sends one by one."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.aio.insecure_channel(target)
        self.stub = pb_grpc.ExternalProcessorStub(self.channel)

    def open(self, metadata: Any = None) -> Any:
        return self.stub.Process(metadata=metadata, timeout=TIMEOUT)

    async def exchange(self, *messages: Any) -> list[Any]:
        """Send the messages while reading the answers (Envoy's full-duplex ext_proc does
        both at once), half-close, and return every response.

        A step that refuses at the headers answers and ends the stream while the body is
        still on its way. Envoy then stops sending, and so does this: a write on a stream
        the server has ended ends the sending. gRPC's Python client, when that write is
        already under way as the server's status arrives, records a status of its own making
        (`INTERNAL`, "Internal error from Core": its `set_internal_error`) in place of the
        server's, though the server's answer was received; a CI run failed a hostile-corpus
        case on it (1 exchange in about 1,000 on a busy machine). So that one status, on a
        stream whose sending the server cut short, is not the server's error when the server
        had answered with a final response; the answer read is returned. Any other error
        status, or that one without a final answer, is raised."""
        call = self.open()
        responses: list[Any] = []

        async def read_all() -> None:
            async for response in call:
                responses.append(response)

        reader = asyncio.create_task(read_all())
        try:
            cut_short = await self._send_all(call, messages)
            try:
                await reader
            except grpc.aio.AioRpcError as error:
                lost_status = cut_short and error.code() is grpc.StatusCode.INTERNAL
                if not (lost_status and ends_with_immediate(responses)):
                    raise
            return responses
        finally:
            if not reader.done():
                call.cancel()
                await asyncio.gather(reader, return_exceptions=True)

    @staticmethod
    async def _send_all(call: Any, messages: tuple[Any, ...]) -> bool:
        """Write each message, then half-close; True when the server ended the stream
        before every message was written (the rest are not sent)."""
        for m in messages:
            if call.done():
                return True
            try:
                await call.write(m)
            except (asyncio.InvalidStateError, grpc.aio.AioRpcError):
                if not call.done():
                    raise
                return True
        await call.done_writing()
        return False

    async def close(self) -> None:
        await self.channel.close()


def ends_with_immediate(responses: list[Any]) -> bool:
    """The stream's last answer is a final one (an ImmediateResponse: a refusal)."""
    return bool(responses) and responses[-1].WhichOneof("response") == "immediate_response"


async def read_rest(call: Any) -> list[Any]:
    """Every remaining response, read with `read()` (gRPC forbids mixing it with `async for`)."""
    out = []
    while (r := await asyncio.wait_for(call.read(), TIMEOUT)) is not grpc.aio.EOF:
        out.append(r)
    return out


def echoed(responses: list[Any]) -> str | None:
    for r in responses:
        if r.WhichOneof("response") == "request_body":
            for opt in r.request_body.response.header_mutation.set_headers:
                if opt.header.key == ECHO:
                    return str(opt.header.raw_value.decode())
    return None


def envoy_applies(sent: list[tuple[str, str]], responses: list[Any]) -> list[tuple[str, str]]:
    """The request headers Envoy sends upstream after an ext_proc exchange: the client's,
    with each answer's header mutation applied as Envoy's ext_proc filter applies it
    (`mutation_utils.cc`): removals first, then sets; a set replaces every value of its
    header unless it asks to append (`append: true`) or only to add when absent."""
    headers = [(k.lower(), v) for k, v in sent if not k.startswith(":")]
    for r in responses:
        kind = r.WhichOneof("response")
        if kind == "request_headers":
            mutation = r.request_headers.response.header_mutation
        elif kind == "request_body":
            mutation = r.request_body.response.header_mutation
        else:
            continue
        for name in mutation.remove_headers:
            headers = [(k, v) for k, v in headers if k != name.lower()]
        for opt in mutation.set_headers:
            key = opt.header.key.lower()
            value = (opt.header.raw_value or opt.header.value.encode()).decode()
            present = any(k == key for k, _ in headers)
            action = opt.append_action
            if action == base_pb2.HeaderValueOption.ADD_IF_ABSENT:
                if not present:
                    headers.append((key, value))
            elif opt.HasField("append") and opt.append.value:
                headers.append((key, value))
            elif action == base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS and not present:
                continue
            else:
                headers = [(k, v) for k, v in headers if k != key] + [(key, value)]
    return headers


def request_msg(headers: list[tuple[str, str]], path: str = "/v1/chat/completions") -> Any:
    """Request headers as the gateway sends them, repeated names kept (`headers_msg` takes a
    mapping)."""
    base = [(":method", "POST"), (":path", path), ("content-type", "application/json")]
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in base + headers
                ]
            )
        )
    )


def forwarded_body(stream: Stream) -> bytes:
    """The body the policy step forwarded on a stream (what the picker hands the gateway)."""
    return b"".join(
        m.request_body.body for m in stream.received if m.WhichOneof("request") == "request_body"
    )

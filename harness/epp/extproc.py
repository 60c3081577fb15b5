"""The gateway's side of the ext_proc conversation with the Endpoint Picker.

Envoy-based gateways ask the EPP where to send a request over a bidirectional
`envoy.service.ext_proc.v3.ExternalProcessor/Process` stream: request headers,
then the buffered body with `end_of_stream`, and the EPP answers with a header
mutation that sets `x-gateway-destination-endpoint`. This client plays that part
exactly, over plaintext gRPC on loopback, so tests see the EPP's real decision.
"""

from __future__ import annotations

import json
import queue
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

DESTINATION_HEADER = "x-gateway-destination-endpoint"
REQUEST_ID_HEADER = "x-request-id"


@dataclass
class Pick:
    """What the EPP decided for one request."""

    endpoint: str | None
    """`ip:port` from x-gateway-destination-endpoint (first of a fallback list), or None."""
    set_headers: dict[str, str] = field(default_factory=dict)
    """Every header the EPP asked the gateway to set on the upstream request."""
    immediate_status: int | None = None
    """HTTP status when the EPP answered the client itself (e.g. 429, 503, 400)."""
    immediate_body: str = ""
    body: bytes = b""
    """The request body the picker hands back to the gateway for the model server."""
    sent_headers: list[tuple[str, str]] = field(default_factory=list)
    """The request headers the gateway sent (pseudo-headers included)."""
    responses: list[pb.ProcessingResponse] = field(default_factory=list)
    """Every answer up to the body's, for applying their mutations as Envoy does
    (`harness.extproc_gateway.envoy_applies`)."""


def _header_map(headers: Mapping[str, str]) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(
        headers=[
            base_pb2.HeaderValue(key=k.lower(), raw_value=v.encode()) for k, v in headers.items()
        ]
    )


def _value(h: base_pb2.HeaderValue) -> str:
    return str(h.raw_value.decode() if h.raw_value else h.value)


class ExtProcClient:
    """An ext_proc client for one gRPC port on loopback: plaintext, or TLS without
    verification (what gateways do with a picker's self-signed certificate)."""

    def __init__(self, target: str, timeout_s: float = 30.0, tls: bool = False) -> None:
        self._relay = None
        if tls:
            from .tls_relay import TlsRelay  # noqa: PLC0415 - process.py imports this module

            self._relay = TlsRelay(int(target.rsplit(":", 1)[1]))
            target = self._relay.target
        self._channel = grpc.insecure_channel(target)
        self._stub = pb_grpc.ExternalProcessorStub(self._channel)
        self._timeout = timeout_s

    def close(self) -> None:
        self._channel.close()
        if self._relay is not None:
            self._relay.close()

    def __enter__(self) -> ExtProcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _relayed(self, responses: Any) -> Iterator[pb.ProcessingResponse]:
        """The picker's answers; through the TLS relay, a transport failure names its cause
        (grpcio alone says only `Socket closed`, see tls_relay.py)."""
        try:
            yield from responses
        except grpc.RpcError as error:
            reason = self._relay.last_error if self._relay is not None else None
            if reason is None:
                raise
            raise ConnectionError(f"{error.details()} ({reason})") from error

    def pick(  # noqa: C901 - one ext_proc exchange, step by step
        self,
        body: Mapping[str, Any] | bytes | None,
        headers: Mapping[str, str] | None = None,
        path: str = "/v1/chat/completions",
        method: str = "POST",
    ) -> Pick:
        """Send one request's headers and buffered body (None: a request without one, such
        as a GET, whose headers end the stream); return the processor's decision."""
        raw = (
            None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
        )
        all_headers = {
            ":method": method,
            ":path": path,
            ":authority": "gateway.local",
            ":scheme": "http",
            REQUEST_ID_HEADER: str(uuid.uuid4()),
        }
        if raw is not None:
            all_headers.update(
                {"content-type": "application/json", "content-length": str(len(raw))}
            )
        all_headers.update({k.lower(): v for k, v in (headers or {}).items()})

        outbox: queue.Queue[pb.ProcessingRequest | None] = queue.Queue()
        outbox.put(
            pb.ProcessingRequest(
                request_headers=pb.HttpHeaders(
                    headers=_header_map(all_headers), end_of_stream=raw is None
                )
            )
        )
        if raw is not None:
            outbox.put(pb.ProcessingRequest(request_body=pb.HttpBody(body=raw, end_of_stream=True)))

        def requests() -> Iterator[pb.ProcessingRequest]:
            # Keep the stream open until the answer arrived: a half-close before the
            # EPP replied would read as the client going away.
            while True:
                item = outbox.get(timeout=self._timeout)
                if item is None:
                    return
                yield item

        result = Pick(endpoint=None, sent_headers=list(all_headers.items()))
        responses = self._stub.Process(requests(), timeout=self._timeout)
        try:
            for resp in self._relayed(responses):
                result.responses.append(resp)
                kind = resp.WhichOneof("response")
                if kind == "immediate_response":
                    result.immediate_status = int(resp.immediate_response.status.code)
                    result.immediate_body = resp.immediate_response.body.decode(errors="replace")
                    break
                common = None
                if kind == "request_headers":
                    common = resp.request_headers.response
                elif kind == "request_body":
                    common = resp.request_body.response
                if common is not None:
                    for hvo in common.header_mutation.set_headers:
                        result.set_headers[hvo.header.key.lower()] = _value(hvo.header)
                    mutation = common.body_mutation
                    if mutation.WhichOneof("mutation") == "body":
                        result.body += mutation.body
                    elif mutation.WhichOneof("mutation") == "streamed_response":
                        result.body += mutation.streamed_response.body
                if raw is None and kind == "request_headers":
                    break
                if kind == "request_body":
                    # A streamed body comes back in chunks (GIE cuts at 62,000 bytes): the
                    # last one says end_of_stream.
                    mutation = resp.request_body.response.body_mutation
                    streamed = mutation.WhichOneof("mutation") == "streamed_response"
                    if not streamed or mutation.streamed_response.end_of_stream:
                        break
        finally:
            outbox.put(None)
            responses.cancel()
        dest = result.set_headers.get(DESTINATION_HEADER)
        if dest:
            result.endpoint = dest.split(",")[0].strip()
        return result


def chat_body(
    text: str,
    model: str = "test-model",
    cache_salt: str | None = None,
    user: str | None = None,
    history: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """An OpenAI chat-completions body; `history` is prepended (multi-turn)."""
    messages = [*(history or []), {"role": "user", "content": text}]
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": 16}
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    if user is not None:
        body["user"] = user
    return body

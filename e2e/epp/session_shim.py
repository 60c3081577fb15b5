"""How a body's `user` field reaches the Endpoint Picker: an ext_proc shim before it.

spec/004 lets clients name their session either in the `x-session-affinity`
header or in the body's `user` field. The EPP's session plugins read headers
(or attributes other plugins publish) only; no v0.10.0 plugin reads `user`.
The cache front copies `user` into the header, but it runs inside the pod, after
the EPP has already picked it: too late for routing. A Gateway API
RequestHeaderModifier cannot help either: it sets fixed values, it cannot read
a body.

So the copy has to happen on the ext_proc path itself, before the EPP decides.
This shim is a transparent ext_proc proxy that sits where the gateway dials the
EPP (the InferencePool's endpointPickerRef Service, e.g. as a second container
in the EPP pod): it holds the request headers until the body has arrived, and
when the session header is absent and the body carries a usable `user`, it adds
the header to the headers it forwards to the EPP. Every other message, both
ways, passes through unchanged. Because the EPP echoes the request headers it
saw in its header mutation, the model-server pod (and the cache front) then get
the same header.

This is the reference implementation the e2e tests prove against the real EPP;
see docs/endpoint-picker.md, "How a `user` field reaches the Endpoint Picker".
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

MAX_SESSION_ID_CHARS = 256
"""Longer `user` values are not used as a session (a header has to carry them)."""
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
"""Bodies larger than this are passed on unread (the EPP itself buffers them anyway)."""


def session_from_body(raw: bytes, field: str = "user") -> str | None:
    """The body's `user` as a session id, or None when absent or unusable in a header."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(body, dict):
        return None
    value = body.get(field)
    if not isinstance(value, str):
        return None
    value = value.strip()
    if not value or len(value) > MAX_SESSION_ID_CHARS:
        return None
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return None
    return value


def _has_header(msg: pb.ProcessingRequest, name: str) -> bool:
    return any(h.key.lower() == name for h in msg.request_headers.headers.headers)


class SessionShim(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """Relays ext_proc streams to the EPP, adding the session header from `user`."""

    def __init__(
        self,
        upstream: str,
        header: str = "x-session-affinity",
        field: str = "user",
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        timeout_s: float = 300.0,
    ) -> None:
        self._channel = grpc.insecure_channel(upstream)
        self._stub = pb_grpc.ExternalProcessorStub(self._channel)
        self.header = header.lower()
        self.field = field
        self.max_body_bytes = max_body_bytes
        self.timeout_s = timeout_s

    def close(self) -> None:
        self._channel.close()

    def _pump(
        self,
        incoming: Iterator[pb.ProcessingRequest],
        out: queue.Queue[pb.ProcessingRequest | None],
    ) -> None:
        held: pb.ProcessingRequest | None = None
        chunks: list[pb.ProcessingRequest] = []
        size = 0
        rewriting = True

        def flush() -> None:
            nonlocal held, chunks
            if held is not None:
                out.put(held)
            for c in chunks:
                out.put(c)
            held, chunks = None, []

        try:
            for msg in incoming:
                kind = msg.WhichOneof("request")
                if rewriting and kind == "request_headers":
                    if msg.request_headers.end_of_stream or _has_header(msg, self.header):
                        rewriting = False
                        out.put(msg)
                    else:
                        held = msg
                    continue
                if rewriting and held is not None and kind == "request_body":
                    chunks.append(msg)
                    size += len(msg.request_body.body)
                    if size > self.max_body_bytes:
                        rewriting = False
                        flush()
                    elif msg.request_body.end_of_stream:
                        raw = b"".join(c.request_body.body for c in chunks)
                        session = session_from_body(raw, self.field)
                        if session is not None:
                            held.request_headers.headers.headers.append(
                                base_pb2.HeaderValue(key=self.header, raw_value=session.encode())
                            )
                        rewriting = False
                        flush()
                    continue
                rewriting = False
                flush()
                out.put(msg)
        except grpc.RpcError:
            pass  # the gateway went away; closing the upstream stream below ends the call
        finally:
            flush()
            out.put(None)

    def Process(  # noqa: N802 - gRPC method name
        self, request_iterator: Iterator[pb.ProcessingRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.ProcessingResponse]:
        out: queue.Queue[pb.ProcessingRequest | None] = queue.Queue()
        threading.Thread(target=self._pump, args=(request_iterator, out), daemon=True).start()

        def upstream_requests() -> Iterator[pb.ProcessingRequest]:
            while True:
                item = out.get(timeout=self.timeout_s)
                if item is None:
                    return
                yield item

        responses = self._stub.Process(upstream_requests(), timeout=self.timeout_s)
        context.add_callback(responses.cancel)
        yield from responses


@dataclass
class RunningShim:
    """A started shim: where it listens, and how to stop it."""

    server: grpc.Server
    shim: SessionShim
    port: int

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop(5).wait(10)
        self.shim.close()


def serve(
    upstream: str,
    header: str = "x-session-affinity",
    listen: str = "127.0.0.1:0",
    workers: int = 16,
) -> RunningShim:
    """Start the shim on `listen` (port 0 picks a free one), relaying to the EPP at `upstream`."""
    shim = SessionShim(upstream, header)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    pb_grpc.add_ExternalProcessorServicer_to_server(shim, server)
    port = server.add_insecure_port(listen)
    server.start()
    return RunningShim(server, shim, port)

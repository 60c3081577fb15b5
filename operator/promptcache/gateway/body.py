"""Holding a request's headers until its body has arrived (`Inspector`), under the per-request
limit and the step's memory budget shared by client identity (`budget`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from promptcache.contract import (
    IDENTITY_ATTESTATION_HEADER,
)
from promptcache.gateway.decision import Decision
from promptcache.gateway.refusals import busy, parse_too_large, protocol_error
from promptcache.runtime.refusals import too_large
from promptcache.tenancy.canonical import (
    JsonScan,
)
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.shares import Ledger, Verdict, share_of, share_refusal

_CHUNK_BYTES: Final[int] = 1024 * 1024
"""Largest body message sent to the picker (gRPC servers refuse messages over 4 MiB)."""


def body_budget(limit: int, percent: int) -> Ledger:
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


class Inspector:
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

"""Prompt-token counts out of vLLM responses, whole or streamed.

Headers go out before a body, and the usage of a streamed response is only
known at its end, so a streamed response cannot carry the counts as headers.
The front therefore writes them, at the end of the stream, as SSE comment
lines (`: dashflow-prompt-tokens: 123`), just before `data: [DONE]`. SSE
clients ignore comment lines (the OpenAI SDKs included), so nothing breaks;
clients that want the counts read them there (the client helper does). aiohttp
cannot send HTTP trailers, and most proxies drop them, so trailers are not used.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Final

MAX_EVENT_BYTES: Final[int] = 1 << 20
"""An SSE event longer than this is passed on uninspected, bounding the buffer."""
DONE: Final[bytes] = b"data: [DONE]"


@dataclass(frozen=True, slots=True)
class Usage:
    """The two counts spec/004 puts in response headers."""

    prompt_tokens: int
    cached_tokens: int | None
    """None when vLLM does not report it (it needs --enable-prompt-tokens-details)."""


def usage_from(obj: Any) -> Usage | None:
    """The usage block of a completion or chunk, if it has a usable one."""
    if not isinstance(obj, dict):
        return None
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens")
    if isinstance(prompt, bool) or not isinstance(prompt, int):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if isinstance(cached, bool) or not isinstance(cached, int):
        cached = None
    return Usage(prompt_tokens=prompt, cached_tokens=cached)


def usage_of_json(body: bytes) -> Usage | None:
    """The usage of a whole JSON answer, if it has a usable one (never raises)."""
    try:
        return usage_from(json.loads(body))
    except (ValueError, RecursionError):
        return None


def usage_headers(usage: Usage, prompt_header: str, cached_header: str) -> dict[str, str]:
    """The response headers for one usage block (an empty header name means "off")."""
    headers = {}
    if prompt_header:
        headers[prompt_header] = str(usage.prompt_tokens)
    if cached_header and usage.cached_tokens is not None:
        headers[cached_header] = str(usage.cached_tokens)
    return headers


def usage_comment(usage: Usage, prompt_header: str, cached_header: str) -> bytes:
    """The SSE comment lines carrying the usage headers at the end of a stream."""
    headers = usage_headers(usage, prompt_header, cached_header)
    if not headers:
        return b""
    lines = [f": {name}: {value}\n" for name, value in headers.items()]
    return ("".join(lines) + "\n").encode("ascii")


def _first_mark(pending: bytes) -> int:
    """Where the first event that may not pass unchanged can start being seen in `pending`
    (-1: none): the usage chunk and `[DONE]` name their markers, and an event ended by
    CRLFs is rewritten to LFs. Every complete event before it passes unchanged, so the
    relay sends those as one slice; in a stream of token deltas, that is every event but
    the last two.

    Why it matters: the relay looked at each event in Python (a few microseconds each),
    and a stream that its client stops reading still fills the transport and the
    socket's send buffer, some 800 KiB of events per stream, before the write deadline
    cuts it. Under `bench/hostile_load.py --attacks hold` the attacker's streams were
    re-admitted together each deadline, and relaying them held the event loop in bursts
    the well-behaved tenants' requests waited behind. Now a read costs a few scans in C."""
    found = [i for i in (pending.find(m) for m in _MARKS) if i != -1]
    return min(found, default=-1)


_MARKS: Final = (b'"usage"', b"[DONE]", b"\r")


def _event_data(event: bytes) -> bytes | None:
    data = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(data) if data else None


class SseRelay:
    """Passes SSE events through one at a time, noting usage and dropping what it added.

    Only the current, incomplete event is ever held (capped by MAX_EVENT_BYTES),
    so a long stream is never buffered whole.
    """

    def __init__(self, *, strip_usage_chunk: bool, prompt_header: str, cached_header: str):
        self._strip = strip_usage_chunk
        self._prompt_header = prompt_header
        self._cached_header = cached_header
        self._pending = b""
        self._passthrough = False
        self._comment_sent = False
        self.usage: Usage | None = None

    @property
    def pending_bytes(self) -> int:
        """The incomplete event held until its end arrives (at most `MAX_EVENT_BYTES`)."""
        return len(self._pending)

    def _comment(self) -> bytes:
        if self.usage is None or self._comment_sent:
            return b""
        self._comment_sent = True
        return usage_comment(self.usage, self._prompt_header, self._cached_header)

    def _event(self, event: bytes) -> bytes:
        """What to send for one complete event (without its blank-line terminator)."""
        data = _event_data(event.replace(b"\r\n", b"\n"))
        if data is None:
            return event + b"\n\n"
        if data.strip() == b"[DONE]":
            return self._comment() + event + b"\n\n"
        if b'"usage"' not in data:
            return event + b"\n\n"  # no usage block (vLLM writes keys unescaped): no parse
        try:
            chunk = json.loads(data)
        except ValueError:
            return event + b"\n\n"
        usage = usage_from(chunk)
        if usage is not None:
            self.usage = usage
            if self._strip and isinstance(chunk, dict) and chunk.get("choices") == []:
                return b""  # the usage-only chunk the client did not ask for
        return event + b"\n\n"

    def feed(self, data: bytes) -> bytes:
        """Take bytes from vLLM; return the bytes to send the client now.

        Linear in the bytes fed: one upstream read may hold thousands of events (a client
        slower than vLLM lets a few hundred KiB queue up), and splitting them by
        re-searching and re-slicing the rest of the buffer per event was quadratic work
        on the event loop (seconds per read, measured under `bench/hostile_load.py`).
        """
        if self._passthrough:
            return data
        scanned = max(len(self._pending) - 3, 0)  # no terminator starts before this
        pending = self._pending + data if self._pending else data
        # the complete events before the first that may change pass as one slice
        mark = _first_mark(pending)
        last = pending.rfind(b"\n\n", scanned, len(pending) if mark == -1 else mark)
        pos = 0 if last == -1 else last + 2
        out = [pending[:pos]] if pos else []
        if mark != -1:
            lf = pending.find(b"\n\n", max(scanned, pos))
            crlf = pending.find(b"\r\n\r\n", max(scanned, pos))
            while lf != -1 or crlf != -1:
                if crlf != -1 and (lf == -1 or crlf < lf):
                    out.append(self._event(pending[pos:crlf]))
                    pos = crlf + 4
                else:
                    out.append(self._event(pending[pos:lf]))
                    pos = lf + 2
                # each search moves forward only: every byte is looked at a bounded number
                # of times
                if lf != -1 and lf < pos:
                    lf = pending.find(b"\n\n", pos)
                if crlf != -1 and crlf < pos:
                    crlf = pending.find(b"\r\n\r\n", pos)
        self._pending = pending[pos:] if pos else pending
        return self._checked(b"".join(out))

    def _checked(self, out: bytes) -> bytes:
        """`out`, plus the incomplete event when it grew past `MAX_EVENT_BYTES` (passed on
        uninspected from then on)."""
        if len(self._pending) > MAX_EVENT_BYTES:
            out += self._pending
            self._pending = b""
            self._passthrough = True
        return out

    def finish(self) -> bytes:
        """The stream ended: flush what is left, plus the usage comment if not yet sent."""
        rest, self._pending = self._pending, b""
        comment = self._comment()
        if rest and comment and not rest.endswith(b"\n\n"):
            rest += b"\n\n"  # keep the comment out of an unterminated last event
        return rest + comment


async def relay(chunks: AsyncIterator[bytes], sse: SseRelay) -> AsyncIterator[bytes]:
    """Run an upstream byte stream through an `SseRelay`."""
    async for chunk in chunks:
        out = sse.feed(chunk)
        if out:
            yield out
    tail = sse.finish()
    if tail:
        yield tail

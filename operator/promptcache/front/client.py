"""A client helper: send prompt embeddings by identifier, re-upload only what is missing.

Usage::

    async with aiohttp.ClientSession() as http:
        client = PromptCacheClient(http, "http://model:8000")
        turn = EmbedsPayload.from_tensor(torch.randn(12, 4096))
        body = {"model": "m", "prompt_embeds": [history, turn]}
        result = await client.post("/v1/completions", body)

`EmbedsPayload` objects stand where a base64 payload would (a `prompt_embeds`
entry, or a chat part's `data`). The helper sends the identifier for payloads
the server has accepted before, the payload (with its identifier named) for
the rest, and on a `prompt_embeds_not_cached` 409 sends exactly the missing
ones again. It also copies `user` into the session header, which is where that
must happen for the Endpoint Picker (it routes on headers only).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp

from promptcache.contract import (
    DEFAULT_CACHED_PROMPT_TOKENS_HEADER,
    DEFAULT_PROMPT_TOKENS_HEADER,
    DEFAULT_SESSION_HEADER,
    MISSING_PROMPT_EMBEDS_IDS_FIELD,
    PROMPT_EMBEDS_NOT_CACHED_ERROR_CODE,
    SESSION_USER_FIELD,
)
from promptcache.front.references import (
    CHAT_PART_ID_FIELD,
    CHAT_PART_TYPE,
    COMPLETION_IDS_FIELD,
    PROMPT_EMBEDS_FIELD,
)

MAX_ATTEMPTS: Final = 3
"""One try plus re-uploads; with N front processes a payload can miss N times (spec/000)."""


@dataclass(frozen=True, slots=True)
class EmbedsPayload:
    """A prompt-embeds payload with the identifier the client computed for it."""

    identifier: str
    data: str
    """Base64 of `torch.save(obj)`."""

    @classmethod
    def from_object(cls, obj: Any) -> EmbedsPayload:
        """Serialize a tensor or TurboQuant mapping and compute its identifier."""
        from promptcache.embeds.ids import compute_prompt_embeds_id  # noqa: PLC0415 - torch
        from promptcache.embeds.wire import encode_payload  # noqa: PLC0415

        return cls(identifier=compute_prompt_embeds_id(obj), data=encode_payload(obj))


@dataclass
class Result:
    """What one logical request cost and returned."""

    status: int
    body: Any
    headers: Mapping[str, str]
    attempts: int
    bytes_sent: int
    usage_headers: dict[str, str] = field(default_factory=dict)


def parse_usage_comments(stream_text: str) -> dict[str, str]:
    """The `: name: value` SSE comment lines the front adds at the end of a stream."""
    found: dict[str, str] = {}
    for line in stream_text.splitlines():
        if line.startswith(": ") and line.count(":") >= 2:
            name, _, value = line[2:].partition(": ")
            found[name.strip()] = value.strip()
    return found


class PromptCacheClient:
    """Tracks which payloads a server holds and sends the fewest bytes that work."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        session_header: str = DEFAULT_SESSION_HEADER,
        usage_header_names: tuple[str, str] = (
            DEFAULT_PROMPT_TOKENS_HEADER,
            DEFAULT_CACHED_PROMPT_TOKENS_HEADER,
        ),
    ) -> None:
        self._http = session
        self._base = base_url.rstrip("/")
        self._headers = dict(headers or {})
        self._session_header = session_header
        self._usage_names = usage_header_names
        self.known: set[str] = set()
        """Identifiers the server accepted; referenced instead of uploaded."""

    def _render(self, value: Any, payloads: list[EmbedsPayload]) -> Any:
        """A JSON-ready copy of `value` with every EmbedsPayload replaced."""
        if isinstance(value, EmbedsPayload):
            payloads.append(value)
            return value.identifier if value.identifier in self.known else value.data
        if isinstance(value, list):
            return [self._render(v, payloads) for v in value]
        if isinstance(value, dict):
            out = {k: self._render(v, payloads) for k, v in value.items()}
            if out.get("type") == CHAT_PART_TYPE and isinstance(value.get("data"), EmbedsPayload):
                p = value["data"]
                if p.identifier not in self.known:
                    out[CHAT_PART_ID_FIELD] = p.identifier
            return out
        return value

    def build(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], list[EmbedsPayload]]:
        """The body to send now, and the payloads it mentions."""
        payloads: list[EmbedsPayload] = []
        out = {k: self._render(v, payloads) for k, v in body.items()}
        embeds = body.get(PROMPT_EMBEDS_FIELD)
        if isinstance(embeds, EmbedsPayload) and embeds.identifier not in self.known:
            out[COMPLETION_IDS_FIELD] = embeds.identifier
        elif isinstance(embeds, list) and any(
            isinstance(e, EmbedsPayload) and e.identifier not in self.known for e in embeds
        ):
            out[COMPLETION_IDS_FIELD] = [
                e.identifier
                if isinstance(e, EmbedsPayload) and e.identifier not in self.known
                else None
                for e in embeds
            ]
        return out, payloads

    def _request_headers(self, body: Mapping[str, Any]) -> dict[str, str]:
        headers = {"Content-Type": "application/json", **self._headers}
        user = body.get(SESSION_USER_FIELD)
        if isinstance(user, str) and user and self._session_header not in headers:
            headers[self._session_header] = user
        return headers

    async def post(self, path: str, body: Mapping[str, Any]) -> Result:
        """Send one request, re-uploading exactly the payloads the server lacks."""
        sent = 0
        for attempt in range(1, MAX_ATTEMPTS + 1):
            wire_body, payloads = self.build(body)
            data = json.dumps(wire_body, separators=(",", ":")).encode("utf-8")
            sent += len(data)
            async with self._http.post(
                self._base + path, data=data, headers=self._request_headers(body)
            ) as resp:
                raw = await resp.read()
                content_type = resp.headers.get("Content-Type", "")
                parsed: Any = raw.decode("utf-8", "replace")
                if content_type.startswith("application/json"):
                    parsed = json.loads(raw)
                usage = {n: resp.headers[n] for n in self._usage_names if n in resp.headers}
                if content_type.startswith("text/event-stream"):
                    usage.update(parse_usage_comments(parsed))
                missing = _missing(resp.status, parsed)
                if missing is not None and attempt < MAX_ATTEMPTS:
                    self.known.difference_update(missing)
                    continue
                if 200 <= resp.status < 300:
                    self.known.update(p.identifier for p in payloads)
                return Result(resp.status, parsed, dict(resp.headers), attempt, sent, usage)
        raise AssertionError("unreachable: the last attempt always returns")


def _missing(status: int, body: Any) -> list[str] | None:
    if status != 409 or not isinstance(body, dict):
        return None
    error = body.get("error")
    if not isinstance(error, dict) or error.get("code") != PROMPT_EMBEDS_NOT_CACHED_ERROR_CODE:
        return None
    missing = error.get(MISSING_PROMPT_EMBEDS_IDS_FIELD)
    return [m for m in missing if isinstance(m, str)] if isinstance(missing, list) else None

"""Requests to the real engine, direct or through a front, and what came back."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from promptcache.contract import DEFAULT_ISOLATION_HEADER
from promptcache.front.client import parse_usage_comments

from .pods import SERVED_NAME

PROMPT_HEADER = "dashflow-prompt-tokens"
CACHED_HEADER = "dashflow-cached-prompt-tokens"
_WORDS = ["cache", "prompt", "token", "model", "tenant", "block", "prefix", "chat", "and", "the"]


def long_text(seed: int, words: int = 300) -> str:
    """A prompt long enough to fill many 32-token blocks, different for each seed."""
    return " ".join(
        _WORDS[(seed * 7 + i * (seed + 3)) % len(_WORDS)] + str(seed % 97) for i in range(words)
    )


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: Any = None
    events: list[Any] = field(default_factory=list)
    raw: str = ""

    @property
    def usage(self) -> dict[str, Any]:
        if self.events:
            found = [e["usage"] for e in self.events if isinstance(e, dict) and e.get("usage")]
            return found[-1] if found else {}
        return dict(self.body.get("usage") or {}) if isinstance(self.body, dict) else {}

    @property
    def cached(self) -> int:
        details = self.usage.get("prompt_tokens_details") or {}
        return int(details.get("cached_tokens") or 0)

    @property
    def text(self) -> str:
        if self.events:
            parts = []
            for event in self.events:
                for choice in event.get("choices", []) if isinstance(event, dict) else []:
                    delta = choice.get("delta") or {}
                    parts.append(delta.get("content") or choice.get("text") or "")
            return "".join(parts)
        choice = self.body["choices"][0]
        return str(choice.get("message", {}).get("content") or choice.get("text") or "")

    @property
    def comments(self) -> dict[str, str]:
        return parse_usage_comments(self.raw)

    @property
    def error_code(self) -> str | None:
        if isinstance(self.body, dict) and isinstance(self.body.get("error"), dict):
            code = self.body["error"].get("code")
            return None if code is None else str(code)
        return None


async def post(
    http: aiohttp.ClientSession,
    url: str,
    path: str,
    body: dict[str, Any],
    *,
    key: str | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    sent = dict(headers or {})
    if key is not None:
        sent[DEFAULT_ISOLATION_HEADER] = key
    async with http.post(url + path, json=body, headers=sent) as resp:
        raw = await resp.text()
        answer = Answer(resp.status, {k.lower(): v for k, v in resp.headers.items()}, raw=raw)
    if body.get("stream") and answer.status == 200:
        for line in raw.splitlines():
            if line.startswith("data: ") and line[6:].strip() != "[DONE]":
                answer.events.append(json.loads(line[6:]))
    else:
        try:
            answer.body = json.loads(raw)
        except ValueError:
            answer.body = raw
    return answer


def chat_body(prompt: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": SERVED_NAME,
        "messages": [{"role": "system", "content": prompt}, {"role": "user", "content": "go"}],
        "max_tokens": 6,
        "temperature": 0,
        **extra,
    }


def completion_body(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"model": SERVED_NAME, "prompt": prompt, "max_tokens": 6, "temperature": 0, **extra}

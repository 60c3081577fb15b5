"""The hostile-input corpus (`hostile/corpus.json`) over raw sockets, in every isolation mode.

Each case is sent byte for byte (non-canonical targets, raw header bytes and
bodies that no HTTP client library would produce) to a real front in front of
the recording stand-in. The runner asserts the exact status and error code,
that every refusal is a JSON error (never a 5xx, never a traceback), and what
the stand-in received: nothing for a refusal; for a forwarded request the
checked path and query, the coerced fields, and the salt the policy chose.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from harness.front_app import SECRET, MakeFront
from harness.standin import StandinUpstream
from promptcache.contract import IsolationMode
from promptcache.tenancy.salt import derive_salt

CORPUS = json.loads((Path(__file__).parent / "hostile" / "corpus.json").read_text())["cases"]
MODES = [IsolationMode.SHARED, IsolationMode.PER_KEY, IsolationMode.REQUIRED]
ISOLATION_HEADER = "x-prompt-cache-isolation-key"


def request_bytes(case: dict[str, Any]) -> bytes:
    """The request exactly as the case describes it."""
    if "body" in case:
        body = json.dumps(case["body"]).encode()
    elif "body_text" in case:
        encoding = "latin-1" if ["X-Body-Encoding", "latin-1"] in case["headers"] else "utf-8"
        body = case["body_text"].encode(encoding)
    else:
        body = b""
    target = case["target"].encode("utf-8")
    lines = [f"{case['method']} ".encode() + target + b" HTTP/1.1", b"Host: front"]
    lines += [f"{name}: {value}".encode("latin-1") for name, value in case["headers"]]
    if body or case["method"] == "POST":
        lines.append(f"Content-Length: {len(body)}".encode())
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


async def exchange(url: str, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes, read the whole answer (the front closes after it)."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(data)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


def expected(case: dict[str, Any], mode: IsolationMode) -> dict[str, Any]:
    result: dict[str, Any] = case.get("expect_by_mode", {}).get(mode.value, case["expect"])
    return result


def _key(case: dict[str, Any]) -> str | None:
    return next((v for n, v in case["headers"] if n.lower() == ISOLATION_HEADER), None)


@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
@pytest.mark.parametrize("case", CORPUS, ids=[c["name"] for c in CORPUS])
async def test_hostile_case(
    case: dict[str, Any],
    mode: IsolationMode,
    standin: tuple[StandinUpstream, str],
    make_front: MakeFront,
) -> None:
    upstream, _ = standin
    front = await make_front(isolation_mode=mode)
    want = expected(case, mode)
    status, headers, body = await exchange(front.url, request_bytes(case))
    assert status == want["status"], body[:300]
    assert status < 500
    if status >= 400:
        # every refusal, the HTTP parser's included, is a JSON error with a stable code
        assert want["code"] is not None, "a refusal in the corpus must name its error code"
    if want["code"] is not None:
        assert headers["content-type"].startswith("application/json")
        error = json.loads(body)["error"]
        assert error["code"] == want["code"], error
        assert error["message"]
    forwarded = want["forwarded"]
    if forwarded is None:
        assert upstream.requests == [], "a refused request reached the model server"
        return
    assert len(upstream.requests) == 1
    got = upstream.requests[0]
    assert got.path == forwarded["path"]
    assert got.query == forwarded.get("query", "")
    assert ISOLATION_HEADER not in {k.lower() for k in got.headers}
    if not got.body:
        return
    sent = got.json()
    for name, value in forwarded["json"].items():
        assert sent[name] == value, name
    assert "prompt_cache_isolation_key" not in sent
    key = _key(case)
    if forwarded["salted"] and mode is not IsolationMode.SHARED and key is not None:
        assert sent["cache_salt"] == derive_salt(SECRET, key)
    else:
        assert "cache_salt" not in sent

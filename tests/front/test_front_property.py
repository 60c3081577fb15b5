"""Property: for any request target and header set, the front either refuses, or forwards
exactly the target it checked with the salt the isolation policy chose.

Real sockets throughout: one stand-in and one front per isolation mode run on a
background event loop; each example is written byte for byte on a plain socket
(targets and header bytes no client library would send).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.front_app import SECRET
from harness.standin import StandinUpstream, start_standin
from promptcache.contract import IsolationMode
from promptcache.embeds.cache import PromptEmbedsCache
from promptcache.front.http_server import create_runner
from promptcache.front.settings import FrontSettings
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.routes import ROUTES, RouteClass, canonical_target, check_route
from promptcache.tenancy.salt import derive_salt

KEY = "x-prompt-cache-isolation-key"
MODES = (IsolationMode.SHARED, IsolationMode.PER_KEY, IsolationMode.REQUIRED)


class Stack:
    """Stand-ins and fronts (one per mode) on a background event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.fronts: dict[IsolationMode, tuple[int, StandinUpstream]] = {}
        self.runners: list[Any] = []
        for mode in MODES:
            asyncio.run_coroutine_threadsafe(self._start(mode), self.loop).result(30)

    async def _start(self, mode: IsolationMode) -> None:
        from aiohttp import web

        standin = StandinUpstream()
        runner, url = await start_standin(standin)
        settings = FrontSettings(upstream=url, isolation_mode=mode, body_timeout_seconds=2)
        front = create_runner(
            settings, secret=SECRET if settings.needs_salt_key else None, cache=PromptEmbedsCache(0)
        )
        await front.setup()
        await web.TCPSite(front, "127.0.0.1", 0).start()
        self.runners += [front, runner]
        self.fronts[mode] = (front.addresses[0][1], standin)

    def close(self) -> None:
        for runner in self.runners:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    s = Stack()
    yield s
    s.close()


def _exchange(port: int, data: bytes) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    raw = b"".join(chunks)
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


known_segments = sorted({s for r in ROUTES for s in r.path.split("/") if s and "{" not in s})
segments = st.one_of(
    st.sampled_from(known_segments),
    st.sampled_from(["", ".", "..", "%2e", "%2E%2e", "%2f", "%2F", "%00", "a b", "é", "~", "-"]),
    st.text(alphabet="abcxyz019._~-%/", min_size=1, max_size=6),
)
targets = st.builds(
    lambda parts, query, fragment: (
        "/"
        + "/".join(parts)
        + (f"?{query}" if query is not None else "")
        + (f"#{fragment}" if fragment is not None else "")
    ),
    st.lists(segments, min_size=1, max_size=5),
    st.none() | st.text(alphabet="a=&%2F/ ?é", max_size=8),
    st.none() | st.text(alphabet="ab", max_size=3),
)
header_values = st.one_of(
    st.sampled_from(["tenant-a", "tenant-b"]),
    st.sampled_from(["tenant-a", "tenant-b", "", " tenant-a", "ten\xffant"]),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=12),
)
headers = st.lists(
    st.tuples(
        st.sampled_from([KEY, KEY, KEY.upper(), "X-Other", "X-Other", "Content-Encoding"]),
        header_values,
    ),
    max_size=3,
)
content_types = st.sampled_from(
    [
        "application/json",
        "application/json",
        "Application/JSON; charset=utf-8",
        "text/plain",
        "application/jsonx",
    ]
)
served = st.sampled_from(
    sorted(
        (m, r.path)
        for r in ROUTES
        if r.kind in (RouteClass.SALTED, RouteClass.READ_ONLY) and "{" not in r.path
        for m in r.methods
    )
)
anything = st.tuples(
    st.sampled_from(["POST", "GET", "PUT", "DELETE"]),
    targets | st.sampled_from(sorted(r.path for r in ROUTES if "{" not in r.path)),
)
request_lines = st.one_of(
    served,
    served,
    st.builds(
        lambda line, q: (line[0], f"{line[1]}?{q}"),
        served,
        st.text(alphabet="a=&%2F/?.", max_size=8),
    ),
    anything,
)


def _request(method: str, target: str, hdrs: list[tuple[str, str]], ctype: str) -> bytes:
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "cache_salt": "attacker"}
    ).encode()
    lines = [f"{method} ".encode() + target.encode() + b" HTTP/1.1", b"Host: f"]
    lines += [f"Content-Type: {ctype}".encode("latin-1")]
    lines += [f"{n}: {v}".encode("latin-1") for n, v in hdrs]
    lines += [f"Content-Length: {len(body)}".encode(), b"Connection: close"]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _route_accepted(method: str, raw_target: str) -> Any:
    try:
        target = canonical_target(raw_target)
        return check_route(method, target.path), target
    except FrontError:
        return None, None


keyed_headers = st.one_of(
    headers,
    st.builds(lambda k: [(KEY, k)], st.sampled_from(["tenant-a", "tenant-b"])),
    st.builds(lambda h, k: [*h, (KEY, k)], headers, st.sampled_from(["tenant-a", "tenant-b"])),
)


@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(line=request_lines, hdrs=keyed_headers, ctype=content_types)
def test_the_front_refuses_or_forwards_what_the_policy_accepted(
    stack: Stack,
    mode: IsolationMode,
    line: tuple[str, str],
    hdrs: list[tuple[str, str]],
    ctype: str,
) -> None:
    method, target = line
    port, standin = stack.fronts[mode]
    standin.requests.clear()
    status, _ = _exchange(port, _request(method, target, hdrs, ctype))
    assert status < 500 or status in (502, 503, 504)  # never a 500
    if not standin.requests:
        return  # refused (or answered by the front itself): nothing reached vLLM
    assert status == 200
    (got,) = standin.requests
    route, checked = _route_accepted(method, target)
    assert route is not None, f"{method} {target!r} was forwarded but the table refuses it"
    assert route.kind in (RouteClass.SALTED, RouteClass.READ_ONLY)
    # exactly the checked target
    assert got.path == checked.path
    assert got.query == (checked.query or "")
    assert KEY not in {k.lower() for k in got.headers}
    if route.kind is RouteClass.READ_ONLY:
        return
    # HTTP trims OWS; the wire carries bytes (latin-1 here) and the front reads them as UTF-8
    # (a value that is not UTF-8 is refused before anything is forwarded)
    keys = {
        v.encode("latin-1").decode("utf-8").strip(" \t") for n, v in hdrs if n.lower() == KEY
    } - {""}
    assert len(keys) <= 1
    sent = got.json()
    if mode is IsolationMode.REQUIRED and route.reaches_kv_cache:
        assert keys, "Required mode forwarded a prompt without a key"
    if mode is not IsolationMode.SHARED and keys and route.salt_field:
        assert sent["cache_salt"] == derive_salt(SECRET, keys.pop())
    else:
        assert "cache_salt" not in sent

"""The SSE relay's work per stream does not grow with its events (issue 43's measure).

A client that stops reading a stream still lets the front relay what fills the transport
and the socket's send buffer (some 800 KiB of events) before the write deadline cuts it;
an attacker holding many such streams had the front look at every event in Python, in
bursts the well-behaved tenants waited behind (`bench/hostile_load.py --attacks hold`).
Events that pass unchanged (token deltas) now go through as one slice per read. Counted,
not timed: over a real socket, the events the relay inspects one by one are the same
two or three (the usage chunk, `[DONE]`) for a stream of 200 events and one of 20 000, and
what the client receives is unchanged. The slice is checked against the per-event path on
random streams cut at random places.
"""

from __future__ import annotations

import random

import aiohttp
import pytest

from harness.front_app import MakeFront
from harness.standin import StandinUpstream
from promptcache.contract import IsolationMode
from promptcache.front import usage
from promptcache.front.usage import SseRelay

KEY = {"x-prompt-cache-isolation-key": "tenant-a"}


def _event(rng: random.Random) -> bytes:
    kind = rng.randrange(8)
    if kind == 0:
        return b'data: {"choices":[],"usage":{"prompt_tokens":7,"prompt_tokens_details":null}}'
    if kind == 1:
        return b"data: [DONE]"
    if kind == 2:
        return b": a comment"
    if kind == 3:
        return b"event: x\ndata: {}"
    return b'data: {"choices":[{"delta":{"content":"' + b"t" * rng.randrange(40) + b'"}}]}'


def _relayed(stream: bytes, cuts: list[int], *, slices: bool) -> bytes:
    """`stream` through a relay, fed in pieces cut at `cuts`."""
    relay = SseRelay(strip_usage_chunk=True, prompt_header="p", cached_header="c")
    pieces, start = [], 0
    for cut in [*sorted(cuts), len(stream)]:
        pieces.append(stream[start:cut])
        start = cut
    original = usage._first_mark
    if not slices:
        usage._first_mark = lambda pending: 0  # every event inspected, one by one
    try:
        out = b"".join(relay.feed(piece) for piece in pieces)
        return out + relay.finish()
    finally:
        usage._first_mark = original


@pytest.mark.parametrize("seed", range(200))
def test_slices_relay_exactly_what_the_per_event_path_relays(seed: int) -> None:
    rng = random.Random(seed)
    ends = [b"\n\n", b"\r\n\r\n"] if seed % 4 == 0 else [b"\n\n"]
    stream = b"".join(_event(rng) + rng.choice(ends) for _ in range(rng.randrange(1, 40)))
    if seed % 5 == 0:
        stream += b"data: {unterminated"
    cuts = [rng.randrange(len(stream) + 1) for _ in range(rng.randrange(6))]
    assert _relayed(stream, cuts, slices=True) == _relayed(stream, cuts, slices=False)


async def test_the_relays_work_per_stream_does_not_grow_with_its_events(
    make_front: MakeFront,
    standin: tuple[StandinUpstream, str],
    http: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inspected = 0
    event = SseRelay._event

    def counted(self: SseRelay, raw: bytes) -> bytes:
        nonlocal inspected
        inspected += 1
        return event(self, raw)

    monkeypatch.setattr(SseRelay, "_event", counted)
    front = await make_front(isolation_mode=IsolationMode.PER_KEY)
    seen = {}
    for events in (200, 20_000):
        standin[0].chunks = events
        inspected = 0
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        async with http.post(front.url + "/v1/chat/completions", json=body, headers=KEY) as got:
            assert got.status == 200
            text = await got.read()
        deltas = [line for line in text.split(b"\n\n") if b'"delta"' in line]
        assert len(deltas) == events
        assert text.endswith(b"data: [DONE]\n\n")
        assert b": " + front.settings.prompt_tokens_header.encode() in text  # the usage comment
        assert b'"usage"' not in text  # the usage chunk the client did not ask for: dropped
        seen[events] = inspected
    # the usage chunk and [DONE], whatever the stream's length: not one per delta
    assert seen[20_000] == seen[200] <= 3, seen

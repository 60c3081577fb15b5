"""Multi-turn chat with growing prompt embeddings through the cache front.

Measures, in one run and against baselines from the same run:
  * bytes the client uploads with references (the client helper) versus
    inlining every payload each turn (goal: >= 90 % fewer);
  * the front's added latency per request: p50/p99 through the front versus
    calling the stand-in upstream directly, and their ratio.

The stand-in vLLM and the front run as separate processes on 127.0.0.1 (the
front exactly as a pod runs it: `python -m promptcache.front`); this process is
the client. The stand-in answers instantly, so every millisecond above the
direct baseline is the front's (parse, policy, resolve/verify, forward).

    python -m bench.front_multiturn          # short run (< 1 min)
    python -m bench.front_multiturn --full   # bigger embeddings, more conversations
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import torch

from bench.local_processes import start, wait_ok
from harness.net import free_port
from promptcache.front.client import EmbedsPayload, PromptCacheClient

CHAT = "/v1/chat/completions"


@dataclass
class Series:
    """Latencies (seconds) and request bytes of one mode."""

    latencies: list[float] = field(default_factory=list)
    bytes_sent: int = 0

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _conversation(seed: int, turns: int, tokens: int, hidden: int) -> list[EmbedsPayload]:
    gen = torch.Generator().manual_seed(seed)
    return [
        EmbedsPayload.from_object(torch.randn(tokens, hidden, generator=gen).to(torch.float16))
        for _ in range(turns)
    ]


def _chat_body(segments: list[Any]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for i, segment in enumerate(segments):
        messages.append({"role": "user", "content": [{"type": "prompt_embeds", "data": segment}]})
        if i < len(segments) - 1:
            messages.append({"role": "assistant", "content": f"answer {i}"})
    return {"model": "bench", "messages": messages, "max_tokens": 8}


async def _inline_turns(
    http: aiohttp.ClientSession, url: str, conversation: list[EmbedsPayload], series: Series
) -> None:
    for turn in range(1, len(conversation) + 1):
        body = json.dumps(_chat_body([p.data for p in conversation[:turn]])).encode()
        start = time.perf_counter()
        async with http.post(
            url + CHAT, data=body, headers={"Content-Type": "application/json"}
        ) as resp:
            await resp.read()
            assert resp.status == 200, resp.status
        series.latencies.append(time.perf_counter() - start)
        series.bytes_sent += len(body)


async def _reference_turns(
    http: aiohttp.ClientSession, url: str, conversation: list[EmbedsPayload], series: Series
) -> None:
    client = PromptCacheClient(http, url)
    for turn in range(1, len(conversation) + 1):
        start = time.perf_counter()
        result = await client.post(CHAT, _chat_body(conversation[:turn]))
        series.latencies.append(time.perf_counter() - start)
        assert result.status == 200, result.body
        series.bytes_sent += result.bytes_sent


async def run(args: argparse.Namespace) -> None:
    standin_port, front_port = free_port(), free_port()
    standin = await start("-m", "harness.standin", str(standin_port))
    direct_url = f"http://127.0.0.1:{standin_port}"
    front = await start(
        "-m",
        "promptcache.front",
        "--upstream",
        direct_url,
        "--listen",
        f"127.0.0.1:{front_port}",
        "--prompt-embeds-cache-gib",
        "2",
    )
    front_url = f"http://127.0.0.1:{front_port}"
    modes = {"direct (inline)": Series(), "front, inline": Series(), "front, references": Series()}
    try:
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            await wait_ok(http, direct_url + "/health", standin)
            await wait_ok(http, front_url + "/readyz", front)
            print(
                f"{args.conversations} conversations x {args.turns} turns, "
                f"{args.tokens} tokens x {args.hidden} hidden (fp16) added per turn"
            )
            for c in range(args.conversations):
                # fresh embeddings per mode, so no mode warms the cache for another
                convs = [
                    _conversation(1000 * c + m, args.turns, args.tokens, args.hidden)
                    for m in range(3)
                ]
                await _inline_turns(http, direct_url, convs[0], modes["direct (inline)"])
                await _inline_turns(http, front_url, convs[1], modes["front, inline"])
                await _reference_turns(http, front_url, convs[2], modes["front, references"])
    finally:
        for proc in (front, standin):
            proc.terminate()
            await proc.wait()

    base = modes["direct (inline)"]
    refs = modes["front, references"]
    print(
        f"\n{'mode':<20}{'requests':>9}{'MB sent':>10}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'p50 x':>8}{'p99 x':>8}"
    )
    for name, s in modes.items():
        print(
            f"{name:<20}{len(s.latencies):>9}{s.bytes_sent / 1e6:>10.2f}"
            f"{s.pct(0.5) * 1e3:>9.2f}{s.pct(0.99) * 1e3:>9.2f}"
            f"{s.pct(0.5) / base.pct(0.5):>8.2f}{s.pct(0.99) / base.pct(0.99):>8.2f}"
        )
    saved = 1 - refs.bytes_sent / base.bytes_sent
    print(
        f"\nbytes uploaded with references vs inline: {refs.bytes_sent / base.bytes_sent:.3f} "
        f"({saved:.1%} fewer; goal >= 90%)"
    )
    print(
        f"front added latency with references: p50 {1e3 * (refs.pct(0.5) - base.pct(0.5)):+.2f}"
        f" ms, p99 {1e3 * (refs.pct(0.99) - base.pct(0.99)):+.2f} ms "
        f"(ratio p50 {refs.pct(0.5) / base.pct(0.5):.2f}, "
        f"p99 {refs.pct(0.99) / base.pct(0.99):.2f})"
    )
    print(
        f"mean latency: direct {statistics.mean(base.latencies) * 1e3:.2f} ms, "
        f"front+references {statistics.mean(refs.latencies) * 1e3:.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--full", action="store_true", help="10 conversations, 64 tokens x 4096 hidden per turn"
    )
    parser.add_argument("--conversations", type=int, default=None)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=None)
    parser.add_argument("--hidden", type=int, default=None)
    args = parser.parse_args()
    args.conversations = args.conversations or (10 if args.full else 3)
    args.tokens = args.tokens or (64 if args.full else 32)
    args.hidden = args.hidden or (4096 if args.full else 1024)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()

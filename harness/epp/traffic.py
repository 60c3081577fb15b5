"""Production-like chat traffic, routers and what it cost, for the routing bench and the demo.

A workload is tenants with one shared system prompt each, many multi-turn chats
whose prompts grow turn by turn (the model's answers come back as history), and
a few long-document sessions. Sessions arrive as a Poisson process; a session's
next turn follows its answer after a think time. Each request is routed (randomly,
by an oracle that reads every stand-in's cache and queue, or by the real Endpoint
Picker over ext_proc), streamed from the chosen pod over a real socket, and
accounted: prompt and cached tokens from the answer's `usage`, time to first
token from the client's clock (pick included), requests per pod.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import yaml

from harness.epp.extproc import DESTINATION_HEADER
from promptcache.contract import PROFILES, PickerTarget

GIE_API_VERSION = PROFILES[PickerTarget.GIE].config_api_version
VOCAB = [f"w{i:04d}" for i in range(4000)]


def words(rng: random.Random, tokens: int) -> str:
    """About `tokens` stand-in tokens of text (a word and its space are 6 bytes, 4 a token)."""
    return " ".join(rng.choice(VOCAB) for _ in range(max(1, tokens * 4 // 6)))


# --- the workload -----------------------------------------------------------------------------


@dataclass
class Session:
    sid: int
    tenant: int
    system: str
    questions: list[str]
    max_tokens: int
    start_s: float = 0.0


@dataclass(frozen=True)
class Workload:
    tenants: int = 4
    sessions: int = 60
    doc_share: float = 0.1
    system_tokens: int = 1000
    doc_tokens: int = 6000
    turns: tuple[int, int] = (2, 6)
    user_tokens: tuple[int, int] = (40, 200)
    answer_tokens: int = 8
    think_s: float = 0.3

    def build(self, seed: int) -> list[Session]:
        rng = random.Random(seed)
        systems = [words(rng, self.system_tokens) for _ in range(self.tenants)]
        out = []
        for s in range(self.sessions):
            tenant = rng.randrange(self.tenants)
            turns = rng.randint(*self.turns)
            questions = [words(rng, rng.randint(*self.user_tokens)) for _ in range(turns)]
            if rng.random() < self.doc_share:  # a long-document session
                questions[0] = "Read this document. " + words(rng, self.doc_tokens)
            out.append(Session(s, tenant, systems[tenant], questions, self.answer_tokens))
        return out

    def mean_turns(self) -> float:
        return (self.turns[0] + self.turns[1]) / 2

    def load_only_tokens(self) -> float:
        """Mean prefilled tokens per request when only the system prompt is cached."""
        lo, hi = self.turns
        per_turn = sum(self.user_tokens) / 2 + self.answer_tokens * 1.5 + 8
        total, n = 0.0, 0
        for t in range(lo, hi + 1):
            for k in range(t):
                total += per_turn * (k + 1) + self.doc_share * self.doc_tokens
                n += 1
        return total / n


@dataclass(frozen=True)
class Bounds:
    """What routing can and cannot change on a trace (token counts of the stand-in's
    tokenizer; answers counted at `answer_tokens` each)."""

    shared_floor: float
    """Share of prompt tokens that are a tenant's system prompt: served from cache by any
    router once every pod has seen every tenant (the load-only floor, whatever the cache)."""
    ceiling: float
    """1 - first-seen tokens / prompt tokens, with every system prompt prefilled once per
    pod: the most any router can serve from cache (an infinite cache)."""


def bounds(sessions: Sequence[Session], wl: Workload, pods: int) -> Bounds:
    """The shared-prefix floor and the cache ceiling of `sessions` on `pods` pods."""
    from harness.standin import EngineConfig, parse_prompt  # noqa: PLC0415

    cfg = EngineConfig()

    def n(messages: list[dict[str, str]]) -> int:
        return len(parse_prompt({"messages": messages}, True, cfg))

    total = shared = first_seen = 0
    answer = "x" * (wl.answer_tokens * cfg.bytes_per_token)
    for s in sessions:
        messages = [{"role": "system", "content": s.system}]
        system, seen = n(messages), n(messages)
        for question in s.questions:
            messages.append({"role": "user", "content": question})
            prompt = n(messages)
            total, shared, first_seen = total + prompt, shared + system, first_seen + prompt - seen
            seen = prompt
            messages.append({"role": "assistant", "content": answer})
    system_tokens = {s.tenant: n([{"role": "system", "content": s.system}]) for s in sessions}
    first_seen += pods * sum(system_tokens.values())
    return Bounds(shared / max(1, total), 1 - first_seen / max(1, total))


def schedule(
    sessions: Sequence[Session], rate_rps: float, wl: Workload, seed: int
) -> list[Session]:
    """Poisson session arrivals so that requests arrive at about `rate_rps` in steady state."""
    rng = random.Random(seed)
    per_s = rate_rps / wl.mean_turns()
    t = 0.0
    out = []
    for s in sessions:
        t += rng.expovariate(per_s)
        out.append(dataclasses.replace(s, start_s=t))
    return out


# --- where a request goes ---------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One model-server pod as a client reaches it: its URL (the front's when there is
    one), the endpoint the picker names, and the stand-in behind it."""

    name: str
    url: str
    endpoint: str
    pod: Any = None
    """The stand-in (`FakePod`) behind the front, the real pod (`harness.pod.ProcessPod`), or
    None; only the oracle and resets read it, and only a stand-in's."""


Pick = Callable[[dict[str, Any], dict[str, str]], Awaitable[Target]]


def random_router(targets: Sequence[Target], seed: int) -> Pick:
    rng = random.Random(seed)

    async def pick(body: dict[str, Any], headers: dict[str, str]) -> Target:
        return rng.choice(targets)

    return pick


def oracle_router(targets: Sequence[Target], seed: int) -> Pick:
    """Knows every pod's cache and queue: the earliest predicted first token wins."""
    rng = random.Random(seed)

    async def pick(body: dict[str, Any], headers: dict[str, str]) -> Target:
        est = []
        for i, t in enumerate(targets):
            assert t.pod is not None, "the oracle reads a stand-in's cache"
            est.append((t.pod.engine.ttft_estimate_s(body), rng.random(), i))
        return targets[min(est)[2]]

    return pick


def picker_router(client: Any, targets: Sequence[Target], *, forward: bool = False) -> Pick:
    """The real Endpoint Picker over ext_proc (`client` is an `ExtProcClient`). `forward`:
    the headers the picker set go into `headers`, which `run_trace` then sends to the pod,
    as a gateway forwards them (promptcache's signed prediction, which the front counts
    for the hit-ratio ladder, is one)."""
    by_endpoint = {t.endpoint: t for t in targets}

    async def pick(body: dict[str, Any], headers: dict[str, str]) -> Target:
        answer = await asyncio.to_thread(client.pick, body, headers)
        if answer.endpoint not in by_endpoint:
            raise RuntimeError(f"the picker answered {answer}")
        if forward:
            headers.update(
                (k, v)
                for k, v in answer.set_headers.items()
                if not k.startswith(":") and k not in _NOT_FORWARDED
            )
        return by_endpoint[answer.endpoint]

    return pick


_NOT_FORWARDED = frozenset({"content-length", DESTINATION_HEADER})
"""What a gateway consumes itself rather than sends to the pod."""


# --- picker configurations --------------------------------------------------------------------


def picker_config(
    scorers: dict[str, float],
    producer: dict[str, Any] | None,
    api_version: str = GIE_API_VERSION,
    filters: dict[str, dict[str, Any]] | None = None,
) -> str:
    """An EndpointPickerConfig with these scorer weights (and a prefix producer if given;
    `filters` run before the scorers, with their parameters)."""
    plugins: list[dict[str, Any]] = []
    if producer is not None:
        plugins.append({"type": "approx-prefix-cache-producer", "parameters": producer})
    for t, params in (filters or {}).items():
        plugins.append({"type": t, "parameters": params})
    plugins += [{"type": t} for t in scorers]
    plugins += [
        {"type": "max-score-picker", "parameters": {"maxNumOfEndpoints": 1}},
        {"type": "single-profile-handler"},
    ]
    profile: list[dict[str, Any]] = [{"pluginRef": t} for t in filters or {}]
    profile += [{"pluginRef": t, "weight": w} for t, w in scorers.items()]
    profile.append({"pluginRef": "max-score-picker"})
    return yaml.safe_dump(
        {
            "apiVersion": api_version,
            "kind": "EndpointPickerConfig",
            "plugins": plugins,
            "schedulingProfiles": [{"name": "default", "plugins": profile}],
        },
        sort_keys=False,
    )


LOAD_ONLY = picker_config({"queue-scorer": 1, "kv-cache-utilization-scorer": 1}, None)
"""Load-only routing: llm-d's queue and KV-cache scorers, no prefix affinity."""
LLMD_DEFAULT = picker_config(
    {"prefix-cache-scorer": 3, "queue-scorer": 2, "kv-cache-utilization-scorer": 2}, {}
)
"""The llm-d chart's default weights with the producer's own defaults."""

PREFIX, QUEUE, KV = "prefix-cache-scorer", "queue-scorer", "kv-cache-utilization-scorer"
VARIANTS: dict[str, str] = {
    # Index sizing (GIE v1.5 sizes a pod's index to num_gpu_blocks only under autoTune;
    # otherwise to 31250 entries whatever the pod holds).
    "index=pod cache": picker_config({PREFIX: 3, QUEUE: 2, KV: 2}, {"autoTune": True}),
    "index=31250 blocks": picker_config(
        {PREFIX: 3, QUEUE: 2, KV: 2}, {"autoTune": False, "blockSizeTokens": 16}
    ),
    # llm-d-router's index, emulated on GIE: autoTune as generated, while the pods report
    # 64-token blocks to the picker (REPORTED_BLOCK_SIZE) and cache 16-token ones, so the
    # index keeps num_gpu_blocks entries of 64 tokens: 4x what a pod holds.
    "index=4x pod cache": picker_config({PREFIX: 3, QUEUE: 2, KV: 2}, {"autoTune": True}),
    # Weights under overload.
    "prefix 5/q 2/kv 2": picker_config({PREFIX: 5, QUEUE: 2, KV: 2}, {}),
    "prefix 2/q 3/kv 2": picker_config({PREFIX: 2, QUEUE: 3, KV: 2}, {}),
    "prefix 3/q 2": picker_config({PREFIX: 3, QUEUE: 2}, {}),
    "affinity 0.8 + load": picker_config(
        {PREFIX: 1, QUEUE: 2, KV: 2},
        {},
        filters={"prefix-cache-affinity-filter": {"affinityThreshold": 0.8}},
    ),
}
"""Named picker configurations the benchmark can compare (`--routers NAME,...`)."""

REPORTED_BLOCK_SIZE: dict[str, int] = {
    "index=4x pod cache": PROFILES[PickerTarget.LLM_D_ROUTER].min_block_size_tokens
}
"""Variants whose pods report another `block_size` in `vllm:cache_config_info` than their
cache uses. GIE v1.5 has no 64-token floor and ignores `lruCapacityPerServer` (autoTune
off means 31250 entries whatever is set), so llm-d-router's belief (num_gpu_blocks entries
of 64 tokens against a cache of 16-token blocks) can be had on GIE only this way: autoTune
reads 64 and num_gpu_blocks from the pod. Nothing else in the picker reads `block_size`."""


def for_gie(config_text: str) -> tuple[str, str]:
    """A rendered config as GIE v1.5 loads it, and what had to change (if anything)."""
    doc = yaml.safe_load(config_text)
    if doc.get("apiVersion") == GIE_API_VERSION:
        return config_text, "as rendered"
    # Until the renderer targets GIE (spec.gateway.picker, issue 16) it writes llm-d's
    # apiVersion, which GIE v1.5 refuses; the plugins and weights stay as rendered.
    doc["apiVersion"] = GIE_API_VERSION
    return yaml.safe_dump(doc, sort_keys=False), "as rendered, apiVersion set for GIE"


# --- running a trace --------------------------------------------------------------------------


@dataclass
class Stats:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: list[float] = field(default_factory=list)
    per_pod: dict[str, int] = field(default_factory=dict)
    errors: int = 0
    wall_s: float = 0.0
    gaps_s: list[float] = field(default_factory=list)
    """Start to start of a session's consecutive turns: how long its prefix must survive."""

    @property
    def cached_fraction(self) -> float:
        return self.cached_tokens / max(1, self.prompt_tokens)

    def ttft(self, q: float) -> float:
        xs = sorted(self.ttft_s)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else math.nan

    @property
    def busiest(self) -> float:
        """The busiest pod's share of requests (1/pods is even)."""
        return max(self.per_pod.values()) / max(1, sum(self.per_pod.values()))

    def holding_s(self, cache_tokens_per_pod: int) -> float:
        """Seconds of this run's writes one pod's cache holds: its capacity over the uncached
        prompt tokens each pod prefilled per second (averaged over the run, ramps included)."""
        written = (self.prompt_tokens - self.cached_tokens) / max(1, len(self.per_pod))
        return cache_tokens_per_pod / max(1e-9, written / max(1e-9, self.wall_s))

    @property
    def rate(self) -> float:
        """Requests per second achieved over the run."""
        return len(self.ttft_s) / max(1e-9, self.wall_s)


async def _turn(
    http: aiohttp.ClientSession,
    target: Target,
    body: dict[str, Any],
    headers: dict[str, str],
    t0: float,
    stats: Stats,
) -> str:
    """Stream one turn; TTFT at the first chunk with non-empty content (vLLM's first chunk
    may carry only the role)."""
    ttft = None
    text: list[str] = []
    usage: dict[str, Any] = {}
    async with http.post(target.url + "/v1/chat/completions", json=body, headers=headers) as resp:
        if resp.status != 200:
            stats.errors += 1
            return ""
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                content = choice.get("delta", {}).get("content") or ""
                if ttft is None and content:  # the first token, not the role-only chunk
                    ttft = time.monotonic() - t0
                text.append(content)
    stats.ttft_s.append(ttft if ttft is not None else time.monotonic() - t0)
    stats.prompt_tokens += usage.get("prompt_tokens", 0)
    stats.cached_tokens += (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    stats.per_pod[target.name] = stats.per_pod.get(target.name, 0) + 1
    return "".join(text)


TenantFields = Callable[[int], tuple[dict[str, Any], dict[str, str]]]


def salt_in_body(tenant: int) -> tuple[dict[str, Any], dict[str, str]]:
    """What the gateway policy step adds before routing: the tenant's `cache_salt`."""
    return {"cache_salt": f"tenant-{tenant}"}, {}


async def run_trace(
    pick: Pick,
    targets: Sequence[Target],
    sessions: Sequence[Session],
    wl: Workload,
    seed: int,
    tenant_fields: TenantFields = salt_in_body,
    model: str = "bench-model",
    extra_body: dict[str, Any] | None = None,
    session_header: str | None = None,
) -> Stats:
    """Play the sessions at their start times; every turn is picked, streamed, accounted
    (`extra_body`: fields every request carries; `session_header`: a header naming each
    session, as a chat client that opts into session affinity sends it)."""
    stats = Stats(per_pod={t.name: 0 for t in targets})
    rng = random.Random(seed)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as http:
        start = time.monotonic()

        async def session(s: Session, think: list[float]) -> None:
            await asyncio.sleep(max(0.0, start + s.start_s - time.monotonic()))
            extra, headers = tenant_fields(s.tenant)
            if session_header is not None:
                headers = {**headers, session_header: f"session-{s.tenant}-{s.sid}"}
            messages = [{"role": "system", "content": s.system}]
            last: float | None = None
            for question, pause in zip(s.questions, think, strict=True):
                messages.append({"role": "user", "content": question})
                body = {
                    "model": model,
                    "messages": list(messages),
                    "max_tokens": s.max_tokens,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                    **(extra_body or {}),
                    **extra,
                }
                t0 = time.monotonic()
                if last is not None:
                    stats.gaps_s.append(t0 - last)
                last = t0
                sent = dict(headers)  # this turn's own: a pick may add to them
                target = await pick(body, sent)
                answer = await _turn(http, target, body, sent, t0, stats)
                messages.append({"role": "assistant", "content": answer})
                await asyncio.sleep(pause)

        thinks = [[rng.expovariate(1 / wl.think_s) for _ in s.questions] for s in sessions]
        await asyncio.gather(*(session(s, t) for s, t in zip(sessions, thinks, strict=True)))
        stats.wall_s = time.monotonic() - start
    return stats


def use_gie_picker() -> str:
    """The GIE v1.5.0 picker `e2e/cluster build` builds (the harness's default target);
    exits with the reason when it is not built."""

    from . import binary  # noqa: PLC0415 - the harness, only when a picker runs

    found = binary.find_epp_binary(PickerTarget.GIE)
    if found is None:
        raise SystemExit(binary.missing_reason(PickerTarget.GIE))
    return str(found)

"""A stand-in for vLLM at the system boundary: a prefix KV cache, a latency model, its metrics.

One stand-in serves every test and benchmark that needs a model server: the cache
front's tests (which assert what vLLM would have been sent), the Endpoint
Picker's tests (which steer routing through the metrics the picker scrapes),
the routing benchmark and the demo. It never runs a model. What it models:

* **Prefix cache, block by block, like vLLM's.** The prompt is tokenized
  deterministically (`bytes_per_token` bytes of the rendered prompt per token;
  4 by default, what the Endpoint Picker's `estimate` tokenizer assumes too),
  cut into `block_size`-token blocks, and every *full* block gets a chained hash
  (parent hash, the block's token ids, extra keys). Like vLLM, `cache_salt`
  is an extra key of block 0 only, so different salts never share a block, and
  prompt embeddings enter the hash through the content of each embedded row.
  The cache holds `num_gpu_blocks` blocks. Blocks held by a running request
  cannot be evicted; freed blocks join an LRU free queue tail-first (a
  sequence's last block is evicted before its first), and a hit takes a block
  back out of that queue. At most `prompt_tokens - 1` tokens are served from
  cache (vLLM always computes the last token). Only prompt blocks are cached:
  the stand-in's generated tokens are not (vLLM caches them too, but a chat
  template re-renders them on the next turn, so they rarely match anyway).
* **Latency.** A request waits (`vllm:num_requests_waiting`) until it heads the
  queue, fewer than `max_num_seqs` requests run, the prefill lane is free and
  its new blocks fit; then it runs (`vllm:num_requests_running`): prefill
  costs `prefill_s_per_token` per *uncached* prompt token plus
  `step_overhead_s`, one prefill at a time (vLLM's token budget per step,
  simplified to a serial lane), so uncached work is what builds queues; the
  first token is sent when the prefill ends (TTFT), then one token every
  `decode_s_per_token` (decodes run side by side, up to `max_num_seqs`).
* **Metrics that follow that state**, in vLLM's own names and labels:
  `num_requests_waiting/running`, `kv_cache_usage_perc` (blocks held by running
  requests over `num_gpu_blocks`; cached free blocks count as free, as in
  vLLM), `prefix_cache_queries_total`/`prefix_cache_hits_total` (tokens),
  `prompt_tokens_total`, `prompt_tokens_cached_total`, `cache_config_info`.
  A test may pin any reported value (`pod.set(waiting=50)`,
  `upstream.waiting = 7`); unpinned values are live.

Usage in answers: by default the stand-in reports the fixed `prompt_tokens` /
`cached_tokens` a test sets (the front's protocol tests); with
`usage_from_engine=True` it reports what its cache really did, as vLLM with
`--enable-prompt-tokens-details` does. Every request is recorded byte for byte.

Two ways to run it: `StandinUpstream` + `start_standin` on the caller's event
loop (async tests), or `FakePod` in a thread of its own on a fixed `ip:port`
(synchronous harnesses, the Endpoint Picker's scraping). As a process:
`python -m harness.standin --help`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import dataclasses
import hashlib
import json
import random
import threading
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from promptcache.contract.engine import VLLM_DEFAULT_BLOCK_SIZE, VLLM_DEFAULT_MAX_NUM_SEQS
from promptcache.tenancy.salt import is_valid_vllm_salt

# --- configuration -----------------------------------------------------------------------


@dataclass(frozen=True)
class EngineConfig:
    """The stand-in engine's cache geometry and latency coefficients.

    Latency defaults are zero (tests run at full speed). `EngineConfig.gpu_like()`
    gives coefficients in the range of an 8B model on one H100-class GPU
    (about 10k prefill tokens/s, 20 ms per decode step), scaled by `time_scale`.
    """

    model_name: str = "standin"
    served_only: bool = False
    """Answer 404 for a `model` other than `model_name`, as vLLM does. Off by default: most
    tests and benches send whatever model name they like."""
    block_size: int = VLLM_DEFAULT_BLOCK_SIZE
    """Tokens per KV block (vLLM's default is 16)."""
    num_gpu_blocks: int = 4096
    """Cache capacity in blocks (`vllm:cache_config_info{num_gpu_blocks}`)."""
    max_num_seqs: int = VLLM_DEFAULT_MAX_NUM_SEQS
    """Requests running at once (vLLM's `--max-num-seqs`, default 256)."""
    prefill_s_per_token: float = 0.0
    """Seconds of prefill per uncached prompt token (one prefill at a time)."""
    decode_s_per_token: float = 0.0
    """Seconds between generated tokens of one request."""
    step_overhead_s: float = 0.0
    """Fixed seconds added to every prefill (scheduling, the first forward pass)."""
    bytes_per_token: int = 4
    """The stand-in's tokenizer: this many bytes of the rendered prompt make one token."""
    default_max_tokens: int = 16
    """Generated tokens when the request names no `max_tokens`."""
    max_output_tokens: int = 4096
    """Upper bound on generated tokens, whatever the request asks."""
    embed_row_bytes: int = 8192
    """Without torch, bytes of a decoded prompt-embeds payload per embedded token."""

    def __post_init__(self) -> None:
        for name in ("block_size", "num_gpu_blocks", "max_num_seqs", "bytes_per_token"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("prefill_s_per_token", "decode_s_per_token", "step_overhead_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"EngineConfig.{name} must be >= 0, got {getattr(self, name)}")

    @classmethod
    def gpu_like(cls, time_scale: float = 1.0, **overrides: Any) -> EngineConfig:
        """Coefficients of an 8B model on an H100-class GPU, times `time_scale`."""
        base: dict[str, Any] = {
            "prefill_s_per_token": 1e-4 * time_scale,
            "decode_s_per_token": 0.02 * time_scale,
            "step_overhead_s": 0.005 * time_scale,
            "max_num_seqs": 32,
        }
        base.update(overrides)
        return cls(**base)


# --- tokenizing the request ------------------------------------------------------------------


def _torch_rows(raw: bytes) -> list[bytes] | None:
    """Each row's bytes of a `torch.save`d 2-D tensor; None without torch or a tensor."""
    try:
        import io  # noqa: PLC0415 - only prompt-embeds requests need torch

        import torch  # noqa: PLC0415

        tensor = torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
    except Exception:  # torch absent, or not a torch payload: the caller falls back
        return None
    if not isinstance(tensor, torch.Tensor):
        return None
    t = tensor.to_dense() if tensor.is_sparse else tensor
    if t.dim() == 3 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 2:
        return None
    return [bytes(row.contiguous().view(torch.uint8).numpy().tobytes()) for row in t]


def _embed_rows(data: str, row_bytes: int) -> list[bytes]:
    """The rows of one base64 `torch.save` payload, each row's bytes (one token each)."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raw = data.encode()
    rows = _torch_rows(raw)
    if rows is not None:
        return rows
    return [raw[i : i + row_bytes] for i in range(0, len(raw), row_bytes)] or [b""]


def _text_tokens(text: bytes, bytes_per_token: int) -> list[int]:
    return [
        int.from_bytes(text[i : i + bytes_per_token], "little")
        for i in range(0, len(text), bytes_per_token)
    ]


@dataclass(frozen=True)
class Prompt:
    """A request's prompt as the engine sees it: token ids and per-token extra keys."""

    tokens: tuple[int, ...]
    embeds: tuple[bytes | None, ...]
    """Per token: the hash of its embedded row, or None for a text token."""
    salt: str | None

    def __len__(self) -> int:
        return len(self.tokens)


def parse_prompt(body: dict[str, Any], chat: bool, cfg: EngineConfig) -> Prompt:
    """Tokenize a completions or chat body the way the stand-in's model would see it.

    Chat messages are rendered `<|role|>\\ncontent\\n` (an append-only template:
    a conversation's next turn extends the previous prompt byte for byte).
    """
    segments: list[bytes | list[bytes]] = []  # text, or embedded rows

    def add_text(text: str) -> None:
        segments.append(text.encode("utf-8", "surrogatepass"))

    if chat:
        for message in body.get("messages") or []:
            if not isinstance(message, dict):
                continue
            add_text(f"<|{message.get('role', '')}|>\n")
            content = message.get("content")
            if isinstance(content, str):
                add_text(content)
            elif isinstance(content, list):
                for part in content:
                    if not isinstance(part, dict):
                        continue
                    if part.get("type") == "text":
                        add_text(str(part.get("text", "")))
                    elif part.get("type") == "prompt_embeds":
                        segments.append(_embed_rows(str(part.get("data", "")), cfg.embed_row_bytes))
            add_text("\n")
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            add_text(prompt)
        elif isinstance(prompt, list):
            if all(isinstance(t, int) for t in prompt):
                segments.append(b"".join(int(t).to_bytes(4, "little", signed=True) for t in prompt))
            else:
                add_text("".join(str(p) for p in prompt))
        embeds = body.get("prompt_embeds")
        for data in [embeds] if isinstance(embeds, str) else (embeds or []):
            segments.append(_embed_rows(str(data), cfg.embed_row_bytes))
    tokens: list[int] = []
    extras: list[bytes | None] = []
    pending = b""
    for seg in segments:
        if isinstance(seg, bytes):
            pending += seg
            continue
        ids = _text_tokens(pending, cfg.bytes_per_token)
        tokens += ids
        extras += [None] * len(ids)
        pending = b""
        for row in seg:
            tokens.append(0)
            extras.append(hashlib.sha256(row).digest())
    ids = _text_tokens(pending, cfg.bytes_per_token)
    tokens += ids
    extras += [None] * len(ids)
    salt = body.get("cache_salt")
    return Prompt(tuple(tokens), tuple(extras), salt if isinstance(salt, str) and salt else None)


def block_hashes(prompt: Prompt, block_size: int) -> list[bytes]:
    """Chained hashes of the prompt's full blocks; block 0 carries the salt (vLLM's rule)."""
    out: list[bytes] = []
    parent = b"standin-root"
    for start in range(0, len(prompt.tokens) - block_size + 1, block_size):
        h = hashlib.sha256(parent)
        h.update(array("q", prompt.tokens[start : start + block_size]).tobytes())
        for i, extra in enumerate(prompt.embeds[start : start + block_size]):
            if extra is not None:
                h.update(b"E%d" % i + extra)
        if start == 0 and prompt.salt is not None:
            h.update(b"S" + prompt.salt.encode("utf-8", "surrogatepass"))
        parent = h.digest()
        out.append(parent)
    return out


# --- the block cache ---------------------------------------------------------------------


@dataclass
class Allocation:
    """Blocks one running request holds: cached prompt blocks (by hash) and anonymous ones."""

    hashes: list[bytes]
    anonymous: int
    cached_tokens: int


class PrefixCache:
    """vLLM's block pool in miniature: ref-counted hashed blocks and an LRU of free ones.

    Thread-safe: the engine mutates it from its event loop while a benchmark's
    oracle reads it from another thread.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._refs: dict[bytes, int] = {}
        """Every cached block (hash) with the number of running requests holding it."""
        self._free: OrderedDict[bytes, None] = OrderedDict()
        """Cached blocks nobody holds, least recently freed first: evicted in this order."""
        self._anonymous = 0
        """Held blocks without a hash (partial last blocks, generated tokens)."""
        self.evictions = 0
        self._lock = threading.Lock()

    # -- reading
    def match(self, hashes: Sequence[bytes], prompt_tokens: int) -> int:
        """Tokens of this prompt the cache holds now (full leading blocks, at most n - 1)."""
        with self._lock:
            return self._match_blocks(hashes, prompt_tokens) * self.block_size

    def _match_blocks(self, hashes: Sequence[bytes], prompt_tokens: int) -> int:
        limit = max(0, prompt_tokens - 1) // self.block_size
        n = 0
        for h in hashes[:limit]:
            if h not in self._refs:
                break
            n += 1
        return n

    @property
    def held(self) -> int:
        """Blocks held by running requests."""
        with self._lock:
            return self._held()

    def _held(self) -> int:
        return len(self._refs) - len(self._free) + self._anonymous

    @property
    def cached(self) -> int:
        """Blocks with a hash (held or free): what a later request may hit."""
        with self._lock:
            return len(self._refs)

    def usage(self) -> float:
        """vLLM's `kv_cache_usage_perc`: held blocks over all blocks."""
        with self._lock:
            return self._held() / self.num_blocks

    def contains(self, h: bytes) -> bool:
        with self._lock:
            return h in self._refs

    # -- changing
    def allocate(
        self, hashes: Sequence[bytes], prompt_tokens: int, extra_blocks: int
    ) -> Allocation | None:
        """Hold the prompt's blocks (hits reused, misses filled) plus `extra_blocks`
        anonymous ones; None when they do not fit beside the blocks already held."""
        with self._lock:
            hit = self._match_blocks(hashes, prompt_tokens)
            new = [h for h in hashes[hit:] if h not in self._refs]
            revived = [h for h in hashes if h in self._free]
            need = len(new) + extra_blocks
            if self._held() + len(revived) + need > self.num_blocks:
                return None
            for h in hashes:
                if h in self._free:
                    del self._free[h]
            while len(self._refs) + self._anonymous + need > self.num_blocks:
                victim, _ = self._free.popitem(last=False)
                del self._refs[victim]
                self.evictions += 1
            for h in hashes:
                self._refs[h] = self._refs.get(h, 0) + 1
            self._anonymous += extra_blocks
            return Allocation(list(hashes), extra_blocks, hit * self.block_size)

    def release(self, alloc: Allocation) -> None:
        """Drop a finished request's hold; its blocks stay cached until evicted."""
        with self._lock:
            for h in reversed(alloc.hashes):  # tail first: the last block is evicted first
                self._refs[h] -= 1
                if self._refs[h] == 0:
                    self._free[h] = None
            self._anonymous -= alloc.anonymous

    def clear(self) -> None:
        """Forget every unheld block (vLLM's `/reset_prefix_cache`)."""
        with self._lock:
            for h in self._free:
                del self._refs[h]
            self._free.clear()

    def check(self) -> None:
        """Internal invariants (for property tests)."""
        with self._lock:
            assert self._anonymous >= 0
            assert len(self._refs) + self._anonymous <= self.num_blocks
            assert all(self._refs[h] == 0 for h in self._free)
            assert all(r >= 0 for r in self._refs.values())
            assert sum(1 for r in self._refs.values() if r == 0) == len(self._free)


# --- the engine --------------------------------------------------------------------------


@dataclass
class LatencyHistogram:
    """A Prometheus histogram as vLLM exports it (cumulative `le` buckets, `_sum`, `_count`)."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def observe(self, seconds: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.buckets)
        for i, le in enumerate(self.buckets):
            if seconds <= le:
                self.counts[i] += 1
        self.total += seconds
        self.count += 1

    def render(self, name: str, help_: str, labels: str) -> str:
        counts = self.counts or [0] * len(self.buckets)
        lines = [f"# HELP vllm:{name} {help_}", f"# TYPE vllm:{name} histogram"]
        for le, n in zip(self.buckets, counts, strict=True):
            lines.append(f'vllm:{name}_bucket{{{labels},le="{le}"}} {float(n)}')
        lines.append(f'vllm:{name}_bucket{{{labels},le="+Inf"}} {float(self.count)}')
        lines.append(f"vllm:{name}_sum{{{labels}}} {self.total}")
        lines.append(f"vllm:{name}_count{{{labels}}} {float(self.count)}")
        return "\n".join(lines) + "\n"


# vLLM's own bucket boundaries (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


@dataclass
class Served:
    """What the engine did for one request (also the benchmark's ground truth)."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    queued_s: float = 0.0
    ttft_s: float = 0.0


class Engine:
    """Queueing, prefill and decode over a `PrefixCache`; lives on one event loop."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.cache = PrefixCache(config.num_gpu_blocks, config.block_size)
        self._waiting: deque[_Queued] = deque()
        self._running = 0
        self._prefilling = False
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_total = 0
        self.queued_prefill_s = 0.0
        """Estimated prefill seconds of the waiting requests (an oracle router reads it)."""
        self.prefill_ends_at = 0.0
        """`time.monotonic()` when the running prefill ends."""
        self.ttft = LatencyHistogram(TTFT_BUCKETS)
        self.e2e_latency = LatencyHistogram(E2E_BUCKETS)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return self._running

    def prompt(self, body: dict[str, Any], chat: bool) -> tuple[Prompt, list[bytes]]:
        p = parse_prompt(body, chat, self.config)
        return p, block_hashes(p, self.config.block_size)

    def would_hit(self, body: dict[str, Any], chat: bool = True) -> tuple[int, int]:
        """(prompt tokens, tokens the cache holds for it now): an oracle's view."""
        p, hashes = self.prompt(body, chat)
        return len(p), self.cache.match(hashes, len(p))

    def output_tokens(self, body: dict[str, Any]) -> int:
        asked = body.get("max_completion_tokens") or body.get("max_tokens")
        n = asked if isinstance(asked, int) and asked > 0 else self.config.default_max_tokens
        return min(n, self.config.max_output_tokens)

    def blocks_for(self, prompt_tokens: int, completion_tokens: int) -> tuple[int, int]:
        """(full prompt blocks, other blocks) a request holds while it runs."""
        bs = self.config.block_size
        full = prompt_tokens // bs
        total = -(-(prompt_tokens + completion_tokens) // bs)
        return full, total - full

    def prefill_estimate_s(self, prompt_tokens: int, cached_tokens: int) -> float:
        """The latency model's prefill time for a prompt with this many cached tokens."""
        cfg = self.config
        return cfg.step_overhead_s + (prompt_tokens - cached_tokens) * cfg.prefill_s_per_token

    def ttft_estimate_s(self, body: dict[str, Any], chat: bool = True) -> float:
        """What the first token of `body` would wait here now: the running prefill's rest,
        the queued prefills, its own uncached prefill. An oracle router's view."""
        n, cached = self.would_hit(body, chat)
        rest = max(0.0, self.prefill_ends_at - time.monotonic())
        return rest + self.queued_prefill_s + self.prefill_estimate_s(n, cached)

    def refusal(self, prompt: Prompt, hashes: list[bytes], completion_tokens: int) -> str | None:
        """Why this request can never run here (vLLM answers 400), or None."""
        _, extra = self.blocks_for(len(prompt), completion_tokens)
        if len(hashes) + extra > self.config.num_gpu_blocks:
            return (
                f"This request needs {len(hashes) + extra} KV-cache blocks "
                f"({len(prompt)} prompt + {completion_tokens} completion tokens); "
                f"the cache has {self.config.num_gpu_blocks}: shorten the prompt or max_tokens"
            )
        return None

    def _schedule(self) -> None:
        """FCFS, like vLLM's scheduler: admit the queue's head while a sequence slot and the
        prefill lane are free and its blocks fit; a head that does not fit blocks the rest."""
        while self._waiting and not self._prefilling:
            if self._running >= self.config.max_num_seqs:
                return
            head = self._waiting[0]
            alloc = self.cache.allocate(head.hashes, head.prompt_tokens, head.extra)
            if alloc is None:
                return
            self._waiting.popleft()
            self._running += 1
            self._prefilling = True
            head.admitted.set_result(alloc)

    def _finish(self, alloc: Allocation) -> None:
        self.cache.release(alloc)
        self._running -= 1
        self._schedule()

    async def _admit(self, hashes: list[bytes], prompt_tokens: int, extra: int) -> Allocation:
        """Queue, and return once admitted: the request then runs and holds the prefill lane."""
        entry = _Queued(asyncio.get_running_loop().create_future(), hashes, prompt_tokens, extra)
        self._waiting.append(entry)
        self._schedule()
        try:
            return await entry.admitted
        except asyncio.CancelledError:
            if entry.admitted.done() and not entry.admitted.cancelled():
                self._prefilling = False  # admitted, then the client went away
                self._finish(entry.admitted.result())
            elif entry in self._waiting:
                self._waiting.remove(entry)
                self._schedule()
            raise

    @contextlib.asynccontextmanager
    async def admitted(self, prompt: Prompt, hashes: list[bytes], completion_tokens: int) -> Any:
        """Wait for a slot and the prefill lane, hold the blocks, prefill; yields `Served`
        once the first token may be sent, and releases everything on exit."""
        problem = self.refusal(prompt, hashes, completion_tokens)
        if problem is not None:
            raise ValueError(problem)
        _, extra = self.blocks_for(len(prompt), completion_tokens)
        t0 = time.monotonic()
        estimate = self.prefill_estimate_s(len(prompt), self.cache.match(hashes, len(prompt)))
        self.queued_prefill_s += estimate
        try:
            alloc = await self._admit(hashes, len(prompt), extra)
        finally:
            self.queued_prefill_s -= estimate
        served = Served(len(prompt), alloc.cached_tokens, completion_tokens)
        self.requests_total += 1
        self.prefix_queries += len(prompt)
        self.prefix_hits += alloc.cached_tokens
        self.prompt_tokens_total += len(prompt)
        served.queued_s = time.monotonic() - t0
        try:
            try:
                delay = self.prefill_estimate_s(len(prompt), alloc.cached_tokens)
                self.prefill_ends_at = time.monotonic() + delay
                if delay > 0:
                    await asyncio.sleep(delay)
            finally:
                self._prefilling = False
                self._schedule()
            served.ttft_s = time.monotonic() - t0
            self.ttft.observe(served.ttft_s)
            yield served
            self.generation_tokens_total += completion_tokens
            self.e2e_latency.observe(time.monotonic() - t0)
        finally:
            self._finish(alloc)


@dataclass(eq=False)
class _Queued:
    admitted: asyncio.Future[Allocation]
    hashes: list[bytes]
    prompt_tokens: int
    extra: int


# --- metrics -----------------------------------------------------------------------------


@dataclass
class VllmMetrics:
    """The values a vLLM pod reports. As configuration: the model name and cache geometry
    the stand-in uses; a load field given here (or later through `set`) is pinned,
    otherwise it is read live from the engine."""

    model_name: str = "test-model"
    waiting: int | None = None
    running: int | None = None
    kv_cache_usage: float | None = None
    block_size: int = VLLM_DEFAULT_BLOCK_SIZE
    num_gpu_blocks: int = 31250
    prefix_cache_queries: int | None = None
    prefix_cache_hits: int | None = None


def render_metrics(m: VllmMetrics, prompt_tokens: int = 0, cached_tokens: int = 0) -> str:
    """vLLM's own exposition for the metrics the picker and the operator read."""
    labels = f'engine="0",model_name="{m.model_name}"'
    cache_labels = (
        # the labels vLLM 0.32 writes (its CPU build, held to it by the conformance test);
        # calculate_kv_scales, cpu_offload_gb and swap_space* are gone from it
        f'block_size="{m.block_size}",cache_dtype="auto",'
        f'enable_prefix_caching="True",engine="0",'
        f'gpu_memory_utilization="0.9",is_attention_free="False",'
        f'num_cpu_blocks="None",num_gpu_blocks="{m.num_gpu_blocks}",'
        f'num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256",'
        f'sliding_window="None"'
    )

    def series(name: str, kind: str, help_: str, value: float | None) -> str:
        return (
            f"# HELP vllm:{name} {help_}\n# TYPE vllm:{name} {kind}\n"
            f"vllm:{name}{{{labels}}} {float(value or 0)}\n"
        )

    return (
        series(
            "num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            m.running,
        )
        + series(
            "num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            m.waiting,
        )
        + series(
            "kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            m.kv_cache_usage,
        )
        + series(
            "prefix_cache_queries_total",
            "counter",
            "Prefix cache queries, in queried tokens.",
            m.prefix_cache_queries,
        )
        + series(
            "prefix_cache_hits_total",
            "counter",
            "Prefix cache hits, in cached tokens.",
            m.prefix_cache_hits,
        )
        + series(
            "prompt_tokens_total", "counter", "Number of prefill tokens processed.", prompt_tokens
        )
        + series(
            "prompt_tokens_cached_total",
            "counter",
            "Number of cached prompt tokens.",
            cached_tokens,
        )
        + "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        f"vllm:cache_config_info{{{cache_labels}}} 1.0\n"
    )


# --- the HTTP server ---------------------------------------------------------------------


@dataclass
class Recorded:
    """One request as the stand-in received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    query: str = ""
    """The query string exactly as received (percent-escapes kept)."""

    def json(self) -> Any:
        return json.loads(self.body)


def _record(request: web.Request, body: bytes) -> Recorded:
    query = request.raw_path.partition("?")[2]
    return Recorded(request.method, request.path, dict(request.headers), body, query)


VOCAB = [f"w{i:03d}" for i in range(1000)]


@dataclass
class StandinUpstream:
    """State and knobs of one stand-in server; tests change the knobs between requests.

    `prompt_tokens`/`cached_tokens` are the usage reported while `usage_from_engine`
    is off (`cached_tokens=None` omits `prompt_tokens_details`, as vLLM does without
    `--enable-prompt-tokens-details`). `running`/`waiting`/`kv_usage` pin metric
    values when set; None reports the engine's live state.
    """

    requests: list[Recorded] = field(default_factory=list)
    prompt_tokens: int = 42
    cached_tokens: int | None = 16
    usage_from_engine: bool = False
    chunks: int = 3
    """Generated tokens (stream chunks) while `usage_from_engine` is off."""
    chunk_delay: float = 0.0
    hold_streams: asyncio.Event | None = None
    """When set to an event, each stream pauses after its first chunk until the event is
    set: a stream stays in flight exactly as long as a test needs, however slow the machine."""
    response_delay: float = 0.0
    healthy: bool = True
    fail_next: tuple[int, bytes] | None = None
    cancelled: int = 0
    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None
    pinned: VllmMetrics = field(
        default_factory=lambda: VllmMetrics(
            model_name="standin", block_size=VLLM_DEFAULT_BLOCK_SIZE, num_gpu_blocks=4096
        )
    )
    """The metric values reported when pinned (`FakePod.set` writes here)."""
    config: EngineConfig = field(default_factory=EngineConfig)
    engine: Engine = field(init=False)
    served: list[Served] = field(default_factory=list)
    scrapes: int = 0
    started: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.engine = Engine(self.config)
        self.pinned.model_name = self.config.model_name
        self.pinned.block_size = self.config.block_size
        self.pinned.num_gpu_blocks = self.config.num_gpu_blocks

    def reconfigure(self, config: EngineConfig) -> None:
        """A fresh engine (empty cache, zeroed counters) with new settings; between runs only."""
        self.config = config
        self.__post_init__()

    def metrics(self) -> VllmMetrics:
        """The values reported now: pinned where pinned, else the engine's."""
        e, p = self.engine, self.pinned

        def pick(*values: Any) -> Any:
            return next((v for v in values if v is not None), None)

        return VllmMetrics(
            model_name=p.model_name,
            waiting=pick(self.waiting, p.waiting, e.waiting),
            running=pick(self.running, p.running, e.running),
            kv_cache_usage=pick(self.kv_usage, p.kv_cache_usage, e.cache.usage()),
            block_size=p.block_size,
            num_gpu_blocks=p.num_gpu_blocks,
            prefix_cache_queries=pick(p.prefix_cache_queries, e.prefix_queries),
            prefix_cache_hits=pick(p.prefix_cache_hits, e.prefix_hits),
        )

    def usage(self, served: Served | None = None) -> dict[str, Any]:
        if self.usage_from_engine and served is not None:
            prompt, completion, cached = (
                served.prompt_tokens,
                served.completion_tokens,
                served.cached_tokens,
            )
        else:
            prompt, completion, cached = self.prompt_tokens, self.chunks, self.cached_tokens or 0
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        if self.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return usage

    def _text(self, served: Served, seed: bytes) -> list[str]:
        if not self.usage_from_engine:
            return [f"tok{i} " for i in range(served.completion_tokens)]
        rng = random.Random(seed)
        return [rng.choice(VOCAB) + " " for _ in range(served.completion_tokens)]

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(_record(request, body))
        self.started.set()
        try:
            if self.fail_next is not None:
                status, payload = self.fail_next
                self.fail_next = None
                return web.Response(status=status, body=payload, content_type="application/json")
            if self.response_delay:
                await asyncio.sleep(self.response_delay)
            try:
                req = json.loads(body)
            except ValueError:
                return _error(400, "the body is not JSON")
            if not isinstance(req, dict):
                return _error(400, "the body must be a JSON object")
            chat = request.path.endswith("/chat/completions")
            refused = self._refused(req)
            if refused is not None:
                return refused
            prompt, hashes = self.engine.prompt(req, chat)
            completion = self.engine.output_tokens(req) if self.usage_from_engine else self.chunks
            seed = hashes[-1] if hashes else body[:64]
            problem = self.engine.refusal(prompt, hashes, completion)
            if problem is not None:
                if self.usage_from_engine:
                    return _error(400, problem)
                # fixed usage (protocol tests): answer without the engine, as before
                return await self._respond(request, req, chat, Served(0, 0, completion), seed)
            async with self.engine.admitted(prompt, hashes, completion) as served:
                self.served.append(served)
                return await self._respond(request, req, chat, served, seed)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    def _refused(self, req: dict[str, Any]) -> web.Response | None:
        """What vLLM refuses before it schedules anything, with its status and error type."""
        salt = req.get("cache_salt")
        if salt is not None and not (isinstance(salt, str) and is_valid_vllm_salt(salt)):
            return _error(
                400,
                "Parameter 'cache_salt' must be at most 128 characters and must not contain "
                "'@', '/', '\\', or the NUL character.",
                param="cache_salt",
            )
        model = req.get("model")
        if self.config.served_only and model is not None and model != self.config.model_name:
            return _error(
                404,
                f"The model `{model}` does not exist. Valid aliases: {self.config.model_name}.",
                error_type="NotFoundError",
            )
        return None

    async def _respond(
        self, request: web.Request, req: dict[str, Any], chat: bool, served: Served, seed: bytes
    ) -> web.StreamResponse:
        if req.get("stream"):
            return await self._stream(request, req, chat, served, seed)
        if self.config.decode_s_per_token and served.completion_tokens:
            await asyncio.sleep(self.config.decode_s_per_token * served.completion_tokens)
        if self.chunk_delay:
            await asyncio.sleep(self.chunk_delay * served.completion_tokens)
        return self._whole(req, chat, served, seed)

    def _whole(self, req: dict[str, Any], chat: bool, served: Served, seed: bytes) -> web.Response:
        text = "".join(self._text(served, seed)) if self.usage_from_engine else "ok " * self.chunks
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return web.json_response(
            {
                "id": "cmpl-standin",
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": req.get("model", self.config.model_name),
                "choices": [choice],
                "usage": self.usage(served),
            }
        )

    async def _stream(
        self, request: web.Request, req: dict[str, Any], chat: bool, served: Served, seed: bytes
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk_object = "chat.completion.chunk" if chat else "text_completion"  # vLLM's names
        step = self.config.decode_s_per_token + self.chunk_delay
        for i, piece in enumerate(self._text(served, seed)):
            if i and self.config.decode_s_per_token:
                await asyncio.sleep(self.config.decode_s_per_token)
            delta: dict[str, Any] = (
                {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                if chat
                else {"index": 0, "text": piece, "finish_reason": None}
            )
            chunk = {"id": "cmpl-standin", "object": chunk_object, "choices": [delta]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if i == 0 and self.hold_streams is not None:
                await self.hold_streams.wait()
            if self.chunk_delay and step:
                await asyncio.sleep(self.chunk_delay)
        options = req.get("stream_options") or {}
        if options.get("include_usage"):
            final: dict[str, Any] = {
                "id": "cmpl-standin",
                "object": chunk_object,
                "choices": [],
                "usage": self.usage(served),
            }
            await response.write(f"data: {json.dumps(final)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _other(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.requests.append(_record(request, body))
        return web.json_response({"path": request.path, "echo": body.decode("utf-8", "replace")})

    async def _models(self, request: web.Request) -> web.Response:
        self.requests.append(_record(request, b""))
        name = self.pinned.model_name
        return web.json_response({"object": "list", "data": [{"id": name, "object": "model"}]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        self.scrapes += 1
        e = self.engine
        m = self.metrics()
        text = render_metrics(m, e.prompt_tokens_total, e.prefix_hits)
        labels = f'engine="0",model_name="{m.model_name}"'
        text += e.ttft.render(
            "time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels
        )
        text += e.e2e_latency.render(
            "e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", labels
        )
        return web.Response(text=text, content_type="text/plain")

    def app(self) -> web.Application:
        """The aiohttp application serving this stand-in."""
        app = web.Application(client_max_size=1 << 30)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_get("/health", self._health)
        app.router.add_get("/ready", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_route("*", "/{tail:.*}", self._other)
        return app


def _error(
    status: int, message: str, *, param: str | None = None, error_type: str = "BadRequestError"
) -> web.Response:
    """vLLM's error body (`{"error": {message, type, param, code}}`)."""
    return web.json_response(
        {"error": {"message": message, "type": error_type, "param": param, "code": status}},
        status=status,
    )


async def start_standin(
    standin: StandinUpstream, host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, str]:
    """Serve a stand-in on loopback; returns the runner (to clean up) and its base URL."""
    runner = web.AppRunner(standin.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, f"http://{host}:{bound}"


# --- one pod in a thread of its own --------------------------------------------------------


@dataclass
class ServedRequest:
    """One request the pod answered (what reached it), headers lower-cased, body parsed."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class FakePod:
    """One model-server pod's stand-in on `ip:port`, served from its own thread and loop.

    `metrics` configures the engine (model name, block size, `num_gpu_blocks`) and
    pins any load value it sets; `config` overrides the engine settings (latency).
    """

    def __init__(
        self,
        name: str,
        ip: str,
        port: int,
        metrics: VllmMetrics | None = None,
        *,
        config: EngineConfig | None = None,
        usage_from_engine: bool = True,
    ) -> None:
        if not ip.startswith("127."):
            raise ValueError(f"fake pods bind loopback only, got {ip}")
        self.name = name
        self.ip = ip
        self.port = port
        m = metrics or VllmMetrics()
        base = config or EngineConfig()
        cfg = dataclasses.replace(
            base, model_name=m.model_name, block_size=m.block_size, num_gpu_blocks=m.num_gpu_blocks
        )
        self.standin = StandinUpstream(config=cfg, usage_from_engine=usage_from_engine)
        self.standin.pinned = dataclasses.replace(m)
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"fakepod-{name}", daemon=True
        )

    @property
    def address(self) -> str:
        """`ip:port`, the form the picker writes into x-gateway-destination-endpoint."""
        return f"{self.ip}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def engine(self) -> Engine:
        return self.standin.engine

    def _call(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self) -> FakePod:
        self._thread.start()

        async def up() -> web.AppRunner:
            runner, _ = await start_standin(self.standin, self.ip, self.port)
            return runner

        self._runner = self._call(up())
        self.port = int(self._runner.addresses[0][1])  # the kernel's choice when port was 0
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            if self._runner is not None:
                with contextlib.suppress(Exception):
                    self._call(self._runner.cleanup(), timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        if not self._loop.is_running():
            self._loop.close()

    def reset(self, config: EngineConfig | None = None) -> None:
        """An empty cache and zeroed counters (optionally new engine settings), e.g. between
        benchmark runs; only when no request is in flight."""
        cfg = config or self.standin.config

        async def do() -> None:
            self.standin.reconfigure(cfg)
            self.standin.served.clear()
            self.standin.requests.clear()

        self._call(do())

    def set(self, **values: Any) -> None:
        """Pin reported metrics, e.g. `pod.set(waiting=50, kv_cache_usage=0.99)`; a value of
        None returns a load field to the engine's live value."""
        pinned = self.standin.pinned
        for key, value in values.items():
            if not hasattr(pinned, key):
                raise AttributeError(f"VllmMetrics has no field {key!r}")
            setattr(pinned, key, value)

    def snapshot(self) -> VllmMetrics:
        """A copy of the values currently reported."""
        return self.standin.metrics()

    @property
    def scrapes(self) -> int:
        return self.standin.scrapes

    @property
    def served(self) -> list[ServedRequest]:
        out = []
        for r in list(self.standin.requests):
            if r.method != "POST":
                continue
            try:
                body = json.loads(r.body or b"{}")
            except ValueError:
                continue
            out.append(ServedRequest(r.path, {k.lower(): v for k, v in r.headers.items()}, body))
        return out


# --- as a process ----------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m harness.standin",
        description="A stand-in vLLM: prefix KV cache, latency model, vLLM metrics.",
    )
    ap.add_argument("port", nargs="?", type=int, default=0)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--model", default="standin")
    ap.add_argument("--block-size", type=int, default=VLLM_DEFAULT_BLOCK_SIZE)
    ap.add_argument("--num-gpu-blocks", type=int, default=4096)
    ap.add_argument("--max-num-seqs", type=int, default=VLLM_DEFAULT_MAX_NUM_SEQS)
    ap.add_argument("--prefill-s-per-token", type=float, default=0.0)
    ap.add_argument("--decode-s-per-token", type=float, default=0.0)
    ap.add_argument("--step-overhead-s", type=float, default=0.0)
    ap.add_argument(
        "--usage-from-engine",
        action="store_true",
        help="report the cache's real prompt/cached tokens (default: fixed 42/16, for tests)",
    )
    return ap


async def _serve_forever(args: argparse.Namespace) -> None:
    cfg = EngineConfig(
        model_name=args.model,
        block_size=args.block_size,
        num_gpu_blocks=args.num_gpu_blocks,
        max_num_seqs=args.max_num_seqs,
        prefill_s_per_token=args.prefill_s_per_token,
        decode_s_per_token=args.decode_s_per_token,
        step_overhead_s=args.step_overhead_s,
    )
    standin = StandinUpstream(chunks=1, config=cfg, usage_from_engine=args.usage_from_engine)
    runner, url = await start_standin(standin, args.host, args.port)
    print(url, flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: Iterable[str] | None = None) -> None:
    """`python -m harness.standin [PORT] [options]`."""
    args = _parser().parse_args(list(argv) if argv is not None else None)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_forever(args))


if __name__ == "__main__":
    main()

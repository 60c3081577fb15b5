#!/usr/bin/env python3
"""Routing quality as the cache hits and queueing it causes, on the real Endpoint Picker.

What a user buys from prefix-aware routing is GPU time: prompt tokens served from
cache instead of prefilled again, and a shorter time to first token, without piling
load on one pod. This benchmark measures exactly that, per router, in one run:

* **Pods**: N stand-in vLLM pods (`harness.standin`): a block-level prefix
  cache (16-token blocks, `num_gpu_blocks`, LRU, salt-scoped), an FCFS queue with
  `max_num_seqs`, prefill cost per *uncached* token and a decode cost per token
  (`EngineConfig.gpu_like(time_scale)`: an 8B model on an H100-class GPU, slowed
  down `time_scale` times so a laptop can drive it). Their `/metrics` follow that
  state, and the picker reads them as it reads vLLM's.
* **Workload** (production-like, fixed seed): tenants with a shared system prompt
  each (their conversations carry the tenant's `cache_salt`, as the gateway policy
  step adds it), many multi-turn chats whose prompts grow turn by turn (the
  stand-in's answers are sent back as history), and a few long-document sessions.
  Sessions arrive as a Poisson process; a session's next turn follows its answer
  after a think time. Load levels are multiples of the pool's *capacity*: the
  request rate N pods sustain when each request prefills its whole history except
  the system prompt (what routing that ignores prefixes gets, roughly).
* **Routers**, each on fresh pods (empty caches) and the same trace: `random`;
  `load-only` (the real picker with queue + kv-cache scorers, 1:1); `llm-d default`
  (the real picker, prefix 3 / queue 2 / kv 2, plugin defaults); `generated` (the
  real picker with the config `promptcache render` writes for examples/minimal.yaml);
  `oracle` (knows every pod's cache and queue: sends each request where the latency
  model predicts the earliest first token).
* **Reported**: cached prompt-token fraction (from the pods' `usage`), TTFT p50/p99
  measured by the client over real sockets (including the pick), the busiest pod's
  share of requests; ratios against load-only and the oracle; one PNG per load level.

**Why 1024 blocks and a 5 s think time: the cache is scarce, as in production.** A pod
still holds a conversation's prefix when its next turn arrives only if the pod has not
written a cache's worth of other traffic in between, so what must be production-like is
the ratio of the gap between two turns to the time a pod's cache holds its traffic.
Production model: an 8B model (Llama-3.1-8B: 32 layers x 8 KV heads x 128 x K,V x 2 bytes
= 128 KiB per token) on an 80 GB H100 at vLLM defaults (`gpu_memory_utilization` 0.9,
16-token blocks): ~72 GiB, less ~15 GiB of weights and ~3 GiB of activations and graphs,
leaves ~54 GiB, **~27,000 blocks (~430k tokens)**. At 0.7 of its prefill capacity (10k
tokens/s, `gpu_like`) it writes ~7k new tokens/s, so its cache holds the last **~60 s** of
traffic. Reuse gaps measured in production (Wang et al., "KVCache Cache in the Wild",
USENIX ATC '25, Alibaba's traces): 80 % of reuses within 10 s for API traffic, within 10
min for chat. Taking a chat turn every ~30 s (read a short answer, type the next question),
the next turn comes after the pod wrote about **half** its cache (gap / holding ~0.5).
Here the pods are 6x slower (~1.7k prefill tokens/s): 1024 blocks (16k tokens; the
workload's longest prompt, 7.9k tokens, fits twice) hold ~14 s of traffic at 0.7x, and a
turn comes back after the 5 s think time, its answer (~1 s) and its wait: gap / holding
~0.45 estimated; the bench prints it measured on load-only routing (a lower bound: the
holding time is averaged over ramp-up and drain): 0.17 at 0.7x and 0.81 at 1.5x in the
`--full` run, between production API traffic (~0.15) and chat (~0.5). The old defaults
(2048 blocks, 0.3 s think time) gave ~0.05, and the pool's cache
(131k tokens) exceeded all a run sends (~50k): nothing was ever evicted, an agent loop
answering within a quarter second on an infinite cache. Sessions then last ~30 s, so
arrivals span 60 s (`--window`) for the offered load to hold between ramp-up and drain.
`--num-gpu-blocks`, `--think` and `--window` change them.

**What routing cannot change** is printed per trace: about half of all prompt tokens are
the tenants' system prompts, which every pod soon holds whatever the router (the floor),
and a first turn is never cached (the ceiling). "2x load-only's cached fraction" needs a
ceiling above twice the floor, which this workload does not have at any cache size.

The picker is the upstream GIE v1.5.0 EPP that `e2e/cluster build` builds (GIE
needs an API server: the pods are kwok pods of the local control plane; the
stand-ins bind on their loopback IPs). It runs with its rendered args: alone on its
port it serves ext_proc over TLS, reached through the harness's TLS relay as a gateway
would (`--plaintext-picker` turns TLS off). `--real` routes among 2-3 real vLLM pods
instead (`bench/epp_routing_real.py`, its own options). Run: `python -m bench.epp_routing`
(about 25 minutes on 2 shared cores; `--full`, about an hour: 8 pods, 5 load levels;
`--out DIR` for the PNGs, default docs/img/).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from harness import pytest_cluster  # e2e/: the same local control plane the tests use
from harness.epp.launch import Launcher, routing_patch
from harness.epp.pool import PoolOnCluster
from harness.epp.traffic import (
    LLMD_DEFAULT,
    LOAD_ONLY,
    REPORTED_BLOCK_SIZE,
    VARIANTS,
    Bounds,
    Pick,
    Session,
    Stats,
    Target,
    Workload,
    bounds,
    for_gie,
    oracle_router,
    picker_router,
    random_router,
    run_trace,
    schedule,
    use_gie_picker,
)
from harness.standin import EngineConfig, FakePod

ROOT = Path(__file__).resolve().parents[1]

# --- driving it ---------------------------------------------------------------------------------


@dataclass
class Row:
    router: str
    load: float
    stats: Stats


def plot(rows: list[Row], load: float, rate: float, out: Path, prefix: str) -> Path:
    import matplotlib  # noqa: PLC0415 - only the bench draws

    out.mkdir(parents=True, exist_ok=True)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    mine = [r for r in rows if r.load == load]
    names = [r.router for r in mine]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    palette = ["#999999", "#d98c3f", "#6a8fd1", "#2c7a3f", "#7a3f9e", "#c94f4f", "#3fa3a3"]
    colors = [palette[i % len(palette)] for i in range(len(names))]
    axes[0].bar(names, [r.stats.cached_fraction for r in mine], color=colors)
    axes[0].set_title("prompt tokens served from cache")
    axes[0].set_ylim(0, 1)
    x = range(len(names))
    axes[1].bar([i - 0.2 for i in x], [r.stats.ttft(0.5) for r in mine], 0.4, label="p50")
    axes[1].bar([i + 0.2 for i in x], [r.stats.ttft(0.99) for r in mine], 0.4, label="p99")
    axes[1].set_xticks(list(x), names)
    axes[1].set_yscale("log")
    axes[1].set_title("time to first token (s)")
    axes[1].legend()
    axes[2].bar(names, [r.stats.busiest for r in mine], color=colors)
    axes[2].axhline(1 / len(mine[0].stats.per_pod), color="k", ls=":", lw=1)
    axes[2].set_title("busiest pod's share of requests")
    axes[2].set_ylim(0, 1)
    for ax in axes:
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(f"Endpoint Picker routing: offered load {load:g}x capacity ({rate:.1f} req/s)")
    fig.tight_layout()
    path = out / f"{prefix}-load-{load:g}x.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_curves(rows: list[Row], loads: list[float], out: Path, prefix: str) -> Path | None:
    """One figure across load levels: cached fraction and TTFT p50/p99 per router."""
    if len(loads) < 2:
        return None
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    routers = list(dict.fromkeys(r.router for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for name in routers:
        pts = sorted((r.load, r.stats) for r in rows if r.router == name)
        xs = [x for x, _ in pts]
        axes[0].plot(xs, [s.cached_fraction for _, s in pts], marker="o", label=name)
        axes[1].plot(xs, [s.ttft(0.5) for _, s in pts], marker="o", label=name)
        axes[2].plot(xs, [s.ttft(0.99) for _, s in pts], marker="o", label=name)
    axes[0].set_title("prompt tokens served from cache")
    axes[0].set_ylim(0, 1)
    axes[1].set_title("TTFT p50 (s)")
    axes[2].set_title("TTFT p99 (s)")
    for ax in axes:
        ax.set_xlabel("offered load (x capacity)")
    axes[1].set_yscale("log")
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path = out / f"{prefix}-curves.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    if "--real" in (sys.argv[1:] if argv is None else argv):  # real engines: its own options
        from bench import epp_routing_real  # noqa: PLC0415

        return epp_routing_real.main(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="8 pods, 5 load levels, 60 s of arrivals")
    ap.add_argument("--pods", type=int, default=4)
    ap.add_argument("--window", type=float, default=60.0, help="seconds over which sessions arrive")
    ap.add_argument(
        "--think", type=float, default=5.0, help="mean seconds between an answer and the next turn"
    )
    ap.add_argument("--loads", default="0.7,1.5", help="multiples of capacity")
    ap.add_argument("--time-scale", type=float, default=6.0, help="slow the modelled GPU down")
    ap.add_argument(
        "--num-gpu-blocks", type=int, default=1024, help="KV blocks per pod (see the docstring)"
    )
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument(
        "--routers",
        default=",".join(ROUTERS),
        help=f"comma-separated; also: {', '.join(VARIANTS)}",
    )
    ap.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="NAME=FILE",
        help="also route with this EndpointPickerConfig (repeatable)",
    )
    ap.add_argument(
        "--plaintext-picker",
        action="store_true",
        help="run the picker with --secure-serving=false (default: TLS, as rendered)",
    )
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    ap.add_argument("--prefix", default="epp-routing", help="PNG file name prefix")
    args = ap.parse_args(argv)
    if args.full:
        args.pods, args.window, args.loads = 8, 60.0, "0.3,0.7,1.0,1.5,2.0"
    loads = [float(x) for x in args.loads.split(",")]
    epp_flags = ["--secure-serving=false"] if args.plaintext_picker else []
    extra = dict(c.split("=", 1) for c in args.config)
    routers = [r.strip() for r in args.routers.split(",")] + list(extra)
    wl = Workload(think_s=args.think)
    engine = EngineConfig.gpu_like(
        args.time_scale, num_gpu_blocks=args.num_gpu_blocks, max_num_seqs=args.max_num_seqs
    )
    rows: list[Row] = []
    t_start = time.monotonic()
    note = "not run"
    picker = "none"
    capacity = 0.0
    limits: dict[float, Bounds] = {}

    def reset(targets: list[Target]) -> None:
        for t in targets:
            t.pod.reset(dataclasses.replace(engine, model_name=t.pod.standin.config.model_name))

    def calibrate(targets: list[Target]) -> float:
        """Capacity: the request rate at which random routing's measured prefill work (the
        uncached tokens per request of a light run) keeps every pod's prefill lane busy."""
        reset(targets)
        light = dataclasses.replace(wl, sessions=40)
        trace = schedule(light.build(args.seed + 100), 4.0, light, args.seed + 101)
        s = drive("random", {}, None, targets, trace, light, args.seed, ())
        uncached = (s.prompt_tokens - s.cached_tokens) / max(1, len(s.ttft_s))
        per_request = engine.step_overhead_s + uncached * engine.prefill_s_per_token
        print(
            f"  calibration: random routing prefills {uncached:.0f} of "
            f"{s.prompt_tokens / max(1, len(s.ttft_s)):.0f} prompt tokens per request -> "
            f"{per_request * 1e3:.0f} ms of prefill each",
            file=sys.stderr,
        )
        return len(targets) / per_request

    def sweep(pool: PoolOnCluster | None, targets: list[Target], configs: dict[str, str]) -> None:
        nonlocal capacity
        capacity = calibrate(targets)
        for load in loads:
            rate = load * capacity
            # enough sessions that arrivals last --window seconds at this rate
            n = max(20, round(args.window * rate / wl.mean_turns()))
            trace = schedule(_sessions(wl, n, args.seed), rate, wl, args.seed + 1)
            limits[load] = bounds(trace, wl, len(targets))
            for router in routers:
                reset(targets)
                s = drive(router, configs, pool, targets, trace, wl, args.seed, epp_flags)
                rows.append(Row(router, load, s))
                print(
                    f"  load {load:g}x {router:14} cached {s.cached_fraction:.3f} "
                    f"ttft p50 {s.ttft(0.5):.3f}s p99 {s.ttft(0.99):.3f}s busiest "
                    f"{s.busiest:.2f} ({len(s.ttft_s)} req, {s.errors} err, {s.wall_s:.0f} s, "
                    f"{s.rate:.1f} req/s)",
                    file=sys.stderr,
                    flush=True,
                )

    if all(r in ("random", "oracle") for r in routers):  # no picker: plain loopback pods
        pods = [FakePod(f"pod-{i}", f"127.0.79.{i + 1}", 8000).start() for i in range(args.pods)]
        try:
            sweep(None, [Target(p.name, p.url, p.address, p) for p in pods], {})
        finally:
            for p in pods:
                p.stop()
    else:
        picker = use_gie_picker()
        cluster = pytest_cluster.start_local_cluster(gateway_crds=True)
        try:
            with tempfile.TemporaryDirectory(prefix="epp-bench-") as tmp:
                launcher = Launcher(cluster, cluster.create_namespace("bench"), Path(tmp))
                try:
                    pool = launcher(spec_patch=routing_patch(replicas=args.pods), start_epp=False)
                    generated, note = for_gie(pool.rendered.epp_config_text)
                    configs = {"load-only": LOAD_ONLY, "llm-d default": LLMD_DEFAULT, **VARIANTS}
                    configs["generated"] = generated
                    configs.update({k: Path(v).read_text() for k, v in extra.items()})
                    targets = [
                        Target(h.name, f"http://{h.endpoint}", h.endpoint, h.server)
                        for h in pool.pods
                    ]
                    sweep(pool, targets, configs)
                finally:
                    launcher.close()
        finally:
            pytest_cluster.stop_cluster(cluster)
    elapsed = time.monotonic() - t_start
    report(args, rows, loads, capacity, engine, wl, note, elapsed, picker, limits)
    return 0


def _sessions(wl: Workload, n: int, seed: int) -> list[Session]:
    return dataclasses.replace(wl, sessions=n).build(seed)


ROUTERS = ("random", "load-only", "llm-d default", "generated", "oracle")


def drive(
    router: str,
    configs: dict[str, str],
    pool: PoolOnCluster | None,
    targets: list[Target],
    trace: list[Session],
    wl: Workload,
    seed: int,
    epp_flags: Sequence[str],
) -> Stats:
    """One router over one trace, on pods the caller just reset; the picker runs with its
    rendered args plus `epp_flags`."""
    client = None
    if router == "random":
        pick: Pick = random_router(targets, seed)
    elif router == "oracle":
        pick = oracle_router(targets, seed)
    else:
        assert pool is not None
        if router in REPORTED_BLOCK_SIZE:  # what the picker is told; reset() restores it
            for t in targets:
                t.pod.set(block_size=REPORTED_BLOCK_SIZE[router])
        # a fresh picker (an empty index), with its rendered transport unless told otherwise
        epp = pool.start_epp(config_text=configs[router], extra_args=epp_flags)
        client = epp.client()
        pick = picker_router(client, targets)

    async def go() -> Stats:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(64))
        return await run_trace(pick, targets, trace, wl, seed)

    try:
        return asyncio.run(go())
    finally:
        if client is not None:
            client.close()
        if pool is not None and pool.epp is not None:
            pool.epp.stop()
            pool.epp = None


def report(
    args: argparse.Namespace,
    rows: list[Row],
    loads: list[float],
    capacity: float,
    engine: EngineConfig,
    wl: Workload,
    note: str,
    elapsed: float,
    picker: str,
    limits: dict[float, Bounds],
) -> None:
    print(
        f"Routing by the real Endpoint Picker ({picker}), {args.pods} stand-in pods, "
        f"{elapsed:.0f} s"
    )
    print(
        f"pods: {engine.num_gpu_blocks} blocks x {engine.block_size} tokens, max_num_seqs "
        f"{engine.max_num_seqs}, prefill {engine.prefill_s_per_token * 1e3:.2f} ms/token + "
        f"{engine.step_overhead_s * 1e3:.0f} ms, decode {engine.decode_s_per_token * 1e3:.0f} "
        f"ms/token (gpu_like x{args.time_scale:g})"
    )
    print(
        f"workload: sessions arriving over {args.window:g} s, of {wl.turns[0]}-{wl.turns[1]} "
        f"turns, {wl.tenants} "
        f"tenants (system prompt {wl.system_tokens} tokens, own cache_salt), "
        f"{wl.doc_share:.0%} long-document sessions ({wl.doc_tokens} tokens); capacity "
        f"{capacity:.1f} req/s; generated config: {note}"
    )
    header = (
        f"{'load':>5} {'router':14} {'cached':>7} {'/oracle':>8} {'/load-only':>10} "
        f"{'p50 s':>7} {'p99 s':>7} {'p50/lo':>7} {'p99/lo':>7} {'busiest':>7} {'req':>5} "
        f"{'refused':>7}"
    )
    print(header)
    for load in loads:
        mine = {r.router: r.stats for r in rows if r.load == load}
        oracle, lo = mine.get("oracle"), mine.get("load-only")
        for name, s in mine.items():
            print(
                f"{load:>5g} {name:14} {s.cached_fraction:>7.3f} "
                f"{_ratio(s.cached_fraction, oracle.cached_fraction if oracle else None):>8} "
                f"{_ratio(s.cached_fraction, lo.cached_fraction if lo else None):>10} "
                f"{s.ttft(0.5):>7.3f} {s.ttft(0.99):>7.3f} "
                f"{_ratio(s.ttft(0.5), lo.ttft(0.5) if lo else None):>7} "
                f"{_ratio(s.ttft(0.99), lo.ttft(0.99) if lo else None):>7} {s.busiest:>7.2f} "
                f"{len(s.ttft_s):>5} {s.errors:>7}"
            )
        if load in limits:
            b = limits[load]
            print(
                f"      trace: system prompts {b.shared_floor:.3f} of prompt tokens (any router's "
                f"floor), ceiling {b.ceiling:.3f} (infinite cache): at most "
                f"{b.ceiling / b.shared_floor:.2f}x the floor"
            )
        if lo is not None and lo.gaps_s:
            gap = statistics.median(lo.gaps_s)
            held = lo.holding_s(engine.num_gpu_blocks * engine.block_size)
            print(
                f"      load-only: a turn follows its session's previous one after {gap:.1f} s "
                f"(median); a pod's cache holds {held:.0f} s of its writes (run average): "
                f"gap / holding {gap / held:.2f}"
            )
        path = plot(rows, load, load * capacity, args.out, args.prefix)
        print(f"      plot: {_shown(path)}")
    curves = plot_curves(rows, loads, args.out, args.prefix)
    if curves is not None:
        print(f"curves: {_shown(curves)}")
    goals(rows, loads)


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def _ratio(a: float, b: float | None) -> str:
    return f"{a / b:.2f}" if b else "-"


def goals(rows: list[Row], loads: list[float]) -> None:
    """The issue's goals, for the generated config, at the nominal and overload levels."""
    by = {(r.router, r.load): r.stats for r in rows}
    nominal = min(loads, key=lambda x: abs(x - 0.7))
    over = max(loads)
    for router in ("generated", "llm-d default"):
        g, lo, orc = (
            by.get((router, nominal)),
            by.get(("load-only", nominal)),
            by.get(("oracle", nominal)),
        )
        if g and lo and orc:
            a = g.cached_fraction / max(1e-9, orc.cached_fraction)
            b = g.ttft(0.5) / lo.ttft(0.5)
            print(
                f"{router} @ {nominal:g}x: cached {a:.2f} of oracle (goal >= 0.9: "
                f"{'met' if a >= 0.9 else 'missed'}), TTFT p50 {b:.2f}x load-only "
                f"(goal <= 0.6: {'met' if b <= 0.6 else 'missed'})"
            )
        g, lo = by.get((router, over)), by.get(("load-only", over))
        if g and lo:
            c = g.ttft(0.99) / lo.ttft(0.99)
            d = g.cached_fraction / max(1e-9, lo.cached_fraction)
            print(
                f"{router} @ {over:g}x: TTFT p99 {c:.2f}x load-only (goal <= 1.1: "
                f"{'met' if c <= 1.1 else 'missed'}), cached {d:.2f}x load-only (goal >= 2: "
                f"{'met' if d >= 2 else 'missed'})"
            )


if __name__ == "__main__":
    sys.exit(main())

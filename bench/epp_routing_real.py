"""Routing on real engines: 2-3 rendered pods (cache front + real vLLM) behind the real picker.

`python -m bench.epp_routing --real` (this module). The stand-in bench (`epp_routing.py`)
models a GPU; this one asks the engines themselves. Each pod is the rendered model-server
pod of a test resource (`harness/engine/pods.py`: the tiny model, block size 32, PerKey
isolation) run by `harness.pod.ProcessPod` on the IP kwok gave its pod object on the local
control plane, so the picker (which needs an API server: it has no file discovery) finds
it, scrapes the front's `/metrics` (vLLM's own, merged) and picks among the pods over
ext_proc. The picker is the default, promptcache's own build of GIE v1.5.0, which puts
each tenant's salt into the body it hashes itself (no policy step), exactly as in the
demo.

**Workload**: tenants with a long system prompt each (their isolation key in the header,
as clients send it; the front derives the salt), multi-turn chats whose history grows
(the engine's greedy answers come back as history), Poisson session arrivals, a think time
between turns. Text is words of the tiny tokenizer's own syllables, sized in real tokens
(measured with the engine's `/tokenize` at start).

**The cache is scarce on purpose.** Each engine gets `--kv-cache-mib` of KV cache (default
8 MiB: 8192 tokens of the tiny model's ~1 KiB per token, 256 blocks of 32). The tenants'
system prompts alone (default 6 x ~1200 tokens) nearly fill one pod, and the live
conversations overflow it: a router that spreads every tenant over every pod makes each
pod hold all of them and evict, one that keeps a tenant's sessions on one pod needs only
its share. (The resource sets `engine.maxModelLen: 4096`: vLLM refuses a KV cache smaller
than one maximum-length request, and the tiny model's default is 8192.)

**Routers**, each on the same trace with a fresh picker (an empty index): `random` (no
picker); `load-only` (the real picker, queue + KV-utilisation scorers); `prefix-aware`
(the real picker with the config the renderer generated for the resource: prefix 3 /
queue 2 / KV 2, autoTune from the pods' `vllm:cache_config_info`); `prefix+sessions`
(the same with `sessionAffinity` on: each chat names its session in the rendered header,
and the picker pins it to the pod its first turn went to). Between routers the
engines are not restarted: each router's tenants have keys of their own, so their salts
differ and nothing an earlier router cached can hit (vLLM evicts those blocks first: its
free list is LRU).

**Reported**, per router: cached share of prompt tokens from the answers'
`usage.prompt_tokens_details.cached_tokens`; the engines' own `vllm:prefix_cache_hits_total`
/ `vllm:prefix_cache_queries_total` over the run (scraped before and after); TTFT p50/p99
measured by the client to the first chunk with content (pick and front included); the
busiest pod's share of requests; ratios against load-only; one PNG (`docs/img/` by default).

Engine workers are bound to cores round-robin (`VLLM_CPU_OMP_THREADS_BIND`; the CPU build
otherwise binds every worker to core 0): a bench's machine layout, like front_overhead's
sidecar layout, not a translation of the rendered pod.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import dataclasses
import json
import os
import random
import re
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.epp.traffic import (
    LOAD_ONLY,
    Session,
    Stats,
    Target,
    Workload,
    picker_router,
    random_router,
    run_trace,
    schedule,
)

if TYPE_CHECKING:
    from harness.epp.pool import PoolOnCluster
    from harness.pod import ProcessPod

ROOT = Path(__file__).resolve().parents[1]
ROUTERS = ("random", "load-only", "prefix-aware", "prefix+sessions")
"""`prefix+sessions`: the generated config of the same resource with `sessionAffinity` on,
each chat naming its session in the rendered header."""
ENGINE_PORT = 8001
HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"


def _syllables() -> list[str]:
    """The syllables the tiny tokenizer's corpus is made of, read from
    `harness/vllm/tiny_model.py` (importing it would shadow `harness.vllm.tiny_model`, the
    function, with the module)."""
    tree = ast.parse((ROOT / "harness" / "vllm" / "tiny_model.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_SYLLABLES" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise LookupError("no _SYLLABLES in harness/vllm/tiny_model.py")


_SYLLABLES = _syllables()


def syllable_words(rng: random.Random, n: int) -> str:
    """`n` words of the syllables the tiny tokenizer was trained on (its BPE merges them, so
    such text costs a small, measurable number of tokens per word)."""
    return " ".join(
        "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(n)
    )


@dataclass(frozen=True)
class RealWorkload(Workload):
    """The stand-in bench's workload shape in the tiny model's words (`tokens_per_word`:
    measured on the engine's tokenizer before the trace is built)."""

    tokens_per_word: float = 2.0

    def _text(self, rng: random.Random, tokens: int) -> str:
        return syllable_words(rng, max(1, round(tokens / self.tokens_per_word)))

    def build(self, seed: int) -> list[Session]:
        rng = random.Random(seed)
        systems = [self._text(rng, self.system_tokens) for _ in range(self.tenants)]
        out = []
        for s in range(self.sessions):
            tenant = rng.randrange(self.tenants)
            turns = rng.randint(*self.turns)
            questions = [self._text(rng, rng.randint(*self.user_tokens)) for _ in range(turns)]
            out.append(Session(s, tenant, systems[tenant], questions, self.answer_tokens))
        return out


@dataclass(frozen=True)
class Plan:
    """Everything a run does, decided from the arguments alone (the smoke test checks it)."""

    pods: int
    kv_cache_bytes: int
    max_model_len: int
    workload: RealWorkload
    rate_rps: float
    routers: tuple[str, ...]
    seed: int
    out: Path

    @property
    def cache_tokens_per_pod(self) -> int:
        return self.kv_cache_bytes // 1024  # the default tiny model: 1 KiB of KV per token

    @property
    def system_prompt_tokens(self) -> int:
        return self.workload.tenants * self.workload.system_tokens

    def resource(self, model: Path, namespace: str, sessions: bool = False) -> dict[str, Any]:
        """The test resource on the default picker (promptcache's), sessions on or off."""
        from harness.engine.pods import engine_resource  # noqa: PLC0415

        resource = engine_resource(
            model,
            name="routing",
            engine={"maxModelLen": self.max_model_len},
            sessionAffinity={"enabled": sessions},
        )
        resource["spec"]["model"]["replicas"] = self.pods
        resource["metadata"]["namespace"] = namespace
        return resource


def parse(argv: list[str] | None = None) -> Plan:
    ap = argparse.ArgumentParser(
        prog="python -m bench.epp_routing --real", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--real", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pods", type=int, default=2, help="real pods (2-3; each ~4 GB)")
    ap.add_argument("--kv-cache-mib", type=int, default=8, help="KV cache per engine")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--tenants", type=int, default=6)
    ap.add_argument("--system-tokens", type=int, default=1200)
    ap.add_argument("--sessions", type=int, default=30)
    ap.add_argument("--rate", type=float, default=2.0, help="requests per second offered")
    ap.add_argument("--think", type=float, default=2.0, help="mean seconds between turns")
    ap.add_argument("--routers", default=",".join(ROUTERS))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    ap.add_argument("--quick", action="store_true", help="fewer sessions (a smoke run)")
    args = ap.parse_args(argv)
    if not 1 <= args.pods <= 3:
        ap.error("--pods: 1-3 (each real engine takes ~4 GB; the machine runs at most 3)")
    routers = tuple(r.strip() for r in args.routers.split(","))
    unknown = set(routers) - set(ROUTERS)
    if unknown:
        ap.error(f"--routers: unknown {sorted(unknown)} (known: {', '.join(ROUTERS)})")
    wl = RealWorkload(
        tenants=args.tenants,
        sessions=12 if args.quick else args.sessions,
        doc_share=0.0,
        system_tokens=args.system_tokens,
        turns=(3, 5),
        user_tokens=(40, 160),
        answer_tokens=16,
        think_s=args.think,
    )
    return Plan(
        pods=args.pods,
        kv_cache_bytes=args.kv_cache_mib << 20,
        max_model_len=args.max_model_len,
        workload=wl,
        rate_rps=args.rate,
        routers=routers,
        seed=args.seed,
        out=args.out,
    )


# --- the engines' own numbers ----------------------------------------------------------------


def counters(text: str) -> dict[str, float]:
    """vLLM's prefix-cache counters in one exposition (summed over label sets)."""
    out = {HITS: 0.0, QUERIES: 0.0}
    for line in text.splitlines():
        m = re.match(r"^(vllm:prefix_cache_(?:hits|queries)_total)(?:\{[^}]*\})?\s+(\S+)", line)
        if m:
            out[m.group(1)] += float(m.group(2))
    return out


def scrape(pods: list[ProcessPod]) -> dict[str, dict[str, float]]:
    out = {}
    for p in pods:
        with urllib.request.urlopen(f"http://{p.ip}:{ENGINE_PORT}/metrics", timeout=30) as r:
            out[p.name] = counters(r.read().decode())
    return out


def tokens_per_word(engine_url: str, seed: int) -> float:
    """Tokens per syllable word, by the engine's own tokenizer."""
    text = syllable_words(random.Random(seed), 2000)
    req = urllib.request.Request(
        engine_url + "/tokenize",
        data=json.dumps({"model": "tiny", "prompt": text, "add_special_tokens": False}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return float(json.loads(resp.read())["count"]) / 2000


@dataclass
class Result:
    router: str
    stats: Stats
    hits: float
    queries: float
    per_pod_hits: dict[str, float] = field(default_factory=dict)

    @property
    def engine_hit_rate(self) -> float:
        return self.hits / max(1.0, self.queries)


# --- running it ------------------------------------------------------------------------------


def start_pods(plan: Plan, pool: PoolOnCluster, workdir: Path) -> list[ProcessPod]:
    from harness.engine.cluster_pods import start_pool_pods  # noqa: PLC0415

    return start_pool_pods(pool, workdir, plan.kv_cache_bytes, say=say)


def say(msg: str) -> None:
    print(f"[routing-real {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def drive(
    router: str,
    index: int,
    plan: Plan,
    pool: PoolOnCluster,
    pods: list[ProcessPod],
    targets: list[Target],
    trace: list[Session],
    configs: dict[str, str],
) -> Result:
    """One router over the trace; its tenants' keys are its own (fresh salts, cold caches)."""
    from promptcache.contract import DEFAULT_ISOLATION_HEADER, DEFAULT_SESSION_HEADER  # noqa: PLC0415

    client = None
    if router == "random":
        pick = random_router(targets, plan.seed)
    else:
        pool.start_epp(config_text=configs[router], wait_scraped=False)
        assert pool.epp is not None
        pool.epp.wait_scraped({p.name: 0.0 for p in pods})
        client = pool.client()
        pick = picker_router(client, targets)

    def tenant(t: int) -> tuple[dict[str, Any], dict[str, str]]:
        return {}, {DEFAULT_ISOLATION_HEADER: f"run{index}-{router}-tenant-{t}"}

    before = scrape(pods)

    async def go() -> Stats:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(32))
        return await run_trace(
            pick,
            targets,
            trace,
            plan.workload,
            plan.seed,
            tenant_fields=tenant,
            model="tiny",
            extra_body={"temperature": 0},
            session_header=DEFAULT_SESSION_HEADER if router == "prefix+sessions" else None,
        )

    try:
        stats = asyncio.run(go())
    finally:
        if client is not None:
            client.close()
        pool.stop_picker()
    after = scrape(pods)
    per_pod = {n: after[n][HITS] - before[n][HITS] for n in after}
    hits = sum(per_pod.values())
    queries = sum(after[n][QUERIES] - before[n][QUERIES] for n in after)
    return Result(router, stats, hits, queries, per_pod)


def main(argv: list[str] | None = None) -> int:
    plan = parse(argv)
    from harness import pytest_cluster  # noqa: PLC0415
    from harness.epp.pool import PoolOnCluster  # noqa: PLC0415
    from harness.epp.rendered import Rendered, render_resource  # noqa: PLC0415
    from harness.epp.traffic import use_gie_picker  # noqa: PLC0415
    from harness.vllm import engine_unavailable, tiny_model  # noqa: PLC0415

    why = engine_unavailable()
    if why is not None:
        raise SystemExit(f"--real: the engine is not installed ({why}): run scripts/engine")
    picker = use_gie_picker()
    model = tiny_model()
    t_start = time.monotonic()
    loads = [os.getloadavg()[0]]
    say("starting the local control plane (kwok pods, the picker's API server)")
    cluster = pytest_cluster.start_local_cluster(gateway_crds=True)
    results: list[Result] = []
    try:
        with tempfile.TemporaryDirectory(prefix="epp-real-") as tmp:
            workdir = Path(tmp)
            namespace = cluster.create_namespace("bench")
            rendered = Rendered(render_resource(plan.resource(model, namespace)))
            pool = PoolOnCluster(cluster, rendered, workdir / "pool")
            try:
                pool.apply()
                pods = start_pods(plan, pool, workdir)
                try:
                    tpw = tokens_per_word(f"http://{pods[0].ip}:{ENGINE_PORT}", plan.seed)
                    wl = dataclasses.replace(plan.workload, tokens_per_word=tpw)
                    trace = schedule(wl.build(plan.seed), plan.rate_rps, wl, plan.seed + 1)
                    targets = [
                        Target(p.name, p.url(), f"{p.ip}:{rendered.target_port}") for p in pods
                    ]
                    with_sessions = Rendered(
                        render_resource(plan.resource(model, namespace, sessions=True))
                    )
                    configs = {
                        "load-only": LOAD_ONLY,
                        "prefix-aware": rendered.epp_config_text_with_salt_key(pool.salt_key_file),
                        "prefix+sessions": with_sessions.epp_config_text_with_salt_key(
                            pool.salt_key_file
                        ),
                    }
                    say(f"picker {picker} ({rendered.picker}); {tpw:.2f} tokens per word")
                    for i, router in enumerate(plan.routers):
                        say(f"{router}: {len(trace)} sessions at {plan.rate_rps:g} req/s")
                        r = drive(router, i, plan, pool, pods, targets, trace, configs)
                        loads.append(os.getloadavg()[0])
                        results.append(r)
                        s = r.stats
                        say(
                            f"  {router}: cached {s.cached_fraction:.3f} (engine hit rate "
                            f"{r.engine_hit_rate:.3f}), TTFT p50 {s.ttft(0.5) * 1e3:.0f} ms p99 "
                            f"{s.ttft(0.99) * 1e3:.0f} ms, busiest {s.busiest:.2f}, "
                            f"{len(s.ttft_s)} req, {s.errors} err, {s.wall_s:.0f} s"
                        )
                finally:
                    for p in pods:
                        p.stop()
            finally:
                pool.close()
    finally:
        pytest_cluster.stop_cluster(cluster)
    report(plan, results, time.monotonic() - t_start, loads)
    return 0


# --- reporting -------------------------------------------------------------------------------


def report(plan: Plan, results: list[Result], elapsed: float, loads: list[float]) -> None:
    wl = plan.workload
    prompts = [r.stats.prompt_tokens / max(1, len(r.stats.ttft_s)) for r in results]
    print(
        f"\nRouting on real engines: {plan.pods} rendered pods (cache front + vLLM CPU build, "
        f"tiny model), promptcache's picker, {elapsed:.0f} s; load average {min(loads):.1f}-"
        f"{max(loads):.1f} on {os.cpu_count()} CPUs"
    )
    print(
        f"engines: {plan.kv_cache_bytes >> 20} MiB KV each = {plan.cache_tokens_per_pod} tokens "
        f"({plan.cache_tokens_per_pod // 32} blocks of 32); workload: {wl.tenants} tenants x "
        f"{wl.system_tokens}-token system prompts = {plan.system_prompt_tokens} tokens "
        f"({plan.system_prompt_tokens / plan.cache_tokens_per_pod:.2f} of one pod's cache) + "
        f"{wl.sessions} chats of {wl.turns[0]}-{wl.turns[1]} turns at {plan.rate_rps:g} req/s; "
        f"mean prompt {sum(prompts) / max(1, len(prompts)):.0f} tokens"
    )
    lo = next((r for r in results if r.router == "load-only"), None)
    print(
        f"{'router':14} {'cached':>7} {'engine hits':>11} {'/load-only':>10} {'p50 ms':>7} "
        f"{'p99 ms':>7} {'p50/lo':>7} {'p99/lo':>7} {'busiest':>7} {'req':>5} {'errors':>6}"
    )
    for r in results:
        s = r.stats
        print(
            f"{r.router:14} {s.cached_fraction:>7.3f} {r.engine_hit_rate:>11.3f} "
            f"{_ratio(s.cached_fraction, lo.stats.cached_fraction if lo else None):>10} "
            f"{s.ttft(0.5) * 1e3:>7.0f} {s.ttft(0.99) * 1e3:>7.0f} "
            f"{_ratio(s.ttft(0.5), lo.stats.ttft(0.5) if lo else None):>7} "
            f"{_ratio(s.ttft(0.99), lo.stats.ttft(0.99) if lo else None):>7} "
            f"{s.busiest:>7.2f} {len(s.ttft_s):>5} {s.errors:>6}"
        )
    if results:
        path = plot(plan, results)
        print(f"plot: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


def _ratio(a: float, b: float | None) -> str:
    return f"{a / b:.2f}" if b else "-"


def plot(plan: Plan, results: list[Result]) -> Path:
    import matplotlib  # noqa: PLC0415 - only the bench draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    plan.out.mkdir(parents=True, exist_ok=True)
    names = [r.router for r in results]
    colors = ["#999999", "#d98c3f", "#2c7a3f", "#6a8fd1"][: len(names)]
    x = list(range(len(names)))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    axes[0].bar(
        [i - 0.2 for i in x],
        [r.stats.cached_fraction for r in results],
        0.4,
        label="usage cached_tokens",
    )
    axes[0].bar(
        [i + 0.2 for i in x],
        [r.engine_hit_rate for r in results],
        0.4,
        label="vllm:prefix_cache_hits",
    )
    axes[0].set_xticks(x, names)
    axes[0].set_ylim(0, 1)
    axes[0].set_title("prompt tokens served from cache")
    axes[0].legend(fontsize=8)
    axes[1].bar([i - 0.2 for i in x], [r.stats.ttft(0.5) * 1e3 for r in results], 0.4, label="p50")
    axes[1].bar([i + 0.2 for i in x], [r.stats.ttft(0.99) * 1e3 for r in results], 0.4, label="p99")
    axes[1].set_xticks(x, names)
    axes[1].set_title("time to first content chunk (ms)")
    axes[1].legend(fontsize=8)
    axes[2].bar(names, [r.stats.busiest for r in results], color=colors)
    axes[2].axhline(1 / plan.pods, color="k", ls=":", lw=1)
    axes[2].set_ylim(0, 1)
    axes[2].set_title("busiest pod's share of requests")
    fig.suptitle(
        f"Real vLLM (CPU build): {plan.pods} pods x {plan.kv_cache_bytes >> 20} MiB KV, "
        f"{plan.workload.tenants} tenants, promptcache's picker"
    )
    fig.tight_layout()
    path = plan.out / "epp-routing-real.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

"""Where the engines of a test session compute: vLLM's own core binding against none.

vLLM's CPU build binds its worker to the cores it does not keep for the scheduler
(`VLLM_CPU_OMP_THREADS_BIND=auto`): on a 2-core machine, core 0, for every engine. The
harness's kubelet gives each pod on the control plane a core of its own; every other
engine of a session (its shared pod, a module's own pod, a bare `VllmServer`) now runs
unpinned (`harness.vllm.cpu.UNPINNED`). This bench runs the same work under the three
layouts and prints each against vLLM's default, measured in the same run:

* `core 0`: vLLM's default, every worker on core 0 (what unplaced engines did before);
* `own cores`: engine i on core i mod the cores, as the kubelet places its pods;
* `unpinned`: the harness's default now, the kernel's scheduler places each worker.

Each round starts `--engines` real engines at once (the tiny model, the rendered args of a
test resource), times until every one answers `/health`, then sends each one paced
requests at the same time (`--requests` of `--tokens` tokens, `--pause` s apart; CI's
clients are paced too) and times that. Arms take turns in a different order each round,
so a drift of the machine's load falls on every arm. `--busy` keeps one core busy with a
spinning process for the whole run, as issue 38's flakiness runs do.

    python -m bench.engine_binding                 # ~8 minutes: 2 rounds of 3 arms
    python -m bench.engine_binding --busy --rounds 3

Needs the engine layer (`scripts/engine`) and two free engine slots.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from harness.engine.pods import engine_resource, free_pod_ip, rendered_pod_spec
from harness.pod import pod_local
from harness.vllm import VllmServer, engine_unavailable, tiny_model
from harness.vllm.cpu import OMP_BIND_ENV
from promptcache.contract import VLLM_LOCAL_PORT

LAYOUTS = ("core 0", "own cores", "unpinned")
BASELINE = LAYOUTS[0]


def layout_env(layout: str, index: int) -> dict[str, str]:
    """The env of engine `index` under `layout`: what the pod's env would say (`engine_env`
    unpins an engine whose env names no binding)."""
    if layout == "core 0":
        return {OMP_BIND_ENV: "auto"}
    if layout == "own cores":
        cores = sorted(os.sched_getaffinity(0))
        return {OMP_BIND_ENV: str(cores[index % len(cores)])}
    return {}


def engine_args(ip: str) -> list[str]:
    """The `vllm serve` args of a test resource's rendered pod, on `ip`."""
    spec = rendered_pod_spec(
        engine_resource(tiny_model(), name="binding", engine={"maxModelLen": 4096})
    )
    vllm = next(c for c in spec["containers"] if c["name"] == "vllm")
    return [pod_local(str(a), ip, {}) for a in vllm["args"]]


def bench_engine(
    workdir: Path,
    env: Mapping[str, str],
    name: str,
    start_cores: frozenset[int] | None = None,
) -> VllmServer:
    """A real engine of the tiny model on a pod IP of its own, with a test resource's
    rendered args and 8 MiB of KV cache (the engine benches' one shape)."""
    ip = free_pod_ip()
    return VllmServer(
        workdir,
        engine_args(ip),
        host=ip,
        port=VLLM_LOCAL_PORT,
        env=env,
        kv_cache_bytes=8 << 20,
        name=name,
        start_cores=start_cores,
    )


@dataclass
class Sample:
    start_s: float
    load_s: float
    latencies: list[float] = field(default_factory=list)


async def _paced(
    http: aiohttp.ClientSession, url: str, n: int, tokens: int, pause: float
) -> list[float]:
    took = []
    for i in range(n):
        body = {
            "model": "tiny",
            "prompt": f"request {i} to {url}: a paced client",
            "max_tokens": tokens,
            "ignore_eos": True,
            "temperature": 0,
        }
        started = time.monotonic()
        async with http.post(url + "/v1/completions", json=body) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise RuntimeError(f"{url}: {resp.status} {text[:200]}")
        took.append(time.monotonic() - started)
        await asyncio.sleep(pause)
    return took


async def _load(urls: list[str], args: argparse.Namespace) -> tuple[float, list[float]]:
    started = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        each = await asyncio.gather(
            *(_paced(http, u, args.requests, args.tokens, args.pause) for u in urls)
        )
    return time.monotonic() - started, [t for took in each for t in took]


def run_arm(layout: str, args: argparse.Namespace, workdir: Path) -> Sample:
    with ExitStack() as stack:
        engines = []
        for i in range(args.engines):
            server = bench_engine(
                workdir / f"{layout.replace(' ', '-')}-{i}", layout_env(layout, i), f"vllm-{i}"
            )
            stack.callback(server.stop)
            engines.append(server)
        started = time.monotonic()
        for server in engines:
            server.start()
        for server in engines:
            server.wait_healthy()
        start_s = time.monotonic() - started
        load_s, latencies = asyncio.run(_load([s.url for s in engines], args))
    return Sample(start_s, load_s, latencies)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--requests", type=int, default=15, help="per engine and round")
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--pause", type=float, default=0.5)
    ap.add_argument("--busy", action="store_true", help="keep one core busy all along")
    args = ap.parse_args(argv)
    why = engine_unavailable()
    if why is not None:
        raise SystemExit(f"the engine is not installed ({why}): run scripts/engine")
    workdir = Path(tempfile.mkdtemp(prefix="engine-binding-"))
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    samples: dict[str, list[Sample]] = {layout: [] for layout in LAYOUTS}
    try:
        for r in range(args.rounds):
            order = LAYOUTS[r % len(LAYOUTS) :] + LAYOUTS[: r % len(LAYOUTS)]
            for layout in order:
                s = run_arm(layout, args, workdir)
                samples[layout].append(s)
                print(
                    f"round {r + 1} {layout:>9}: {args.engines} engines healthy in"
                    f" {s.start_s:5.1f} s; paced load {s.load_s:5.1f} s"
                    f" (a request: mean {statistics.fmean(s.latencies):.2f} s,"
                    f" p50 {statistics.median(s.latencies):.2f} s,"
                    f" max {max(s.latencies):.2f} s)",
                    flush=True,
                )
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    shutil.rmtree(workdir, ignore_errors=True)
    base = samples[BASELINE]
    base_start = statistics.median(s.start_s for s in base)
    base_load = statistics.median(s.load_s for s in base)
    print(
        f"\n{args.engines} engines, {args.rounds} rounds{', one core kept busy' if busy else ''};"
        f" medians, ratio against `{BASELINE}` (below 1: faster)"
    )
    for layout, got in samples.items():
        start = statistics.median(s.start_s for s in got)
        load = statistics.median(s.load_s for s in got)
        print(
            f"  {layout:>9}: start {start:5.1f} s ({start / base_start:.2f}),"
            f" paced load {load:5.1f} s ({load / base_load:.2f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

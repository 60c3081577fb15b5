"""What the cache front costs on plain chat requests, and its peak memory under attack.

Part 1, overhead: plain chat completions (no prompt embeds), streamed and not,
sent straight to the stand-in vLLM (the baseline) and through the front, at
concurrency 1, 64 and 256, in the same run and alternating, so both see the
same machine. The front runs as a pod runs it (`python -m promptcache.front`,
PerKey isolation, an isolation key on every request, usage headers on); the
stand-in answers at once, so all time above the baseline is the front's.
Goals (issue 11): zero refusals at 64 and 256; throughput through the front
>= 0.8x direct at 64; added p50 <= 1 ms at concurrency 1.

Two CPU layouts, each with its own processes (`--layout`, both by default):

* `shared`: the load generator (this process), the stand-in and the front share
  all cores, so at 64 and 256 the throughput ratio is a ratio of CPU sums as soon
  as the cores are saturated: each process's CPU per request is printed, and the
  summary compares the CPU sums of the two arms.
* `sidecar`: as in a pod, the front has a core of its own (its container's CPU
  request) and does not take CPU from the model server: the load generator and
  the stand-in are pinned to one core in both arms, the front to another. Then
  the ratio says whether the front keeps up with the server behind it, which is
  what a user of the pod sees; it cannot show the front's CPU cost, which the
  shared layout and the CPU columns do.

Part 2, memory: a fresh front with a memory budget gets the amplification
requests of `tests/front/amplification.py` (each a few MB that asks for
hundreds of MB to GBs), several at once; the kernel's peak RSS of the front
(`VmHWM`) before and after is compared with the budget. Goal: growth under the
budget plus a fixed margin.

    python -m bench.front_overhead            # ~1-2 minutes
    python -m bench.front_overhead --quick    # fewer requests
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.local_processes import start, wait_ok
from e2e.localcluster.state import free_port
from tests.front.amplification import attacks, dense_payload

CHAT = "/v1/chat/completions"
KEY_HEADER = "x-prompt-cache-isolation-key"
MEMORY_MARGIN = 128 << 20
"""Allowance above the budget: aiohttp's buffers for bodies being received (charged only
once read), transient copies inside json and torch, allocator slack."""


@dataclass
class Run:
    """One (target, stream, concurrency) measurement."""

    latencies: list[float] = field(default_factory=list)
    refused: int = 0
    seconds: float = 0.0
    front_cpu: float = 0.0
    standin_cpu: float = 0.0
    client_cpu: float = 0.0
    """The load generator's own CPU (this process): it shares the cores with the others."""

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.seconds

    def merge(self, other: Run) -> None:
        self.latencies += other.latencies
        self.refused += other.refused
        self.seconds += other.seconds
        self.front_cpu += other.front_cpu
        self.standin_cpu += other.standin_cpu
        self.client_cpu += other.client_cpu

    def cpu_ms(self, seconds: float) -> float:
        return 1e3 * seconds / max(1, len(self.latencies) + self.refused)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


@dataclass(frozen=True)
class Layout:
    """Which cores each process may run on (None: any)."""

    name: str
    client: frozenset[int] | None = None
    standin: frozenset[int] | None = None
    front: frozenset[int] | None = None


def layouts(names: str) -> list[Layout]:
    cpus = sorted(os.sched_getaffinity(0))
    chosen = []
    for name in names.split(","):
        if name == "shared":
            chosen.append(Layout("shared"))
        elif name == "sidecar":
            if len(cpus) < 2:
                raise SystemExit("the sidecar layout needs two cores")
            upstream, own = frozenset(cpus[:1]), frozenset(cpus[1:2])
            chosen.append(Layout("sidecar", client=upstream, standin=upstream, front=own))
        else:
            raise SystemExit(f"--layout: unknown {name!r} (shared, sidecar)")
    return chosen


def _cpus(cpus: frozenset[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


async def _one(
    http: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str], run: Run
) -> None:
    start = time.perf_counter()
    async with http.post(url + CHAT, data=body, headers=headers) as resp:
        await resp.read()
        ok = resp.status == 200
    if ok:
        run.latencies.append(time.perf_counter() - start)
    else:
        run.refused += 1


async def _measure(
    http: aiohttp.ClientSession, url: str, stream: bool, concurrency: int, requests: int
) -> Run:
    body = json.dumps(
        {
            "model": "standin",
            "messages": [{"role": "user", "content": "Say hello in one short sentence."}],
            "max_tokens": 8,
            "stream": stream,
        }
    ).encode()
    headers = {"Content-Type": "application/json", KEY_HEADER: "tenant-bench"}
    run = Run()
    queue = iter(range(requests))

    async def worker() -> None:
        for _ in queue:
            await _one(http, url, body, headers, run)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    run.seconds = time.perf_counter() - started
    return run


async def overhead(args: argparse.Namespace, layout: Layout) -> None:
    everywhere = os.sched_getaffinity(0)
    if layout.client is not None:
        os.sched_setaffinity(0, layout.client)
    try:
        await _overhead(args, layout)
    finally:
        os.sched_setaffinity(0, everywhere)


async def _overhead(args: argparse.Namespace, layout: Layout) -> None:
    standin_port, front_port = free_port(), free_port()
    direct = f"http://127.0.0.1:{standin_port}"
    through = f"http://127.0.0.1:{front_port}"
    with tempfile.TemporaryDirectory() as tmp:
        salt = Path(tmp) / "salt-key"
        salt.write_bytes(os.urandom(32))
        standin = await start("-m", "harness.standin", str(standin_port), cpus=layout.standin)
        front = await start(
            "-m",
            "promptcache.front",
            "--upstream",
            direct,
            "--listen",
            f"127.0.0.1:{front_port}",
            "--isolation-mode",
            "PerKey",
            "--salt-key-file",
            str(salt),
            cpus=layout.front,
        )
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=120)
        try:
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
                await wait_ok(http, direct + "/health", standin)
                await wait_ok(http, through + "/readyz", front)
                where = (
                    "all processes on all cores"
                    if layout.front is None
                    else f"client and stand-in on CPU {_cpus(layout.client or frozenset())}, "
                    f"front on CPU {_cpus(layout.front)}"
                )
                print(
                    f"\n== layout {layout.name}: {where}; load average before: "
                    f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
                )
                print(
                    f"{'mode':<8}{'conc':>5}{'target':>8}{'req/s':>9}{'p50 ms':>9}"
                    f"{'p99 ms':>9}{'refused':>9}{'front cpu':>11}{'standin cpu':>13}"
                    f"{'client cpu':>12}"
                )
                results: dict[tuple[bool, int, str], Run] = {}
                for stream in (False, True):
                    for concurrency in (1, 64, 256):
                        n = args.requests if concurrency == 1 else args.requests * 4
                        await _measure(http, direct, stream, concurrency, min(n, 200))  # warm
                        await _measure(http, through, stream, concurrency, min(n, 200))
                        # many short alternations: both arms see the same background load
                        rounds = args.rounds
                        for target, url in (("direct", direct), ("front", through)) * rounds:
                            f0, s0 = cpu_seconds(front.pid), cpu_seconds(standin.pid)
                            c0 = time.process_time()
                            run = await _measure(http, url, stream, concurrency, n // rounds)
                            run.front_cpu = cpu_seconds(front.pid) - f0
                            run.standin_cpu = cpu_seconds(standin.pid) - s0
                            run.client_cpu = time.process_time() - c0
                            key = (stream, concurrency, target)
                            results.setdefault(key, Run()).merge(run)
                        for target in ("direct", "front"):
                            r = results[(stream, concurrency, target)]
                            print(
                                f"{'stream' if stream else 'whole':<8}{concurrency:>5}"
                                f"{target:>8}{r.throughput:>9.0f}{r.pct(0.5) * 1e3:>9.2f}"
                                f"{r.pct(0.99) * 1e3:>9.2f}{r.refused:>9}"
                                f"{r.cpu_ms(r.front_cpu):>9.2f}ms{r.cpu_ms(r.standin_cpu):>11.2f}ms"
                                f"{r.cpu_ms(r.client_cpu):>10.2f}ms"
                            )
        finally:
            for proc in (front, standin):
                proc.terminate()
                await proc.wait()
    print()
    for stream in (False, True):
        mode = "stream" if stream else "whole"
        d1, f1 = results[(stream, 1, "direct")], results[(stream, 1, "front")]
        added = (f1.pct(0.5) - d1.pct(0.5)) * 1e3
        print(
            f"{layout.name} {mode}: added p50 at concurrency 1: {added:+.2f} ms (goal <= 1 ms); "
            f"the front's "
            f"own CPU per request {f1.cpu_ms(f1.front_cpu):.2f} ms vs the stand-in's "
            f"{f1.cpu_ms(f1.standin_cpu):.2f} ms"
        )
        for c in (64, 256):
            d, f = results[(stream, c, "direct")], results[(stream, c, "front")]
            print(
                f"{layout.name} {mode}: throughput front/direct at {c}: "
                f"{f.throughput / d.throughput:.2f}"
                f"{' (goal >= 0.80)' if c == 64 else ''}; refused through the front: "
                f"{f.refused} (goal 0)"
            )
        d, f = results[(stream, 64, "direct")], results[(stream, 64, "front")]
        client, standin = d.cpu_ms(d.client_cpu), d.cpu_ms(d.standin_cpu)
        front_ms = f.cpu_ms(f.front_cpu)
        print(
            f"{layout.name} {mode}: CPU per request at 64: client {client:.2f} ms + stand-in "
            f"{standin:.2f} ms direct; the front adds {front_ms:.2f} ms: through the front the "
            f"three processes need {(client + standin + front_ms) / (client + standin):.2f}x "
            f"the CPU per request of direct"
        )


async def memory(args: argparse.Namespace) -> None:
    budget, max_body = args.budget_mib << 20, 16 << 20
    standin_port, front_port = free_port(), free_port()
    direct = f"http://127.0.0.1:{standin_port}"
    url = f"http://127.0.0.1:{front_port}"
    standin = await start("-m", "harness.standin", str(standin_port))
    front = await start(
        "-m",
        "promptcache.front",
        "--upstream",
        direct,
        "--listen",
        f"127.0.0.1:{front_port}",
        "--max-body-bytes",
        str(max_body),
        "--max-in-flight-bytes",
        str(budget),
        "--prompt-embeds-cache-gib",
        "0.25",
    )
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
            await wait_ok(http, direct + "/health", standin)
            await wait_ok(http, url + "/healthz", front)
            warm = {"model": "m", "prompt_embeds": dense_payload(64, 1024), "max_tokens": 1}
            async with http.post(url + "/v1/completions", json=warm) as resp:
                assert resp.status == 200, resp.status
            before = peak_rss(front.pid)
            print(
                f"\nmemory: front budget {budget >> 20} MiB, body limit {max_body >> 20} MiB, "
                f"peak RSS after warm-up {before >> 20} MiB"
            )
            for attack in attacks(max_body):
                for body in attack.setup:
                    headers = {"Content-Type": "application/json"}
                    async with http.post(url + "/v1/completions", data=body, headers=headers) as r:
                        assert r.status == 200, r.status

                async def send(path: str, body: bytes, headers: dict[str, str]) -> int:
                    async with http.post(url + path, data=body, headers=headers) as resp:
                        await resp.read()
                        return resp.status

                statuses = await asyncio.gather(
                    *(send(attack.path, attack.body, attack.headers) for _ in range(args.copies))
                )
                peak = peak_rss(front.pid)
                counts = {s: statuses.count(s) for s in sorted(set(statuses))}
                print(
                    f"  {attack.name:<45} {len(attack.body) / 1e6:6.1f} MB x {args.copies}: "
                    f"{counts}; peak RSS now {peak >> 20} MiB (+{(peak - before) >> 20})"
                )
            growth = peak_rss(front.pid) - before
    finally:
        for proc in (front, standin):
            proc.terminate()
            await proc.wait()
    limit = budget + MEMORY_MARGIN
    print(
        f"memory: peak RSS growth under amplification {growth >> 20} MiB; budget "
        f"{budget >> 20} MiB + margin {MEMORY_MARGIN >> 20} MiB = {limit >> 20} MiB "
        f"(growth/limit {growth / limit:.2f}; goal < 1)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--requests", type=int, default=1200, help="requests per point and arm at c=1 (x4 above)"
    )
    ap.add_argument(
        "--rounds", type=int, default=6, help="direct/front alternations per point (noise)"
    )
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--layout",
        default="shared,sidecar",
        help="CPU layouts to measure, comma-separated: shared (all on all cores), sidecar "
        "(the front on a core of its own, as in a pod)",
    )
    ap.add_argument("--budget-mib", type=int, default=256)
    ap.add_argument("--copies", type=int, default=8, help="concurrent copies of each attack")
    args = ap.parse_args()
    if args.quick:
        args.requests = 200
        args.rounds = 2
    for layout in layouts(args.layout):
        asyncio.run(overhead(args, layout))
    asyncio.run(memory(args))


if __name__ == "__main__":
    main()

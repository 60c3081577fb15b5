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

Real engine (`--engine real`, issue 22): the same chat workload sent straight to a real
vLLM (its CPU build, the harness's tiny model) and through the real front, at concurrency
1, 8 and 64, in one run. Both run as the rendered model-server pod runs them
(`harness.pod.ProcessPod` on a loopback pod IP: the cache front on the serving port, `vllm
serve` with the rendered args on 8001), so "direct" is the pod's engine port and "front"
its serving port. A third arm, "relay" (`bench/byte_relay.py`, on the front's cores), only
copies bytes: the floor of what any proxy process in the pod costs here. Goals: throughput
through the front >= 0.95x direct at 8 and 64; added p50 <= 2 % of the direct p50 at
concurrency 1. At concurrency 1 direct and each proxy take turns request by request (a pass
per proxy, so the front idles as long between its requests as with two arms). Above it each arm
in turn keeps the concurrency in flight for a ramp plus a window, 8 times, and only answers
completed inside the windows count (steady-state throughput, not the drain of a batch);
vLLM's own step counter gives the engine's steps per answer (fewer: larger batches). Every
arm first opens the connections a point will use. The same `--layout`s, on the same
processes re-pinned between them: `shared` (the engine bound as the CPU build binds itself,
everything else on any core), and `sidecar` (the client and every engine process on CPU 0,
the proxies on CPU 1). The memory part does not depend on the engine and is not repeated.

Part 2, memory: a fresh front with a memory budget gets the amplification
requests of `harness/amplification.py` (each a few MB that asks for
hundreds of MB to GBs), several at once; the kernel's peak RSS of the front
(`VmHWM`) before and after is compared with the budget. Goal: growth under the
budget plus a fixed margin.

    python -m bench.front_overhead            # ~1-2 minutes
    python -m bench.front_overhead --quick    # fewer requests
    python -m bench.front_overhead --engine real          # ~15 minutes, one real engine
    python -m bench.front_overhead --engine real --quick  # ~3 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp

from bench.local_processes import start, wait_ok
from harness.amplification import attacks, dense_payload
from harness.net import free_port

if TYPE_CHECKING:
    from harness.pod import ProcessPod

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
    """Answers other than 200, and requests whose connection failed (`failures`)."""
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    front_cpu: float = 0.0
    upstream_cpu: float = 0.0
    """The stand-in's CPU, or the real engine's (API server, engine core and worker)."""
    client_cpu: float = 0.0
    """The load generator's own CPU (this process): it shares the cores with the others."""
    steps: float = 0.0
    """Engine steps (real engine, above concurrency 1): fewer per answer is larger batches."""

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.seconds

    def merge(self, other: Run) -> None:
        self.latencies += other.latencies
        self.refused += other.refused
        self.failures += other.failures
        self.seconds += other.seconds
        self.front_cpu += other.front_cpu
        self.upstream_cpu += other.upstream_cpu
        self.client_cpu += other.client_cpu
        self.steps += other.steps

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
    try:
        async with http.post(url + CHAT, data=body, headers=headers) as resp:
            await resp.read()
            ok = resp.status == 200
    except aiohttp.ClientError as error:  # counted, not fatal: the table shows it
        run.refused += 1
        run.failures.append(f"{type(error).__name__}: {error}")
        return
    if ok:
        run.latencies.append(time.perf_counter() - start)
    else:
        run.refused += 1


def chat_request(stream: bool, model: str) -> tuple[bytes, dict[str, str]]:
    """The one chat request every arm sends (8 tokens out, greedy), and its headers."""
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "Say hello in one short sentence."}],
            "max_tokens": 8,
            "temperature": 0,
            "stream": stream,
        }
    ).encode()
    return body, {"Content-Type": "application/json", KEY_HEADER: "tenant-bench"}


async def _measure(
    http: aiohttp.ClientSession,
    url: str,
    stream: bool,
    concurrency: int,
    requests: int,
    model: str = "standin",
) -> Run:
    body, headers = chat_request(stream, model)
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
            # one synthetic tenant at vLLM's whole concurrency (256): the overhead, not the
            # per-client shares (bench/hostile_load.py measures those). The share no longer
            # caps a tenant alone, but the reserve does (a sixteenth of the slots stays
            # free for newcomers: 240 of 256), and the goal is zero refusals at 256
            "--tenant-share-percent",
            "100",
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
                            run.upstream_cpu = cpu_seconds(standin.pid) - s0
                            run.client_cpu = time.process_time() - c0
                            key = (stream, concurrency, target)
                            results.setdefault(key, Run()).merge(run)
                        for target in ("direct", "front"):
                            r = results[(stream, concurrency, target)]
                            print(
                                f"{'stream' if stream else 'whole':<8}{concurrency:>5}"
                                f"{target:>8}{r.throughput:>9.0f}{r.pct(0.5) * 1e3:>9.2f}"
                                f"{r.pct(0.99) * 1e3:>9.2f}{r.refused:>9}"
                                f"{r.cpu_ms(r.front_cpu):>9.2f}ms{r.cpu_ms(r.upstream_cpu):>11.2f}ms"
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
            f"{f1.cpu_ms(f1.upstream_cpu):.2f} ms"
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
        client, standin = d.cpu_ms(d.client_cpu), d.cpu_ms(d.upstream_cpu)
        front_ms = f.cpu_ms(f.front_cpu)
        print(
            f"{layout.name} {mode}: CPU per request at 64: client {client:.2f} ms + stand-in "
            f"{standin:.2f} ms direct; the front adds {front_ms:.2f} ms: through the front the "
            f"three processes need {(client + standin + front_ms) / (client + standin):.2f}x "
            f"the CPU per request of direct"
        )


# --- the real engine ------------------------------------------------------------------------

REAL_CONCURRENCY = (1, 8, 64)
REAL_GOAL_THROUGHPUT = 0.95
REAL_GOAL_ADDED_P50 = 0.02
"""Of the direct p50 at concurrency 1."""
REAL_RAMP_SECONDS = 0.5
"""Of each throughput window, not counted: every worker has its first answer by then."""
STEPS_SERIES = "vllm:iteration_tokens_total_count"
"""vLLM's histogram of tokens per engine step: its count is the engine's steps."""


def group_pids(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (the engine is three: its API server,
    engine core and worker, all started in the engine's own session)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # it exited meanwhile
        if int(fields[2]) == pgid:
            pids.append(int(stat.parent.name))
    return pids


def sum_cpu_seconds(pids: list[int]) -> float:
    return sum(cpu_seconds(pid) for pid in pids)


@dataclass(frozen=True)
class RealPlan:
    """What one real-engine run measures.

    At concurrency 1 the arms alternate request by request, `pairs` requests each. Above
    it, throughput is the steady state of a closed loop: each arm in turn keeps
    `concurrency` requests in flight for a ramp plus a `window_s` window, `rounds` times,
    and only the answers completed inside the windows count. (Counting a fixed number of
    requests per round, as before, timed ~2 waves of 64 plus the drain of the last one, so
    a single late answer moved the ratio by several per cent.)"""

    streams: tuple[bool, ...]
    concurrencies: tuple[int, ...]
    pairs: int
    rounds: int
    window_s: float
    layouts: tuple[Layout, ...] = (Layout("shared"),)
    relay: bool = True
    """Also measure `bench/byte_relay.py` on the front's cores: the floor of any proxy."""

    def warm(self, concurrency: int) -> int:
        """Requests per arm before a point: every connection it will use opened once."""
        return max(16, 2 * concurrency)


def real_plan(args: argparse.Namespace) -> RealPlan:
    """About a minute per layout and mode on this machine (a request of 8 tokens takes
    ~25 ms alone; at 64 the engine answers ~10x more per second)."""
    pairs = args.requests if args.requests_set else (120 if args.quick else 300)
    rounds = args.rounds if args.rounds_set else (4 if args.quick else 8)
    streams = (False,) if args.quick else (False, True)
    chosen = tuple(layouts(args.layout))
    window = 1.5 if args.quick else 2.5
    return RealPlan(
        streams, REAL_CONCURRENCY, pairs, rounds, window, layouts=chosen, relay=not args.no_relay
    )


def pin(pids: list[int], cpus: frozenset[int] | None) -> None:
    """Every thread of `pids` onto `cpus` (None: all of this process's cores); threads made
    later inherit their creator's affinity."""
    target = cpus if cpus is not None else os.sched_getaffinity(0)
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
            try:
                os.sched_setaffinity(int(task.name), target)
            except OSError:
                continue  # the thread ended meanwhile


def start_real_pod(workdir: Path) -> ProcessPod:
    """The rendered model-server pod (cache front + real `vllm serve`), Ready by its own
    probes; the engine slot it needs may first have to be waited for."""
    from harness.engine.pods import engine_resource, process_pod  # noqa: PLC0415 - real mode only
    from harness.vllm import engine_unavailable, tiny_model  # noqa: PLC0415

    why = engine_unavailable()
    if why is not None:
        raise SystemExit(f"--engine real: the engine is not installed ({why}): run scripts/engine")
    pod = process_pod(engine_resource(tiny_model(), name="overhead"), workdir)
    started = time.monotonic()
    print(f"starting the rendered pod (front + vllm serve) on {pod.ip} ...", flush=True)
    pod.start()
    try:
        pod.wait_ready()
    except BaseException:
        pod.stop()
        raise
    print(f"  Ready after {time.monotonic() - started:.0f} s", flush=True)
    return pod


async def real_overhead(args: argparse.Namespace) -> None:
    plan = real_plan(args)
    workdir = Path(tempfile.mkdtemp(prefix="front-overhead-"))
    pod = await asyncio.to_thread(start_real_pod, workdir)
    relay: asyncio.subprocess.Process | None = None
    try:
        front = next(c.proc for c in pod.containers if c.name != "vllm")
        engine = pod.container("vllm").proc
        assert front is not None
        assert engine is not None
        direct = f"http://{pod.ip}:8001"
        arms = [Arm("direct", direct, None), Arm("front", pod.url(), front.pid)]
        if plan.relay:
            port = free_port()
            relay = await start("-m", "bench.byte_relay", f"127.0.0.1:{port}", f"{pod.ip}:8001")
            arms.append(Arm("relay", f"http://127.0.0.1:{port}", relay.pid))
            async with aiohttp.ClientSession() as http:
                await wait_ok(http, arms[-1].url + "/health", relay)
        # the engine runs in its own session: its process group is the pid of `vllm serve`
        failures = await real_layouts(plan, arms, engine.pid)
    finally:
        if relay is not None:
            relay.terminate()
            await relay.wait()
        await asyncio.to_thread(pod.stop)
    if failures:  # keep the pod's logs to explain them
        print(f"{len(failures)} failed requests (first: {failures[0]}); pod logs in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass(frozen=True)
class Arm:
    """One way to the engine: straight to it, or through a proxy process (`pid`)."""

    name: str
    url: str
    pid: int | None


def thread_affinities(pids: list[int]) -> dict[int, set[int]]:
    """Each thread's cores, to put back: how the engine runs when the bench pins nothing.
    Since 2026-12-07 the harness starts engines unpinned (`harness.vllm.cpu.UNPINNED`); the
    figures before that date had the worker on core 0, vLLM's own binding here."""
    out: dict[int, set[int]] = {}
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
            with contextlib.suppress(OSError):
                out[int(task.name)] = os.sched_getaffinity(int(task.name))
    return out


def restore_affinities(saved: dict[int, set[int]]) -> None:
    for tid, cpus in saved.items():
        with contextlib.suppress(OSError):  # the thread ended meanwhile
            os.sched_setaffinity(tid, cpus)


async def real_layouts(plan: RealPlan, arms: list[Arm], engine_pgid: int) -> list[str]:
    """Each layout in turn on the same processes (pinned, then as they were); the failures."""
    engine_pids = group_pids(engine_pgid)
    engine_own = thread_affinities(engine_pids)
    proxies = [arm.pid for arm in arms if arm.pid is not None]
    everywhere = os.sched_getaffinity(0)
    failures: list[str] = []
    summary: list[str] = []
    try:
        for layout in plan.layouts:
            if layout.standin is None:
                restore_affinities(engine_own)
            else:
                pin(engine_pids, layout.standin)
            pin(proxies, layout.front)
            os.sched_setaffinity(0, layout.client or everywhere)
            lines, failed = await measure_real(plan, layout, arms, engine_pids)
            summary += lines
            failures += failed
    finally:
        os.sched_setaffinity(0, everywhere)
        restore_affinities(engine_own)
        pin(proxies, None)
    print()
    for line in summary:
        print(line)
    return failures


async def engine_steps(http: aiohttp.ClientSession, direct: str) -> float:
    """The engine's steps so far (every engine of the pod), from its own /metrics."""
    async with http.get(direct + "/metrics") as resp:
        text = await resp.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(STEPS_SERIES + "{")
    )


@dataclass
class Usage:
    """CPU seconds of the client, the proxy and the engine, and the engine's steps."""

    client: float
    proxy: float
    engine: float
    steps: float


async def _usage(
    http: aiohttp.ClientSession, direct: str, arm: Arm, engine_pids: list[int]
) -> Usage:
    proxy = cpu_seconds(arm.pid) if arm.pid is not None else 0.0
    engine = sum_cpu_seconds(engine_pids)
    client = time.process_time()
    return Usage(client, proxy, engine, await engine_steps(http, direct))


async def _window(
    http: aiohttp.ClientSession,
    arm: Arm,
    stream: bool,
    concurrency: int,
    plan: RealPlan,
    engine_pids: list[int],
    direct: str,
) -> Run:
    """`concurrency` requests kept in flight for a ramp plus a window; the answers completed
    inside the window, and the CPU and engine steps spent inside it."""
    from harness.engine.pods import SERVED_NAME  # noqa: PLC0415

    body, headers = chat_request(stream, SERVED_NAME)
    run = Run(seconds=plan.window_s)
    opens = time.perf_counter() + REAL_RAMP_SECONDS
    closes = opens + plan.window_s
    marks: list[Usage] = []

    async def worker() -> None:
        while time.perf_counter() < closes:
            begun = time.perf_counter()
            try:
                async with http.post(arm.url + CHAT, data=body, headers=headers) as resp:
                    await resp.read()
                    ok = resp.status == 200
            except aiohttp.ClientError as error:
                ok = False
                run.failures.append(f"{type(error).__name__}: {error}")
            ended = time.perf_counter()
            if opens <= ended <= closes:
                if ok:
                    run.latencies.append(ended - begun)
                else:
                    run.refused += 1

    async def marker() -> None:
        for at in (opens, closes):
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            marks.append(await _usage(http, direct, arm, engine_pids))

    await asyncio.gather(marker(), *(worker() for _ in range(concurrency)))
    first, last = marks
    run.client_cpu = last.client - first.client
    run.front_cpu = last.proxy - first.proxy
    run.upstream_cpu = last.engine - first.engine
    run.steps = last.steps - first.steps
    return run


async def _pairs(
    http: aiohttp.ClientSession,
    arms: list[Arm],
    stream: bool,
    plan: RealPlan,
    engine_pids: list[int],
    results: dict[str, Run],
) -> None:
    """Concurrency 1: direct and one proxy take turns request by request (the order
    alternating), so both see the same moments of a noisy machine; one pass per proxy, so
    the front idles for one direct request between two of its own, as with two arms (a
    longer idle spell leaves it colder). Each proxy's direct baseline is kept under
    `direct/NAME`; `direct` is the front's."""
    from harness.engine.pods import SERVED_NAME  # noqa: PLC0415

    direct = arms[0]
    for proxy in arms[1:]:
        baseline = f"direct/{proxy.name}"
        for i in range(plan.pairs):
            for arm in (direct, proxy) if i % 2 == 0 else (proxy, direct):
                proxy0 = cpu_seconds(arm.pid) if arm.pid is not None else 0.0
                engine0, client0 = sum_cpu_seconds(engine_pids), time.process_time()
                run = await _measure(http, arm.url, stream, 1, 1, SERVED_NAME)
                run.front_cpu = cpu_seconds(arm.pid) - proxy0 if arm.pid is not None else 0.0
                run.upstream_cpu = sum_cpu_seconds(engine_pids) - engine0
                run.client_cpu = time.process_time() - client0
                results.setdefault(baseline if arm is direct else arm.name, Run()).merge(run)
    results["direct"] = results[f"direct/{arms[1].name}"]


async def measure_real(
    plan: RealPlan, layout: Layout, arms: list[Arm], engine_pids: list[int]
) -> tuple[list[str], list[str]]:
    """Measure and print the table of one layout; its summary lines and failed requests."""
    from harness.engine.pods import SERVED_NAME  # noqa: PLC0415

    # An idle connection is dropped after 2 s, before uvicorn's 5 s keep-alive ends it (as
    # the front's own pool does): while the other arm runs, the direct arm's connections
    # sit idle, and a POST on one vLLM is closing fails (aiohttp retries only idempotent
    # methods), which counted as refusals of the direct arm.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0)
    timeout = aiohttp.ClientTimeout(total=300)
    direct = arms[0].url
    results: dict[tuple[bool, int], dict[str, Run]] = {}
    loads = [os.getloadavg()[0]]
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        where = (
            "all processes on all cores (the engine bound as it binds itself)"
            if layout.front is None
            else f"client and engine on CPU {_cpus(layout.client or frozenset())}, "
            f"proxies on CPU {_cpus(layout.front)}"
        )
        print(
            f"\n== real engine, layout {layout.name}: vllm serve (CPU build, tiny model) at "
            f"{direct}; {where}; load average before: {loads[0]:.1f} on {os.cpu_count()} CPUs"
        )
        print(
            f"{'mode':<8}{'conc':>5}{'target':>8}{'req/s':>9}{'p50 ms':>9}"
            f"{'p99 ms':>9}{'refused':>9}{'proxy cpu':>11}{'engine cpu':>13}"
            f"{'client cpu':>12}{'steps/req':>11}"
        )
        for stream in plan.streams:
            for concurrency in plan.concurrencies:
                for arm in arms:  # every connection the point will use, opened once
                    await _measure(
                        http, arm.url, stream, concurrency, plan.warm(concurrency), SERVED_NAME
                    )
                point = results.setdefault((stream, concurrency), {})
                if concurrency == 1:
                    await _pairs(http, arms, stream, plan, engine_pids, point)
                else:
                    for r in range(plan.rounds):
                        turn = arms[r % len(arms) :] + arms[: r % len(arms)]
                        for arm in turn:
                            run = await _window(
                                http, arm, stream, concurrency, plan, engine_pids, direct
                            )
                            point.setdefault(arm.name, Run()).merge(run)
                loads.append(os.getloadavg()[0])
                for arm in arms:
                    res = point[arm.name]
                    steps = f"{res.steps / max(1, len(res.latencies)):>11.3f}" if res.steps else ""
                    print(
                        f"{'stream' if stream else 'whole':<8}{concurrency:>5}"
                        f"{arm.name:>8}{res.throughput:>9.1f}{res.pct(0.5) * 1e3:>9.2f}"
                        f"{res.pct(0.99) * 1e3:>9.2f}{res.refused:>9}"
                        f"{res.cpu_ms(res.front_cpu):>9.2f}ms"
                        f"{res.cpu_ms(res.upstream_cpu):>11.2f}ms"
                        f"{res.cpu_ms(res.client_cpu):>10.2f}ms{steps}",
                        flush=True,
                    )
    print(f"load average (1 min) during layout {layout.name}: {min(loads):.1f}-{max(loads):.1f}")
    failed = [f for point in results.values() for res in point.values() for f in res.failures]
    return real_summary(results, plan, layout.name), failed


def real_summary(
    results: dict[tuple[bool, int], dict[str, Run]], plan: RealPlan, layout: str
) -> list[str]:
    """The goals of issue 22 for the front, against the direct arm of the same run (and the
    byte relay's figures beside them: what any proxy costs here)."""
    out = []
    for stream in plan.streams:
        mode = "stream" if stream else "whole"
        point = results[(stream, 1)]
        for name in (n for n in point if not n.startswith("direct")):
            d1 = point[f"direct/{name}"]
            added = point[name].pct(0.5) - d1.pct(0.5)
            share = added / d1.pct(0.5)
            goal = f" (goal <= {REAL_GOAL_ADDED_P50:.0%}: " + (
                "met)" if share <= REAL_GOAL_ADDED_P50 else "missed)"
            )
            out.append(
                f"real {layout} {mode}: {name}: added p50 at concurrency 1: "
                f"{added * 1e3:+.2f} ms = {share:+.1%} of the direct p50 "
                f"{d1.pct(0.5) * 1e3:.1f} ms{goal if name == 'front' else ''}"
            )
        for c in plan.concurrencies:
            if c == 1:
                continue
            point = results[(stream, c)]
            d = point["direct"]
            for name in (n for n in point if n != "direct"):
                f = point[name]
                ratio = f.throughput / d.throughput
                goal = f" (goal >= {REAL_GOAL_THROUGHPUT:.2f}: " + (
                    "met)" if ratio >= REAL_GOAL_THROUGHPUT else "missed)"
                )
                out.append(
                    f"real {layout} {mode}: {name}: throughput /direct at {c}: {ratio:.3f}"
                    f"{goal if name == 'front' else ''}; p50 {f.pct(0.5) / d.pct(0.5):.3f}x "
                    f"direct; refused {f.refused}; engine steps per answer "
                    f"{d.steps / max(1, len(d.latencies)):.3f} direct, "
                    f"{f.steps / max(1, len(f.latencies)):.3f}; "
                    f"CPU per answer: engine {d.cpu_ms(d.upstream_cpu):.2f} ms direct, "
                    f"{f.cpu_ms(f.upstream_cpu):.2f} ms; {name} {f.cpu_ms(f.front_cpu):.2f} ms"
                )
    return out


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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--engine",
        choices=("standin", "real"),
        default="standin",
        help="what the front proxies to: the stand-in (overhead and memory, default) or a real "
        "vLLM (its CPU build; overhead at concurrency 1, 8 and 64)",
    )
    ap.add_argument(
        "--requests",
        type=int,
        help="requests per point and arm at c=1 (x4 above); default 1200 (stand-in); real "
        "engine: requests per arm at c=1, default 300 (above it, time windows)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        help="direct/front alternations per point (noise); default 6 (real: windows per "
        "arm above concurrency 1, default 8; at 1 the arms alternate request by request)",
    )
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--no-relay",
        action="store_true",
        help="real engine: skip the byte relay (bench/byte_relay.py), the floor of any proxy",
    )
    ap.add_argument(
        "--layout",
        default="shared,sidecar",
        help="CPU layouts to measure, comma-separated: shared (all on all cores), sidecar "
        "(the front on a core of its own, as in a pod)",
    )
    ap.add_argument("--budget-mib", type=int, default=256)
    ap.add_argument("--copies", type=int, default=8, help="concurrent copies of each attack")
    args = ap.parse_args(argv)
    args.requests_set, args.rounds_set = args.requests is not None, args.rounds is not None
    if args.engine == "real":
        return args
    if args.quick:
        args.requests = 200
        args.rounds = 2
    args.requests = 1200 if args.requests is None else args.requests
    args.rounds = 6 if args.rounds is None else args.rounds
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.engine == "real":
        asyncio.run(real_overhead(args))
        return
    for layout in layouts(args.layout):
        asyncio.run(overhead(args, layout))
    asyncio.run(memory(args))


if __name__ == "__main__":
    main()

"""What an idle gap between requests costs a process on this machine, the front and others.

Issue 22 asks the front to add at most 2 % of the direct p50 at concurrency 1 on the real
engine: about 0.5 ms on a 25 ms answer. The front's CPU per answer at concurrency 1 there
is three to four times its CPU per answer under load. This bench separates the two
explanations: the front doing more work per request when idle, or the same work running
slower after the process has slept.

One client sends the same chat request by turns straight to the stand-in vLLM, through the
cache front, and through `bench/byte_relay.py` (a proxy that only copies bytes), one at a
time, after a pause of 0, 5 and 25 ms (25 ms: a real engine's answer here). The client and
the stand-in are on one core, the front and the relay on the other, so nothing else runs on
the proxies' core between their requests. For each pause it prints each process's p50 and
CPU per request; the summary gives each process's CPU per request after a pause against
its own without one (ratio 1.0: a pause costs nothing). The relay and the stand-in are
the baselines: a process that does almost nothing per request, and one that is not the
front. If all three slow down alike after a pause, the cost is this machine's (its caches
and host after a sleep), not work the front adds when idle.

    python -m bench.idle_wake            # ~1 minute
    python -m bench.idle_wake --quick
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.front_overhead import CHAT, chat_request
from bench.local_processes import start, wait_ok
from harness.net import free_port

PAUSES_MS = (0, 5, 25)


def cpu_seconds(pid: int) -> float:
    """The process's CPU time to the nanosecond: the sum of its threads' run time in
    /proc/PID/task/*/schedstat (/proc/PID/stat counts in 10 ms ticks, too coarse for
    processes that spend 0.1 ms on a request)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    return total / 1e9


@dataclass
class Arm:
    """One process answering the requests: its URL and the pid whose CPU is counted."""

    name: str
    url: str
    pid: int
    serves_all: bool = False
    """The upstream: every arm's requests reach it, so its CPU is per request of all arms."""
    latencies: dict[int, list[float]] = field(default_factory=dict)
    cpu: dict[int, float] = field(default_factory=dict)
    served: dict[int, int] = field(default_factory=dict)

    def p50_ms(self, pause: int) -> float:
        return 1e3 * statistics.median(self.latencies[pause])

    def cpu_ms(self, pause: int) -> float:
        return 1e3 * self.cpu[pause] / self.served[pause]


BODY, HEADERS = chat_request(stream=False, model="standin")
"""The one request every arm gets, built once: only the answer is on the clock."""


async def _send(http: aiohttp.ClientSession, arm: Arm, pause: int) -> None:
    started = time.perf_counter()
    async with http.post(arm.url + CHAT, data=BODY, headers=HEADERS) as resp:
        await resp.read()
        if resp.status != 200:
            raise SystemExit(f"{arm.name}: answered {resp.status}")
    arm.latencies.setdefault(pause, []).append(time.perf_counter() - started)


async def measure(arms: list[Arm], pause: int, requests: int) -> None:
    """`requests` per arm, the arms taking turns request by request (the order rotating),
    with `pause` ms of sleep (nothing else is in flight) before each."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        for arm in arms:  # open each arm's connection before the clock starts
            await _send(http, arm, -1)
        before = {arm.name: cpu_seconds(arm.pid) for arm in arms}
        for i in range(requests):
            for k in range(len(arms)):
                arm = arms[(i + k) % len(arms)]
                if pause:
                    await asyncio.sleep(pause / 1e3)
                await _send(http, arm, pause)
        for arm in arms:
            arm.cpu[pause] = cpu_seconds(arm.pid) - before[arm.name]
            arm.served[pause] = requests * len(arms) if arm.serves_all else requests


def _layout() -> tuple[frozenset[int], frozenset[int]]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("this bench needs two cores: one for the client and the stand-in")
    return frozenset(cpus[:1]), frozenset(cpus[1:2])


async def run(requests: int) -> None:
    client_cpus, proxy_cpus = _layout()
    os.sched_setaffinity(0, client_cpus)
    standin_port, front_port, relay_port = free_port(), free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        salt = Path(tmp) / "salt-key"
        salt.write_bytes(os.urandom(32))
        standin = await start("-m", "harness.standin", str(standin_port), cpus=client_cpus)
        front = await start(
            "-m", "promptcache.front", "--upstream", f"http://127.0.0.1:{standin_port}",
            "--listen", f"127.0.0.1:{front_port}", "--isolation-mode", "PerKey",
            "--salt-key-file", str(salt), cpus=proxy_cpus,
        )  # fmt: skip
        relay = await start(
            "-m", "bench.byte_relay", f"127.0.0.1:{relay_port}", f"127.0.0.1:{standin_port}",
            cpus=proxy_cpus,
        )  # fmt: skip
        procs = (standin, front, relay)
        try:
            arms = [
                Arm("stand-in", f"http://127.0.0.1:{standin_port}", standin.pid, serves_all=True),
                Arm("front", f"http://127.0.0.1:{front_port}", front.pid),
                Arm("relay", f"http://127.0.0.1:{relay_port}", relay.pid),
            ]
            async with aiohttp.ClientSession() as http:
                await wait_ok(http, arms[0].url + "/health", standin)
                await wait_ok(http, arms[1].url + "/readyz", front)
                await wait_ok(http, arms[2].url + "/health", relay)
            print(
                f"client and stand-in on CPU {min(client_cpus)}, front and relay on CPU "
                f"{min(proxy_cpus)}; {requests} requests per arm and pause; load average "
                f"before: {os.getloadavg()[0]:.1f}"
            )
            print(f"{'pause':>7}{'arm':>10}{'p50 ms':>9}{'CPU/req ms':>12}")
            for pause in PAUSES_MS:
                await measure(arms, pause, requests)
                for arm in arms:
                    print(
                        f"{pause:>5}ms{arm.name:>10}{arm.p50_ms(pause):>9.2f}"
                        f"{arm.cpu_ms(pause):>12.3f}"
                    )
        finally:
            for proc in procs:
                proc.terminate()
                await proc.wait()
    print()
    standin_arm, front_arm, relay_arm = arms
    for pause in PAUSES_MS[1:]:
        ratios = ", ".join(
            f"{arm.name} {arm.cpu_ms(pause) / arm.cpu_ms(0):.2f}x"
            for arm in (front_arm, relay_arm, standin_arm)
        )
        added = front_arm.p50_ms(pause) - standin_arm.p50_ms(pause)
        print(
            f"after {pause} ms idle, CPU per request vs none: {ratios}; "
            f"the front adds {added:+.2f} ms to the stand-in's p50 "
            f"(with no pause: {front_arm.p50_ms(0) - standin_arm.p50_ms(0):+.2f} ms)"
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=400, help="per arm and pause")
    ap.add_argument("--quick", action="store_true", help="100 requests per arm and pause")
    args = ap.parse_args(argv)
    asyncio.run(run(100 if args.quick else args.requests))


if __name__ == "__main__":
    main()

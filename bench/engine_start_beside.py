"""An engine's start beside a serving one: started inside its core, against started free.

A rollout starts a new engine while the old one serves. The harness's kubelet now starts
such an engine with its core as its only CPU and gives its processes but the worker every
core back once it is healthy (`harness.vllm.affinity`, which says why: MKL's core count
stalled some starts for minutes). This bench measures what that costs or saves:

* one engine (`A`) serves paced clients on core 0 for the whole run (`--clients`, each
  asking `--tokens` tokens and pausing `--pause` s, as the adapter tests' clients do);
* each round starts a second engine (`B`, worker bound to the last core) once per arm,
  arms in turns, rotated each round:
  * `free`: as before, every core allowed from its first instruction;
  * `confined`: inside its core until healthy, then released;
* for each start: seconds until `/health` answers, and from B's own log the seconds from
  the API server's first line to the EngineCore's, where the stalls were seen.

It prints each arm's median and worst against `free`, measured in the same run, and the
requests A served meanwhile.

    python -m bench.engine_start_beside               # ~6 minutes: 3 rounds of 2 arms
    python -m bench.engine_start_beside --rounds 5 --pause 0.3

Needs the engine layer (`scripts/engine`) and two free engine slots.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import aiohttp

from bench.engine_binding import bench_engine
from harness.vllm import engine_unavailable
from harness.vllm.cpu import OMP_BIND_ENV

ARMS = ("free", "confined")
BASELINE = ARMS[0]
_STAMP = re.compile(r"INFO (\d\d-\d\d \d\d:\d\d:\d\d)")


@dataclass
class Start:
    healthy_s: float
    core_s: float | None
    """API server's first line to the EngineCore's, from B's log (None: not found)."""


def core_phase(log: Path) -> float | None:
    """Seconds from the API server's `non-default args` line to the EngineCore's first,
    in the last start of `log` (vLLM stamps its lines to the second)."""
    api = core = None
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("=== start"):
            api = core = None
        stamp = _STAMP.search(line)
        if stamp is None:
            continue
        at = datetime.strptime(stamp.group(1), "%m-%d %H:%M:%S")
        if api is None and "non-default args" in line:
            api = at
        elif core is None and "Initializing a V1 LLM engine" in line:
            core = at
    return None if api is None or core is None else (core - api).total_seconds()


class Clients:
    """Paced clients of engine A, in a thread of their own, until stopped."""

    def __init__(self, url: str, clients: int, tokens: int, pause: float) -> None:
        self.url, self.clients, self.tokens, self.pause = url, clients, tokens, pause
        self.served = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _client(self, http: aiohttp.ClientSession, n: int) -> None:
        i = 0
        while not self._stop.is_set():
            body = {
                "model": "tiny",
                "prompt": f"client {n} request {i}: an engine starts beside me",
                "max_tokens": self.tokens,
                "ignore_eos": True,
                "temperature": 0,
                "stream": n % 2 == 0,
            }
            try:
                async with http.post(self.url + "/v1/completions", json=body) as resp:
                    text = await resp.text()
                    if resp.status == 200:
                        self.served += 1
                    else:
                        self.errors.append(f"{resp.status} {text[:120]}")
            except aiohttp.ClientError as error:  # counted, and the client goes on asking
                self.errors.append(repr(error))
            i += 1
            await asyncio.sleep(self.pause)

    async def _run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
            await asyncio.gather(*(self._client(http, n) for n in range(self.clients)))

    def __enter__(self) -> Clients:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)


def start_b(arm: str, core: int, workdir: Path, n: int) -> Start:
    server = bench_engine(
        workdir / f"b-{arm}-{n}",
        {OMP_BIND_ENV: str(core)},
        "vllm-b",
        start_cores=frozenset({core}) if arm == "confined" else None,
    )
    started = time.monotonic()
    try:
        server.start().wait_healthy()
        return Start(time.monotonic() - started, core_phase(server.log_path))
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--pause", type=float, default=1.0)
    args = ap.parse_args(argv)
    why = engine_unavailable()
    if why is not None:
        raise SystemExit(f"the engine is not installed ({why}): run scripts/engine")
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("one usable core: there is no other core to start beside")
    workdir = Path(tempfile.mkdtemp(prefix="engine-start-beside-"))
    starts: dict[str, list[Start]] = {arm: [] for arm in ARMS}
    a = bench_engine(workdir / "a", {OMP_BIND_ENV: str(cores[0])}, "vllm-a")
    try:
        with a, Clients(a.url, args.clients, args.tokens, args.pause) as clients:
            for r in range(args.rounds):
                order = ARMS[r % len(ARMS) :] + ARMS[: r % len(ARMS)]
                for arm in order:
                    s = start_b(arm, cores[-1], workdir, r)
                    starts[arm].append(s)
                    core = "?" if s.core_s is None else f"{s.core_s:.0f} s"
                    print(
                        f"round {r + 1} {arm:>8}: healthy in {s.healthy_s:5.1f} s"
                        f" (API server to EngineCore {core}); A served {clients.served}",
                        flush=True,
                    )
            served, errors = clients.served, clients.errors
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    base = statistics.median(s.healthy_s for s in starts[BASELINE])
    print(
        f"\n{args.rounds} rounds beside an engine serving {args.clients} paced clients;"
        f" A served {served} requests,"
        f" {len(errors)} failed{': ' + errors[0] if errors else ''}."
        f" Ratio against `{BASELINE}` (below 1: faster)"
    )
    for arm, got in starts.items():
        healthy = [s.healthy_s for s in got]
        phases = [s.core_s for s in got if s.core_s is not None]
        print(
            f"  {arm:>8}: healthy median {statistics.median(healthy):5.1f} s"
            f" ({statistics.median(healthy) / base:.2f}), worst {max(healthy):5.1f} s;"
            f" API server to EngineCore {', '.join(f'{c:.0f}' for c in phases)} s"
        )
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What predicted-against-delivered accounting costs the cache front per request (issue 39).

    python -m bench.ladder_overhead                 # ~1.5 minutes
    python -m bench.ladder_overhead --micro-only    # ~10 s
    python -m bench.ladder_overhead --e2e-rounds 40 # tighter end-to-end figure

In one run, per request:
  accounting:  what the front adds for a request promptcache's picker predicted: the
               signed header checked (`PredictionReader.read`, a fresh signature each time,
               through one replay guard), its verdict counted, and the usage counted with
               the prediction (`FrontMetrics.observe_usage` with a `Tally`) minus the same
               count without it;
  reference:   the front's isolation decision (`apply_policy`) on a 2 KiB chat body, a
               part of the work every request already costs it, measured beside it so the
               machine's load cancels out.
It prints microseconds per request, the ratio, and the accounting as a share of the front's
CPU per request `--front-us` (about 280 us at concurrency 64 by bench/front_overhead.py,
docs/cache-front.md), or of the figure the end-to-end part measured.

End to end (unless --micro-only), on real sockets: the front run as a pod runs it (PerKey, a
salt key) before a stand-in vLLM that answers at once with usage, gets rounds of the same
2 KiB chat requests, alternately all with a valid signed prediction (a fresh one each, as
the picker sends it) and all without the header; the front process's own CPU per request
(its threads' schedstat) in each round. The difference of paired rounds is what the
accounting costs the whole request path (aiohttp parsing one more header, the check, the
count, dropping the header before vLLM), as a share of the front's CPU without it; the run
fails if the front did not believe every signed header. Its paired rounds differ by more
than the accounting (a few per cent), so it needs many rounds; the verdict says when the
noise leaves the goal undecided.

In situ (unless --micro-only): the front again, run with the accounting's two steps timed
in place (`bench/ladder_in_situ.py`: thread CPU time around the header's check and count
and around the usage's count), requests with and without the header interleaved one by
one; with minus without, per round. A loop that calls the check alone keeps it in the
CPU's caches; in the front a request's other work has evicted them, and it costs several
times more: this, against the end-to-end part's CPU per request, is the share the front
pays.

The goal (issue 39): at most 2 % of the front's CPU per request. The picker's side: `go
test -run X -bench PerRequest ./plugins/predicted/` in picker/. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
from multidict import CIMultiDict

from bench.front_overhead import CHAT, KEY_HEADER
from bench.local_processes import start, wait_ok
from harness.net import free_port
from promptcache.contract import PREDICTED_MATCH_HEADER, IsolationMode, LadderCounter
from promptcache.embeds.cache import PromptEmbedsCache
from promptcache.front.hits import ScopeClass, Tally
from promptcache.front.metrics import FrontMetrics
from promptcache.tenancy.policy import apply_policy
from promptcache.tenancy.prediction import Prediction, PredictionReader, prediction_key, sign
from promptcache.tenancy.routes import check_route
from promptcache.tenancy.settings import PolicySettings

SECRET = b"b" * 32
GOAL_SHARE = 0.02

VALID: Final = 'promptcache_front_predictions_total{outcome="valid"}'
ACCOUNTED: Final = LadderCounter.ACCOUNTED.sample


def verdict(mean: float, spread: float, per_request: float) -> str:
    """Whether the goal is met, as far as the noise (`spread`: 2 standard errors) tells."""
    if (mean + spread) / per_request <= GOAL_SHARE:
        return "met"
    if (mean - spread) / per_request > GOAL_SHARE:
        return "missed"
    return "within the noise of it"


BATCHES: Final = 5


def _per_call_us(arms: list[Callable[[int], Any]], rounds: int) -> list[float]:
    """Each arm's µs per call: the best of `BATCHES` batches, the arms' batches interleaved
    (so a burst of other work on the machine hits all of them, and the best batch of each is
    the least disturbed)."""
    best = [float("inf")] * len(arms)
    for run in arms:
        run(0)  # warm
    for batch in range(BATCHES):
        for n, run in enumerate(arms):
            start = time.perf_counter()
            for i in range(rounds):
                run(batch * rounds + i + 1)
            best[n] = min(best[n], (time.perf_counter() - start) / rounds)
    return [b * 1e6 for b in best]


def micro(args: argparse.Namespace) -> float:
    """The accounting's own parts beside the isolation decision; its µs per request."""
    key = prediction_key(SECRET)
    prediction = Prediction(40, 50, 16, 48, 44)
    now = int(time.time())
    values = [[sign(key, prediction, now=now)] for _ in range(BATCHES * args.rounds + 1)]
    reader = PredictionReader(SECRET, clock=lambda: now)
    metrics = FrontMetrics(PromptEmbedsCache(0).stats)
    tally = Tally(ScopeClass.KEYED, prediction)

    def accounting(i: int) -> Any:
        verdict = reader.read(values[i])
        metrics.predicted(verdict.outcome.value)
        metrics.observe_usage(800, 640, tally)

    def plain_usage(i: int) -> Any:
        metrics.observe_usage(800, 640, None)

    settings = PolicySettings(isolation_mode=IsolationMode.PER_KEY)
    route = check_route("POST", "/v1/chat/completions")
    headers = CIMultiDict({"x-prompt-cache-isolation-key": "team"})
    text = ("lorem ipsum dolor sit amet " * 80)[:2048]
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]})

    def reference(i: int) -> Any:
        return apply_policy(route, headers, json.loads(raw), settings, SECRET)

    t_with, t_without, t_ref = _per_call_us([accounting, plain_usage, reference], args.rounds)
    t_acc = t_with - t_without
    share = t_acc / args.front_us
    print(f"accounting {t_acc:.1f} us/request; reference (isolation decision, 2 KiB) "
          f"{t_ref:.1f} us; ratio {t_acc / t_ref:.2f}")  # fmt: skip
    print(f"share of the front's ~{args.front_us:.0f} us per request: {100 * share:.1f} % "
          f"(goal <= {100 * GOAL_SHARE:.0f} %)")  # fmt: skip
    return t_acc


# --- end to end: the front's own CPU per request, with and without the picker's header ---


def front_cpu_seconds(pid: int) -> float:
    """CPU time of every live thread of `pid`, in nanosecond resolution (schedstat): the
    tick counts of /proc/PID/stat (10 ms) are too coarse for a difference of a few µs a
    request over rounds of a second or two."""
    total = 0
    for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
        with contextlib.suppress(OSError):  # the thread ended meanwhile
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def chat_body() -> bytes:
    """The 2 KiB chat body the micro part's reference decides on."""
    text = ("lorem ipsum dolor sit amet " * 80)[:2048]
    body = {"model": "standin", "messages": [{"role": "user", "content": text}], "max_tokens": 8}
    return json.dumps(body).encode()


async def _round(
    http: aiohttp.ClientSession, url: str, headers: list[dict[str, str]], concurrency: int
) -> int:
    """Send one request per header set, `concurrency` at a time; the answers other than 200."""
    body, queue, failed = chat_body(), iter(headers), 0

    async def worker() -> None:
        nonlocal failed
        for sent in queue:
            async with http.post(url + CHAT, data=body, headers=sent) as resp:
                await resp.read()
                failed += resp.status != 200

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return failed


def header_sets(secret: bytes, n: int, *, signed: bool) -> list[dict[str, str]]:
    """`n` requests' headers: an isolation key on each, and, when `signed`, the picker's
    header as it signs it (a fresh nonce each: the replay guard admits every one)."""
    base = {"Content-Type": "application/json", KEY_HEADER: "team"}
    if not signed:
        return [base] * n
    key, now = prediction_key(secret), int(time.time())
    prediction = Prediction(40, 50, 16, 48, 44)
    return [{**base, PREDICTED_MATCH_HEADER: sign(key, prediction, now=now)} for _ in range(n)]


def _stands_for(weighted: float, sent: int) -> bool:
    """Whether a weighted count of valid verdicts is an estimate of `sent` (within 25 %:
    a sample of a few hundred drawn at random)."""
    return abs(weighted - sent) <= 0.25 * sent


async def _counted(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """The front's verdict counts and accounted tokens, from its /metrics."""
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
        if resp.status != 200:
            raise SystemExit(f"the front's /metrics answered {resp.status}: {text[:200]}")
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith((VALID, ACCOUNTED + "{")):
            name, value = line.rsplit(" ", 1)
            name = name if name == VALID else ACCOUNTED  # every scope class's
            out[name] = out.get(name, 0.0) + float(value)
    return out


@contextlib.asynccontextmanager
async def _front(
    module: str, secret: bytes
) -> AsyncIterator[tuple[aiohttp.ClientSession, str, asyncio.subprocess.Process]]:
    """A stand-in vLLM, then the front (`python -m MODULE`, PerKey, a salt key) before it, as
    a pod runs it; a session, the front's URL and process. The front's port is chosen once
    the stand-in listens, and what answers on it must be the front (the stand-in answers
    every path, so a port the front failed to bind would otherwise measure the stand-in)."""
    with tempfile.TemporaryDirectory() as tmp:
        salt = Path(tmp) / "salt-key"
        salt.write_bytes(secret)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=timeout
        ) as http:
            standin_port = free_port()
            direct = f"http://127.0.0.1:{standin_port}"
            standin = await start("-m", "harness.standin", str(standin_port))
            procs = [standin]
            try:
                await wait_ok(http, direct + "/health", standin)
                front_port = free_port()
                url = f"http://127.0.0.1:{front_port}"
                front = await start(
                    "-m", module, "--upstream", direct, "--listen", f"127.0.0.1:{front_port}",
                    "--isolation-mode", "PerKey", "--salt-key-file", str(salt),
                    "--tenant-share-percent", "100",
                )  # fmt: skip
                procs.append(front)
                await wait_ok(http, url + "/readyz", front)
                async with http.get(url + "/metrics") as resp:
                    if b"promptcache_front_" not in await resp.read():
                        raise SystemExit(f"{url} is not the front (its port was taken)")
                yield http, url, front
                if front.returncode is not None:
                    raise SystemExit(f"the front exited ({front.returncode}) during the run")
            finally:
                for proc in reversed(procs):
                    if proc.returncode is None:
                        proc.terminate()
                    await proc.wait()


@dataclass
class Arm:
    """One arm's totals over its rounds, and its CPU per request in each round."""

    requests: int = 0
    cpu: float = 0.0
    per_round: list[float] = field(default_factory=list)

    @property
    def us(self) -> float:
        return 1e6 * self.cpu / self.requests


async def end_to_end(args: argparse.Namespace) -> float:
    """The front as a pod runs it (PerKey, a salt key) before a stand-in vLLM that answers at
    once with usage (prompt and cached tokens), on real sockets: rounds of the same 2 KiB chat
    requests, alternately all with a valid signed prediction and all without the header, and
    the front process's CPU per request in each."""
    arms = {True: Arm(), False: Arm()}
    secret = secrets.token_hex(32).encode()  # as a salt file holds it: no edge whitespace
    loads = [os.getloadavg()[0]]
    async with _front("promptcache.front", secret) as (http, url, front):
        for signed in (True, False):  # warm both paths and every connection
            await _round(http, url, header_sets(secret, 500, signed=signed), args.conc)
        before = await _counted(http, url)
        for r in range(args.e2e_rounds):
            for signed in (True, False) if r % 2 == 0 else (False, True):
                headers = header_sets(secret, args.e2e_requests, signed=signed)
                cpu0 = front_cpu_seconds(front.pid)
                failed = await _round(http, url, headers, args.conc)
                cpu = front_cpu_seconds(front.pid) - cpu0
                if failed:
                    raise SystemExit(f"{failed} requests failed through the front")
                arm = arms[signed]
                arm.requests += len(headers)
                arm.cpu += cpu
                arm.per_round.append(1e6 * cpu / len(headers))
            loads.append(os.getloadavg()[0])
        after = await _counted(http, url)
    _report(arms, before, after, loads, args)
    return arms[False].us


def _report(
    arms: dict[bool, Arm],
    before: dict[str, float],
    after: dict[str, float],
    loads: list[float],
    args: argparse.Namespace,
) -> None:
    valid = after.get(VALID, 0.0) - before.get(VALID, 0.0)
    accounted = after.get(ACCOUNTED, 0.0) - before.get(ACCOUNTED, 0.0)
    # Above `front.sampling.CHECKS_PER_SECOND` the verdicts are a weighted sample: their
    # sum stands for the requests (an estimate), and is far off only if headers were not
    # believed (a forged one counts nothing valid) or the arms measured nothing.
    if not _stands_for(valid, arms[True].requests) or accounted <= 0:
        raise SystemExit(f"the front counted {valid:.0f} valid predictions of "
                         f"{arms[True].requests} signed, {accounted:.0f} tokens")  # fmt: skip
    with_, without = arms[True], arms[False]
    diffs = [w - o for w, o in zip(with_.per_round, without.per_round, strict=True)]
    mean = statistics.fmean(diffs)
    spread = 2 * statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
    share = mean / without.us
    print(f"end to end (front process CPU, concurrency {args.conc}, "
          f"{args.e2e_rounds} x {args.e2e_requests} requests per arm, load "
          f"{min(loads):.1f}-{max(loads):.1f}): with the signed header {with_.us:.1f} us, "
          f"without {without.us:.1f} us per request")  # fmt: skip
    print(f"end to end: the accounting adds {mean:+.1f} +- {spread:.1f} us per request "
          f"(mean of the paired rounds, +- 2 standard errors) = {100 * share:+.1f} % of the "
          f"front's CPU per request (goal <= {100 * GOAL_SHARE:.0f} %: "
          f"{verdict(mean, spread, without.us)})")  # fmt: skip


IN_SITU_FIELDS: Final = ("tally_with", "tally_without", "usage_with", "usage_without")


def _in_situ_line(line: str) -> dict[str, float]:
    return {k: float(v) for k, v in (item.split("=") for item in line.split())}


async def in_situ(args: argparse.Namespace) -> list[float]:
    """The accounting's steps timed inside the front (`bench/ladder_in_situ.py`): rounds of
    requests with and without the signed header interleaved one by one, so both see the
    same moments; per round, the with-minus-without thread CPU time of the two steps."""
    secret = secrets.token_hex(32).encode()  # as a salt file holds it: no edge whitespace
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "in-situ"
        os.environ["LADDER_IN_SITU_OUT"] = str(out)
        async with _front("bench.ladder_in_situ", secret) as (http, url, front):
            before = await _counted(http, url)
            for r in range(args.in_situ_rounds + 1):  # the first warms, not counted
                n = args.e2e_requests // 2
                signed = header_sets(secret, n, signed=True)
                plain = header_sets(secret, n, signed=False)
                mixed = [h for pair in zip(signed, plain, strict=True) for h in pair]
                if await _round(http, url, mixed, args.conc):
                    raise SystemExit("requests failed through the front")
                front.send_signal(signal.SIGUSR1)
                for _ in range(100):  # until the front has written round r's line
                    await asyncio.sleep(0.05)
                    if out.exists() and len(out.read_text().splitlines()) > r:
                        break
            valid = (await _counted(http, url)).get(VALID, 0.0) - before.get(VALID, 0.0)
            sent = (args.in_situ_rounds + 1) * (args.e2e_requests // 2)
            if not _stands_for(valid, sent):
                raise SystemExit(f"in situ: the front believed {valid:.0f} of {sent} signed")
        lines = [_in_situ_line(line) for line in out.read_text().splitlines()[1:]]
    return [
        (x["tally_with"] - x["tally_without"]) + (x["usage_with"] - x["usage_without"])
        for x in lines
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5000, help="micro: calls per batch")
    parser.add_argument("--front-us", type=float, default=280.0,
                        help="micro: the front's CPU per request to divide by")  # fmt: skip
    parser.add_argument("--micro-only", action="store_true", help="skip the end-to-end part")
    parser.add_argument("--conc", type=int, default=64, help="end to end: concurrency")
    parser.add_argument("--e2e-rounds", type=int, default=12, help="end to end: rounds per arm")
    parser.add_argument("--e2e-requests", type=int, default=1500,
                        help="end to end and in situ: requests per round")  # fmt: skip
    parser.add_argument("--in-situ-rounds", type=int, default=8, help="in situ: rounds")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    t_acc = micro(args)
    if args.micro_only:
        return
    front_us = asyncio.run(end_to_end(args))
    print(f"micro accounting {t_acc:.1f} us as a share of the front's measured {front_us:.0f} "
          f"us per request: {100 * t_acc / front_us:.1f} %")  # fmt: skip
    rounds = asyncio.run(in_situ(args))
    mean = statistics.fmean(rounds)
    spread = 2 * statistics.stdev(rounds) / len(rounds) ** 0.5 if len(rounds) > 1 else 0.0
    share = mean / front_us
    print(f"in situ (thread CPU time of the two steps inside the front, with minus without, "
          f"{len(rounds)} rounds, load {os.getloadavg()[0]:.1f}): {mean:.1f} +- {spread:.1f} us "
          f"per request = {100 * share:.1f} % of the front's measured {front_us:.0f} us "
          f"(goal <= {100 * GOAL_SHARE:.0f} %: {verdict(mean, spread, front_us)})"
    )  # fmt: skip


if __name__ == "__main__":
    main()

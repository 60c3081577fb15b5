"""Mixed hostile load against one cache front and one gateway policy step (issue 23).

Processes as a pod runs them: the stand-in vLLM (`harness.standin`), the front
(`python -m promptcache.front`, PerKey) in front of it, and the policy step
(`python -m promptcache.cli gateway-policy`, PerKey) in front of a recording stand-in
picker (the tests' `FakeEpp`, in this process). Two phases of equal length, in one run:

* quiet: tenants' chat requests through the front, ext_proc streams through the step,
  and `/healthz` polled every 50 ms;
* hostile: the same, plus attackers: dense JSON bodies (small objects, long int arrays),
  deflated and pickle-bomb prompt-embeds payloads, clients that stop reading long
  streamed answers, clients that stall mid-body, and the same dense and stalled bodies
  against the step.

Printed: p99 `/healthz` latency; tenants' success rate and p99 latency against the quiet
phase, for each process; each process's peak RSS (`VmHWM`) against its configured budget.
Goals: health p99 < 100 ms; tenants >= 99 % served with p99 <= 2x quiet; RSS below the
budget plus a fixed margin (the runtime: `RSS_MARGIN`).

    python -m bench.hostile_load            # 20 s per phase
    python -m bench.hostile_load --seconds 8
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import os
import socket
import sys
import tempfile
import time
import zipfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc.aio

from bench.local_processes import start, wait_ok
from harness.extproc_gateway import Gateway, body_msg, headers_msg, start_upstream
from harness.net import free_port

FRONT_BUDGET = 256 * 1024**2
"""The front's `--max-in-flight-bytes`."""
STEP_BUDGET = 64 * 1024**2
"""The step's `--max-buffered-bytes`."""
STEP_MAX_BODY = 8 * 1024**2
RSS_MARGIN = 160 * 1024**2
"""What a process may grow beyond its budget under load, measured from its peak after a
warm-up (interpreter, aiohttp/grpc and, for the front, torch are in that baseline; the
margin is buffers, worker processes' interpreters and allocator slack)."""
WARM_PAYLOAD = base64.b64encode(b"not a payload").decode()
"""Refused, but only after the front has imported torch's decoder (the warm-up's point)."""
KEY = "x-prompt-cache-isolation-key"


def peak_rss(pid: int) -> int:
    """The peak RSS of `pid` plus that of its live children (the step's decide workers)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            with contextlib.suppress(OSError):
                total += peak_rss(int(child))
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return total + int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


HEALTH_PROBE = """
import http.client, json, sys, time
port, seconds = int(sys.argv[1]), float(sys.argv[2])
out, end, conn = [], time.monotonic() + seconds, None
while time.monotonic() < end:
    t = time.perf_counter()
    try:
        conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/healthz")
        ok = conn.getresponse().read() and True
    except OSError:
        ok, conn = False, None
    out.append((time.perf_counter() - t, ok))
    time.sleep(0.05)
print(json.dumps(out))
"""
"""The kubelet's view: /healthz polled from a process of its own (so the bench's own
load generation never counts as the front's latency)."""


async def health_probe(port: int, seconds: float, tally: Tally) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HEALTH_PROBE, str(port), str(seconds),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate()
    for latency, ok in json.loads(out):
        tally.latencies.append(latency)
        if ok:
            tally.ok += 1
        else:
            tally.failed += 1


def p99(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    ok: int = 0
    failed: int = 0

    def rate(self) -> float:
        total = self.ok + self.failed
        return self.ok / total if total else float("nan")


@dataclass
class Phase:
    health: Tally = field(default_factory=Tally)
    front: Tally = field(default_factory=Tally)
    step: Tally = field(default_factory=Tally)


def chat(tenant: str, i: int) -> dict[str, Any]:
    return {
        "model": "standin",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": f"tenant {tenant} question {i} " * 8}],
    }


async def timed(tally: Tally, job: Callable[[], Awaitable[bool]]) -> None:
    started = time.perf_counter()
    try:
        good = await asyncio.wait_for(job(), 30)
    except (TimeoutError, aiohttp.ClientError, grpc.aio.AioRpcError, OSError):
        good = False
    tally.latencies.append(time.perf_counter() - started)
    if good:
        tally.ok += 1
    else:
        tally.failed += 1


async def until(deadline: float, body: Callable[[], Awaitable[None]]) -> None:
    while time.monotonic() < deadline:
        await body()


# --------------------------------------------------------------------------- tenants


async def front_tenant(
    http: aiohttp.ClientSession, url: str, tenant: str, deadline: float, t: Tally
) -> None:
    i = 0

    async def ask() -> bool:
        async with http.post(
            url + "/v1/chat/completions", json=chat(tenant, i), headers={KEY: tenant}
        ) as answer:
            await answer.read()
            return answer.status == 200

    async def once() -> None:
        nonlocal i
        i += 1
        await timed(t, ask)

    await until(deadline, once)


async def step_tenant(target: str, tenant: str, deadline: float, t: Tally) -> None:
    gateway = Gateway(target)
    i = 0

    async def ask() -> bool:
        responses = await gateway.exchange(
            headers_msg({KEY: tenant}), body_msg(json.dumps(chat(tenant, i)).encode())
        )
        return any(r.WhichOneof("response") == "request_body" for r in responses)

    async def once() -> None:
        nonlocal i
        i += 1
        await timed(t, ask)

    try:
        await until(deadline, once)
    finally:
        await gateway.close()


# --------------------------------------------------------------------------- attackers


def dense_objects(size: int) -> bytes:
    return ('{"model":"m","messages":[' + ",".join(['{"a":1}'] * (size // 8)) + "]}").encode()


def dense_ints(size: int) -> bytes:
    return ('{"model":"m","prompt":[' + ",".join(["1"] * (size // 2)) + "]}").encode()


def deflated_bomb() -> str:
    """A torch.save-shaped zip whose storage record is 64 MiB of zeros, deflated."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("archive/data/0", bytes(64 * 1024**2))
    return base64.b64encode(out.getvalue()).decode()


async def front_bomber(
    http: aiohttp.ClientSession, url: str, bodies: list[bytes], deadline: float
) -> None:
    async def send() -> None:
        for raw in bodies:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with http.post(
                    url + "/v1/completions",
                    data=raw,
                    headers={"Content-Type": "application/json", KEY: "attacker"},
                ) as answer:
                    await answer.read()

    await until(deadline, send)


async def stalled_reader(port: int, deadline: float) -> None:
    """Asks for a long streamed answer, reads its first bytes, then never reads again."""
    body = json.dumps(
        {"model": "standin", "stream": True, "max_tokens": 50_000,
         "messages": [{"role": "user", "content": "go"}]}
    ).encode()  # fmt: skip
    loop = asyncio.get_running_loop()
    while time.monotonic() < deadline:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, ("127.0.0.1", port))
            head = (
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                f"application/json\r\n{KEY}: attacker\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode()
            await loop.sock_sendall(sock, head + body)
            await asyncio.wait_for(loop.sock_recv(sock, 512), 10)
            while time.monotonic() < deadline:  # hold it until the front cuts it
                await asyncio.sleep(0.5)
                if sock.fileno() < 0:
                    break
                try:
                    sock.send(b"")
                except OSError:
                    break
        except (OSError, TimeoutError):
            pass
        finally:
            sock.close()
        await asyncio.sleep(0.2)


async def stalled_writer(port: int, deadline: float) -> None:
    """Sends headers and part of a 1 MiB body, then nothing."""
    loop = asyncio.get_running_loop()
    while time.monotonic() < deadline:
        sock = socket.socket()
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, ("127.0.0.1", port))
            head = (
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                f"application/json\r\n{KEY}: attacker\r\nContent-Length: {1 << 20}\r\n\r\n"
            ).encode()
            await loop.sock_sendall(sock, head + b'{"messages":[' + b" " * 65536)
            with contextlib.suppress(TimeoutError, OSError):
                await asyncio.wait_for(loop.sock_recv(sock, 512), deadline - time.monotonic())
        except OSError:
            pass
        finally:
            sock.close()


async def step_bomber(target: str, raw: bytes, deadline: float) -> None:
    gateway = Gateway(target)

    async def send() -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, TimeoutError):
            await gateway.exchange(headers_msg({KEY: "attacker"}), body_msg(raw))

    try:
        await until(deadline, send)
    finally:
        await gateway.close()


async def step_staller(target: str, deadline: float) -> None:
    """Opens a stream, sends a body's first 4 MiB, and then nothing."""
    gateway = Gateway(target)
    try:
        while time.monotonic() < deadline:
            call = gateway.open()
            with contextlib.suppress(grpc.aio.AioRpcError, TimeoutError):
                await call.write(headers_msg({KEY: "attacker"}))
                await call.write(body_msg(b'{"messages":[' + b" " * (4 << 20), end_of_stream=False))
                await asyncio.wait_for(call.read(), max(deadline - time.monotonic(), 0.1))
            call.cancel()
    finally:
        await gateway.close()


# --------------------------------------------------------------------------- the run


async def phase(
    http: aiohttp.ClientSession,
    front_url: str,
    front_port: int,
    step_target: str,
    seconds: float,
    attacks: Attacks | None,
) -> Phase:
    result = Phase()
    deadline = time.monotonic() + seconds
    jobs = [health_probe(front_port, seconds, result.health)]
    jobs += [front_tenant(http, front_url, f"t{i}", deadline, result.front) for i in range(4)]
    jobs += [step_tenant(step_target, f"t{i}", deadline, result.step) for i in range(4)]
    if attacks is not None:
        bodies = attacks.front
        jobs += [front_bomber(http, front_url, bodies, deadline) for _ in range(2)]
        jobs += [stalled_reader(front_port, deadline) for _ in range(8)]
        jobs += [stalled_writer(front_port, deadline) for _ in range(8)]
        jobs += [step_bomber(step_target, attacks.step[0], deadline) for _ in range(2)]
        jobs += [step_bomber(step_target, attacks.step[1], deadline)]
        jobs += [step_staller(step_target, deadline) for _ in range(8)]
    await asyncio.gather(*jobs)
    return result


@dataclass
class Attacks:
    """The attack bodies, built once before the phases (building them costs the bench)."""

    front: list[bytes]
    step: list[bytes]

    @classmethod
    def build(cls) -> Attacks:
        embeds = json.dumps({"model": "m", "prompt": "x", "prompt_embeds": deflated_bomb()})
        return cls(
            front=[dense_objects(2 << 20), dense_ints(4 << 20), embeds.encode()],
            step=[dense_objects(1 << 20), dense_ints(4 << 20)],
        )


def report(name: str, quiet: Tally, loud: Tally) -> tuple[bool, str]:
    ratio = p99(loud.latencies) / p99(quiet.latencies)
    good = loud.rate() >= 0.99 and ratio <= 2.0
    return good, (
        f"  {name:<22} served {quiet.rate():7.2%} -> {loud.rate():7.2%}   "
        f"p99 {p99(quiet.latencies) * 1e3:7.1f} -> {p99(loud.latencies) * 1e3:7.1f} ms "
        f"({ratio:4.2f}x)  [{loud.ok + loud.failed} requests]  "
        f"{'ok' if good else 'MISSED'}"
    )


async def main(args: argparse.Namespace) -> None:
    standin_port, front_port, step_port = free_port(), free_port(), free_port()
    picker = await start_upstream()
    with tempfile.TemporaryDirectory() as tmp:
        salt = Path(tmp) / "salt-key"
        salt.write_bytes(os.urandom(32))
        standin = await start("-m", "harness.standin", str(standin_port), "--usage-from-engine")
        front = await start(
            "-m", "promptcache.front", "--upstream", f"http://127.0.0.1:{standin_port}",
            "--listen", f"127.0.0.1:{front_port}", "--isolation-mode", "PerKey",
            "--salt-key-file", str(salt), "--max-in-flight", "64",
            "--max-in-flight-bytes", str(FRONT_BUDGET), "--write-timeout-seconds", "2",
            "--body-timeout-seconds", "5",
        )  # fmt: skip
        step = await start(
            "-m", "promptcache.cli", "gateway-policy", "--listen", f"127.0.0.1:{step_port}",
            "--upstream", picker.target, "--isolation-mode", "PerKey",
            "--salt-key-file", str(salt), "--max-body-bytes", str(STEP_MAX_BODY),
            "--max-buffered-bytes", str(STEP_BUDGET), "--body-timeout-seconds", "5",
            "--metrics-listen", "",
        )  # fmt: skip
        front_url = f"http://127.0.0.1:{front_port}"
        step_target = f"127.0.0.1:{step_port}"
        try:
            timeout = aiohttp.ClientTimeout(total=60)
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
                await wait_ok(http, f"http://127.0.0.1:{standin_port}/health", standin)
                await wait_ok(http, front_url + "/readyz", front)
                for _ in range(100):  # the step: one decided exchange
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        gw = Gateway(step_target)
                        await gw.exchange(headers_msg({KEY: "w"}), body_msg(b'{"messages":[]}'))
                        await gw.close()
                        break
                    await asyncio.sleep(0.1)
                # torch loads at the first prompt-embeds payload: in the baseline, not the growth
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.post(
                        front_url + "/v1/completions",
                        json={"model": "m", "prompt": "x", "prompt_embeds": WARM_PAYLOAD},
                        headers={KEY: "warm"},
                    ) as warm:
                        await warm.read()
                before = {"front": peak_rss(front.pid), "step": peak_rss(step.pid)}
                attacks = Attacks.build()
                quiet = await phase(http, front_url, front_port, step_target, args.seconds, None)
                loud = await phase(http, front_url, front_port, step_target, args.seconds, attacks)
                after = {"front": peak_rss(front.pid), "step": peak_rss(step.pid)}
        finally:
            for proc in (front, step, standin):
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
                await proc.wait()
            await picker.server.stop(0)
    print(f"hostile load, {args.seconds:g} s quiet then {args.seconds:g} s hostile, same run")
    health = p99(loud.health.latencies) * 1e3
    print(
        f"  /healthz p99            quiet {p99(quiet.health.latencies) * 1e3:.1f} ms, "
        f"hostile {health:.1f} ms (served {loud.health.rate():.2%})  "
        f"{'ok' if health < 100 else 'MISSED'} (goal < 100 ms)"
    )
    for name, q, h in (
        ("front tenants", quiet.front, loud.front),
        ("policy-step tenants", quiet.step, loud.step),
    ):
        print(report(name, q, h)[1])
    for name, budget in (("front", FRONT_BUDGET), ("step", STEP_BUDGET)):
        peak, growth = after[name], after[name] - before[name]
        good = growth <= budget + RSS_MARGIN
        print(
            f"  peak RSS {name:<6} {before[name] >> 20} MiB warm, {peak >> 20} MiB after "
            f"(+{growth >> 20} MiB); budget {budget >> 20} MiB + margin "
            f"{RSS_MARGIN >> 20} MiB  {'ok' if good else 'MISSED'}"
        )


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.hostile_load", description=__doc__)
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    return ap


if __name__ == "__main__":
    asyncio.run(main(_parser().parse_args()))

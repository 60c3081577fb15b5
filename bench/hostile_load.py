"""Mixed hostile load against one cache front and one gateway policy step (issue 23).

Processes as pods run them: the stand-in vLLM (`harness.standin`), the front
(`python -m promptcache.front`, PerKey) in front of it, and the policy step
(`python -m promptcache.cli gateway-policy`, PerKey) in front of a stand-in picker (the
tests' `FakeEpp`), each a process of its own. Two phases of equal length per run:

* quiet: tenants' chat requests through the front, ext_proc streams through the step,
  and `/healthz` polled every 50 ms (tenants and the probe each in a process of their
  own, so the attackers' work in this process never counts as the front's latency);
* hostile: the same, plus attackers: dense JSON bodies (small objects, long int arrays),
  deflated prompt-embeds payloads, clients that stop reading long streamed answers,
  clients that stall mid-body, and the same dense and stalled bodies against the step;
  with `hold` (issue 43), one tenant sized to take everything: as many clients that stop
  reading as the front has slots, as many stalled bodies as it has body reads, as many
  half-sent heads as it has slots, and twice the step's budget in stalled 4 MiB bodies, 64
  stalled 64 KiB ones (to fill what the large leave) and 64 half-sent requests; with
  `account`, that tenant spreads them over a new isolation key each under one account (the
  step reads the account header, the front the step's signed attestation).

Three CPU layouts (`--layout`): `shared`, every process floating over this machine's
cores and both processes attacked at once; `sidecar`, the attacked process alone on a
core (a container with its own CPU request) and everything else on the other, once for
the front and once for the step; `pod`, the front and the stand-in vLLM behind it on a
core of their own (a model-server pod with its own CPU) and the attackers, tenants and
the rest on the other.

Printed per run: p99 `/healthz` latency; tenants' success rate and p99 latency against
the quiet phase, for each process; a control of two tenants sent straight to the
stand-in vLLM (how much of the front tenants' latency is the engine's own); each
process's peak RSS (`VmHWM`) against its configured budget; the cores each process used
in each phase (what the attack costs, and whom). Goals: health p99 < 100 ms; tenants >=
99 % served with p99 <= 2x quiet; RSS below the budget plus a fixed margin
(`RSS_MARGIN`).

    python -m bench.hostile_load                        # 20 s per phase, every layout
    python -m bench.hostile_load --seconds 8 --layout sidecar
    python -m bench.hostile_load --seconds 8 --layout shared --attacks hold
    python -m bench.hostile_load --seconds 8 --layout shared --attacks hold,account
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import io
import json
import os
import socket
import statistics
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
from multidict import CIMultiDict

from bench.local_processes import start, wait_ok
from harness.extproc_gateway import Gateway, body_msg, headers_msg
from harness.net import free_port
from promptcache.contract import IDENTITY_ATTESTATION_HEADER
from promptcache.contract.front import DEFAULT_FAIR_SHARE_BYTES_PER_SECOND
from promptcache.tenancy.attestation import Attester
from promptcache.tenancy.identity import Account

FRONT_BUDGET = 256 * 1024**2
"""The front's `--max-in-flight-bytes`."""
FRONT_SLOTS = 64
"""The front's `--max-in-flight`: the `hold` attack opens this many of each kind."""
FRONT_BODY_READS = 128
"""The front's `--max-body-reads` (its default)."""
ACCOUNT_HEADER = "x-account"
"""The identity header the step reads (isolation by account) when `account` is attacked."""
MALLORY = "mallory"
STEP_BUDGET = 64 * 1024**2
"""The step's `--max-buffered-bytes`."""
STEP_MAX_BODY = 8 * 1024**2
ENGINE_BLOCKS = 4096
"""The stand-in vLLM's KV cache in blocks of 16 tokens (its default). It reserves a
request's prompt and `max_tokens` blocks when it admits it, first come first served, so
the `hold` attacker's streams (4 096 tokens each, the stand-in's cap: 257 blocks) fill
it with 16, and every request behind them waits until one is cut: `--engine-blocks`
shows the front's and the step's share of the tail apart from the engine's."""
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
port, begin, seconds = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
time.sleep(max(begin - time.monotonic(), 0))
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


async def health_probe(port: int, begin: float, seconds: float, tally: Tally) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HEALTH_PROBE, str(port), str(begin), str(seconds),
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


def attacker_key(rotating: bool) -> str:
    """One key for every attack, or (`rotating`) a new one each time: a client that invents
    isolation keys, which no per-key share can tell apart from many tenants."""
    return f"attacker-{os.urandom(6).hex()}" if rotating else "attacker"


async def front_bomber(
    http: aiohttp.ClientSession, url: str, bodies: list[bytes], deadline: float, rotating: bool
) -> None:
    async def send() -> None:
        for raw in bodies:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with http.post(
                    url + "/v1/completions",
                    data=raw,
                    headers={"Content-Type": "application/json", KEY: attacker_key(rotating)},
                ) as answer:
                    await answer.read()

    await until(deadline, send)


LONG_STREAM_BODY = json.dumps(
    {"model": "standin", "stream": True, "max_tokens": 50_000,
     "messages": [{"role": "user", "content": "go"}]}
).encode()  # fmt: skip
"""A streamed answer long enough to outlast any phase: what the slow readers ask for."""


def _chat_head(headers: str, length: int) -> bytes:
    """A chat request's head announcing a body of `length` bytes; `headers` are extra
    `Name: value\\r\\n` lines. What follows it (all of the body, part, none) is the attack."""
    return (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
        f"application/json\r\n{headers}Content-Length: {length}\r\n\r\n"
    ).encode()


async def stalled_reader(port: int, deadline: float) -> None:
    """Asks for a long streamed answer, reads its first bytes, then never reads again."""
    body = LONG_STREAM_BODY
    loop = asyncio.get_running_loop()
    while time.monotonic() < deadline:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, ("127.0.0.1", port))
            await loop.sock_sendall(sock, _chat_head(f"{KEY}: attacker\r\n", len(body)) + body)
            await asyncio.wait_for(loop.sock_recv(sock, 512), 10)
            await _until_closed(sock, deadline)  # hold it until the front cuts it
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
            head = _chat_head(f"{KEY}: attacker\r\n", 1 << 20)
            await loop.sock_sendall(sock, head + b'{"messages":[' + b" " * 65536)
            with contextlib.suppress(TimeoutError, OSError):
                await asyncio.wait_for(loop.sock_recv(sock, 512), deadline - time.monotonic())
        except OSError:
            pass
        finally:
            sock.close()


async def step_bomber(target: str, raw: bytes, deadline: float, rotating: bool) -> None:
    gateway = Gateway(target)

    async def send() -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, TimeoutError):
            await gateway.exchange(headers_msg({KEY: attacker_key(rotating)}), body_msg(raw))

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


@dataclass(frozen=True)
class Holder:
    """The `hold` attacker's identity: one isolation key, or (`signer` set) a new key per
    connection under one account, vouched for as the step vouches for it."""

    signer: Attester | None = None

    def front_headers(self, body: bytes) -> str:
        """Header lines (CRLF-terminated) for one front connection sending `body`."""
        if self.signer is None:
            return f"{KEY}: {MALLORY}\r\n"
        key = attacker_key(rotating=True)
        account = Account(b"m" * 32)
        attestation = self.signer.sign(account, CIMultiDict({KEY: key}), json.loads(body))
        return f"{KEY}: {key}\r\n{IDENTITY_ATTESTATION_HEADER}: {attestation}\r\n"

    def step_headers(self) -> dict[str, str]:
        if self.signer is None:
            return {KEY: MALLORY}
        return {KEY: attacker_key(rotating=True), ACCOUNT_HEADER: MALLORY}


async def holding_reader(port: int, deadline: float, holder: Holder) -> None:
    """Asks for a long streamed answer, reads its first bytes, never reads again; when the
    front cuts it (or refuses it), asks again at once."""
    body = LONG_STREAM_BODY
    loop = asyncio.get_running_loop()
    while time.monotonic() < deadline:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, ("127.0.0.1", port))
            await loop.sock_sendall(sock, _chat_head(holder.front_headers(body), len(body)) + body)
            first = await asyncio.wait_for(loop.sock_recv(sock, 512), 10)
            if first.startswith(b"HTTP/1.1 200"):
                await _until_closed(sock, deadline)
            else:
                await asyncio.sleep(1.0)  # refused: its Retry-After
        except (OSError, TimeoutError):
            pass
        finally:
            sock.close()


async def _until_closed(sock: socket.socket, deadline: float) -> None:
    """Hold `sock` without reading until the peer closes it or the phase ends."""
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        try:
            sock.send(b"")
        except OSError:
            return


async def holding_writer(port: int, deadline: float, holder: Holder) -> None:
    """Announces a small chat body, sends its first byte, and nothing more until the front
    answers (408 at its body deadline, or a refusal); then again."""
    body = json.dumps(chat("mallory", 0)).encode()
    loop = asyncio.get_running_loop()
    while time.monotonic() < deadline:
        sock = socket.socket()
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, ("127.0.0.1", port))
            head = _chat_head(holder.front_headers(body), len(body))
            await loop.sock_sendall(sock, head + body[:1])
            first = await asyncio.wait_for(loop.sock_recv(sock, 512), deadline - time.monotonic())
            if not first.startswith(b"HTTP/1.1 408"):
                await asyncio.sleep(1.0)  # refused: its Retry-After
        except (OSError, TimeoutError):
            pass
        finally:
            sock.close()


async def half_head(port: int, deadline: float) -> None:
    """Sends a request line and one header, never ends the head; again when closed."""
    loop = asyncio.get_running_loop()
    while time.monotonic() < deadline:
        sock = socket.socket()
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, ("127.0.0.1", port))
            await loop.sock_sendall(
                sock, f"POST /v1/chat/completions HTTP/1.1\r\n{KEY}: m".encode()
            )
            with contextlib.suppress(TimeoutError, OSError):
                await asyncio.wait_for(loop.sock_recv(sock, 512), deadline - time.monotonic())
        except OSError:
            pass
        finally:
            sock.close()


STEP_ANNOUNCED_MORE = 1024
"""What each `hold` stream's Content-Length announces beyond the piece it sends (as an
HTTP/1.1 client's body reaches the gateway: announced, then never finished)."""


async def step_holder(target: str, deadline: float, holder: Holder, piece: int) -> None:
    """A stream that announces a body a little longer than `piece`, sends its headers and
    `piece` bytes of it (0: none), then nothing until the step answers it (408 at the body
    deadline, or a refusal); then again."""
    gateway = Gateway(target)
    try:
        while time.monotonic() < deadline:
            call = gateway.open()
            with contextlib.suppress(grpc.aio.AioRpcError, TimeoutError):
                announced = {"content-length": str(piece + STEP_ANNOUNCED_MORE)}
                await call.write(headers_msg({**holder.step_headers(), **announced}))
                if piece:
                    await call.write(body_msg(b'{"messages":[' + b" " * piece, end_of_stream=False))
                answer = await asyncio.wait_for(call.read(), max(deadline - time.monotonic(), 0.1))
                if answer is not grpc.aio.EOF and answer.immediate_response.status.code != 408:
                    await asyncio.sleep(1.0)  # refused: its Retry-After
            call.cancel()
    finally:
        await gateway.close()


# --------------------------------------------------------------------------- the run


ATTACK_KINDS = frozenset({"bombs", "readers", "writers", "hold"})
"""`bombs`: dense and deflated bodies (both processes); `readers`: clients that stop reading
streams (front); `writers`: clients and streams stalled mid-body (both); `hold`: one tenant
holding all it can, sized to the front's slots and body reads and the step's budget
(issue 43)."""
MODIFIERS = frozenset({"keys", "account"})
"""`keys`: the bombs come under a new isolation key each (what a per-key share cannot see);
`account`: the `hold` tenant uses a new isolation key per connection, all under one account
(what a share by account does see)."""
DEFAULT_ATTACKS = "bombs,readers,writers"
"""What a run attacks with unless told (`hold` is its own measurement: --attacks hold)."""


@dataclass
class Attacks:
    """The attack bodies, built once before the phases (building them costs the bench)."""

    front: list[bytes]
    step: list[bytes]
    kinds: frozenset[str] = ATTACK_KINDS
    holder: Holder = field(default_factory=Holder)

    @classmethod
    def build(cls, kinds: frozenset[str] = ATTACK_KINDS) -> Attacks:
        embeds = json.dumps({"model": "m", "prompt": "x", "prompt_embeds": deflated_bomb()})
        return cls(
            front=[dense_objects(2 << 20), dense_ints(4 << 20), embeds.encode()],
            step=[dense_objects(1 << 20), dense_ints(4 << 20)],
            kinds=kinds,
        )


@dataclass(frozen=True)
class Run:
    """One set of processes, a quiet phase and a hostile one; `pins` and `attacked` say
    which cores each process gets and which processes the attackers aim at."""

    name: str
    attacked: frozenset[str]
    pins: dict[str, frozenset[int] | None] = field(default_factory=dict)

    def cpus(self, role: str) -> frozenset[int] | None:
        return self.pins.get(role, self.pins.get("rest"))


def runs(layouts: str) -> list[Run]:
    """`shared`: every process floats over all cores, both processes attacked at once.
    `sidecar`: the attacked process alone on a core of its own (as a pod's container with
    its own CPU request), everything else (attackers, tenants, the stand-in vLLM, the
    picker, the other process) on the other core; one run per process. `pod`: the
    model-server pod on a core of its own (the front and the stand-in vLLM behind it), the
    attackers, tenants and the rest on the other: what tenants of a pod with its own CPU
    get (under `sidecar` the engine shares the attackers' core)."""
    cpus = sorted(os.sched_getaffinity(0))
    chosen = []
    for name in layouts.split(","):
        if name == "shared":
            chosen.append(Run("shared", frozenset({"front", "step"})))
        elif name == "sidecar":
            if len(cpus) < 2:
                raise SystemExit("the sidecar layout needs two cores")
            rest, own = frozenset(cpus[:1]), frozenset(cpus[1:2])
            for target in ("front", "step"):
                chosen.append(
                    Run(f"sidecar, {target} on its own core", frozenset({target}),
                        {target: own, "rest": rest})
                )  # fmt: skip
        elif name == "pod":
            if len(cpus) < 2:
                raise SystemExit("the pod layout needs two cores")
            rest, own = frozenset(cpus[:1]), frozenset(cpus[1:2])
            chosen.append(
                Run("pod, front and engine on their own core", frozenset({"front"}),
                    {"front": own, "standin": own, "rest": rest})
            )  # fmt: skip
        else:
            raise SystemExit(f"--layout: unknown {name!r} (shared, sidecar, pod)")
    return chosen


def cpu_seconds(pid: int, *, children: bool = True) -> float:
    """CPU time (user + system) of `pid` and (unless not `children`) its live children."""
    total = 0.0
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split() if children else ():
                total += cpu_seconds(int(child))
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


TENANTS = """
import asyncio, json, sys, time
from bench.hostile_load import tenants_main
print(json.dumps(asyncio.run(tenants_main(*sys.argv[1:4], float(sys.argv[4]), float(sys.argv[5])))))
"""
"""The tenants in a process of their own: the attackers' work in the bench's event loop
must not count as the front's latency (nor the tenants' work as the attackers')."""


async def tenants_main(
    front_url: str, step_target: str, standin_url: str, begin: float, seconds: float
) -> dict[str, Any]:
    """Four tenants through the front, four through the step, and two straight to the
    stand-in vLLM (the control: how much of the front tenants' latency is the engine's)."""
    await asyncio.sleep(max(begin - time.monotonic(), 0))
    deadline = time.monotonic() + seconds
    tallies = {"front": Tally(), "step": Tally(), "engine": Tally()}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=60), connector=connector
    ) as http:
        jobs = [
            front_tenant(http, front_url, f"t{i}", deadline, tallies["front"]) for i in range(4)
        ]
        jobs += [step_tenant(step_target, f"t{i}", deadline, tallies["step"]) for i in range(4)]
        jobs += [
            front_tenant(http, standin_url, f"e{i}", deadline, tallies["engine"]) for i in range(2)
        ]
        await asyncio.gather(*jobs)
    return {
        k: {"latencies": t.latencies, "ok": t.ok, "failed": t.failed} for k, t in tallies.items()
    }


async def subprocess_json(*args: str) -> Any:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    return json.loads(out)


@dataclass
class Phase:
    health: Tally = field(default_factory=Tally)
    front: Tally = field(default_factory=Tally)
    step: Tally = field(default_factory=Tally)
    engine: Tally = field(default_factory=Tally)
    cpu: dict[str, float] = field(default_factory=dict)
    """Cores each process used over the phase (CPU seconds / phase seconds)."""


async def phase(
    pods: Pods, run: Run, seconds: float, attacks: Attacks | None, secret: bytes, nice: int
) -> Phase:
    result = Phase()
    begin = time.monotonic() + 2.0  # the tenants' process imports aiohttp and grpc first
    tenants = subprocess_json(
        "-c", TENANTS, pods.front_url, pods.step_target, pods.standin_url, str(begin),
        str(seconds),
    )  # fmt: skip
    jobs: list[Awaitable[Any]] = [health_probe(pods.front_port, begin, seconds, result.health)]
    attackers: Awaitable[Any] | None = None
    if attacks is not None:
        spec = {
            "front_port": pods.front_port, "step_port": pods.step_port,
            "attacked": sorted(run.attacked), "kinds": sorted(attacks.kinds),
            "secret": secret.hex() if "account" in attacks.kinds else "",
            "begin": begin, "seconds": seconds, "nice": nice,
        }  # fmt: skip
        attackers = subprocess_json("-c", ATTACKERS, json.dumps(spec))
        jobs.append(attackers)
    cpu_before: dict[str, float] = {}

    async def sample_cpu() -> None:
        await asyncio.sleep(max(begin - time.monotonic(), 0))
        cpu_before.update({k: cpu_seconds(pid, children=k != ME) for k, pid in pods.pids().items()})
        await asyncio.sleep(seconds)
        result.cpu = {
            k: (cpu_seconds(pid, children=k != ME) - cpu_before[k]) / seconds
            for k, pid in pods.pids().items()
        }

    jobs.append(sample_cpu())
    out, *others = await asyncio.gather(tenants, *jobs)
    if attackers is not None:
        result.cpu[ATTACKERS_CPU] = others[1]["cpu_seconds"] / seconds
    for name in ("front", "step", "engine"):
        tally = getattr(result, name)
        tally.latencies, tally.ok, tally.failed = (
            out[name][k] for k in ("latencies", "ok", "failed")
        )
    return result


STEP_PIECE = 4 << 20
"""What each of the `hold` tenant's step streams sends of its body before it stalls."""


def hold_jobs(pods: Targets, run: Run, holder: Holder, deadline: float) -> list[Awaitable[None]]:
    """The `hold` tenant's connections, sized to take every slot, body read and budget
    byte: what a single client could hold before shares."""
    jobs: list[Awaitable[None]] = []
    if "front" in run.attacked:
        port = pods.front_port
        jobs += [holding_reader(port, deadline, holder) for _ in range(FRONT_SLOTS)]
        jobs += [holding_writer(port, deadline, holder) for _ in range(FRONT_BODY_READS)]
        jobs += [half_head(port, deadline) for _ in range(FRONT_SLOTS)]
    if "step" in run.attacked:
        target, streams = pods.step_target, 2 * STEP_BUDGET // STEP_PIECE
        jobs += [step_holder(target, deadline, holder, STEP_PIECE) for _ in range(streams)]
        # small stalled bodies fill what the large ones leave, half-sent requests hold streams
        jobs += [step_holder(target, deadline, holder, 64 << 10) for _ in range(FRONT_SLOTS)]
        jobs += [step_holder(target, deadline, holder, 0) for _ in range(FRONT_SLOTS)]
    return jobs


@dataclass(frozen=True)
class Targets:
    """Where the attackers aim (the attackers' process knows no more of the run)."""

    front_port: int
    step_port: int

    @property
    def front_url(self) -> str:
        return f"http://127.0.0.1:{self.front_port}"

    @property
    def step_target(self) -> str:
        return f"127.0.0.1:{self.step_port}"


ATTACKERS = """
import asyncio, json, sys
from bench.hostile_load import attackers_main
print(json.dumps(asyncio.run(attackers_main(json.loads(sys.argv[1])))))
"""
"""The attackers in a process of their own, at `ATTACKER_NICENESS`: on this machine they
share the cores of the processes under test, where a real attacker's client runs on its
own machine. Their CPU comes second to the processes under test and the tenants', so
the ratio measures what the attack costs the front and the step, not what the bench's
own load generation costs the cores (printed apart: `attackers (niced)`)."""
ATTACKER_NICENESS = 19


async def attackers_main(spec: dict[str, Any]) -> dict[str, float]:
    """One hostile phase's attackers (`ATTACKERS`); returns the CPU seconds they used."""
    os.nice(spec["nice"])
    kinds = frozenset(spec["kinds"])
    attacks = Attacks.build(kinds)
    if spec["secret"]:
        attacks = dataclasses.replace(
            attacks, holder=Holder(Attester(bytes.fromhex(spec["secret"]), KEY))
        )
    run = Run("attackers", frozenset(spec["attacked"]))
    targets = Targets(spec["front_port"], spec["step_port"])
    await attack(targets, run, attacks, spec["begin"], spec["seconds"])
    used = os.times()
    return {"cpu_seconds": used.user + used.system}


async def attack(pods: Targets, run: Run, attacks: Attacks, begin: float, seconds: float) -> None:
    await asyncio.sleep(max(begin - time.monotonic(), 0))
    deadline = time.monotonic() + seconds
    jobs: list[Awaitable[None]] = []
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as http:
        if "front" in run.attacked:
            url, port = pods.front_url, pods.front_port
            if "bombs" in attacks.kinds:
                jobs += [
                    front_bomber(http, url, attacks.front, deadline, "keys" in attacks.kinds)
                    for _ in range(2)
                ]
            if "readers" in attacks.kinds:
                jobs += [stalled_reader(port, deadline) for _ in range(8)]
            if "writers" in attacks.kinds:
                jobs += [stalled_writer(port, deadline) for _ in range(8)]
        if "step" in run.attacked:
            target = pods.step_target
            if "bombs" in attacks.kinds:
                rotating = "keys" in attacks.kinds
                jobs += [step_bomber(target, attacks.step[0], deadline, rotating) for _ in range(2)]
                jobs += [step_bomber(target, attacks.step[1], deadline, rotating)]
            if "writers" in attacks.kinds:
                jobs += [step_staller(target, deadline) for _ in range(8)]
        if "hold" in attacks.kinds:
            jobs += hold_jobs(pods, run, attacks.holder, deadline)
        await asyncio.gather(*jobs)


def report(name: str, quiet: Tally, loud: Tally, *, goal: bool = True) -> tuple[bool, str]:
    ratio = p99(loud.latencies) / p99(quiet.latencies)
    good = loud.rate() >= 0.99 and ratio <= 2.0
    verdict = ("ok" if good else "MISSED") if goal else "(control, no goal)"
    return good, (
        f"  {name:<22} served {quiet.rate():7.2%} -> {loud.rate():7.2%}   "
        f"p99 {p99(quiet.latencies) * 1e3:7.1f} -> {p99(loud.latencies) * 1e3:7.1f} ms "
        f"({ratio:4.2f}x)  [{loud.ok + loud.failed} requests]  {verdict}"
    )


PICKER = """
import asyncio, sys
from harness.extproc_gateway import start_upstream
async def main():
    picker = await start_upstream(int(sys.argv[1]))
    while True:  # a stand-in picker that forgets what it saw (attack bodies add up)
        await asyncio.sleep(1)
        picker.fake.streams.clear()
asyncio.run(main())
"""


ME = "bench"
"""This process: it starts the others and samples them (its children not counted)."""
ATTACKERS_CPU = "attackers (niced)"


@dataclass
class Pods:
    """The processes of one run: the stand-in vLLM, the front, the stand-in picker, the step."""

    standin: asyncio.subprocess.Process
    front: asyncio.subprocess.Process
    picker: asyncio.subprocess.Process
    step: asyncio.subprocess.Process
    standin_port: int
    front_port: int
    step_port: int

    @property
    def front_url(self) -> str:
        return f"http://127.0.0.1:{self.front_port}"

    @property
    def standin_url(self) -> str:
        return f"http://127.0.0.1:{self.standin_port}"

    @property
    def step_target(self) -> str:
        return f"127.0.0.1:{self.step_port}"

    def pids(self) -> dict[str, int]:
        return {
            "front": self.front.pid, "step": self.step.pid, "stand-in vLLM": self.standin.pid,
            "stand-in picker": self.picker.pid, ME: os.getpid(),
        }  # fmt: skip

    async def stop(self) -> None:
        for proc in (self.front, self.step, self.standin, self.picker):
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            await proc.wait()


async def start_pods(
    run: Run,
    salt: Path,
    fair_share: int,
    account: bool = False,
    tenant_share: int = 50,
    engine_blocks: int = ENGINE_BLOCKS,
    token_ms: float = 0.0,
) -> Pods:
    standin_port, front_port, step_port, picker_port = (free_port() for _ in range(4))
    identity = ["--identity-header", ACCOUNT_HEADER] if account else []
    identity += ["--tenant-share-percent", str(tenant_share)]
    rest = run.cpus("rest")
    standin = await start(
        "-m", "harness.standin", str(standin_port), "--usage-from-engine",
        "--num-gpu-blocks", str(engine_blocks), "--decode-s-per-token", str(token_ms / 1000),
        cpus=run.cpus("standin"),
    )  # fmt: skip
    picker = await start("-c", PICKER, str(picker_port), cpus=rest)
    front = await start(
        "-m", "promptcache.front", "--upstream", f"http://127.0.0.1:{standin_port}",
        "--listen", f"127.0.0.1:{front_port}", "--isolation-mode", "PerKey",
        "--salt-key-file", str(salt), "--max-in-flight", str(FRONT_SLOTS),
        "--max-body-reads", str(FRONT_BODY_READS),
        "--max-in-flight-bytes", str(FRONT_BUDGET), "--write-timeout-seconds", "2",
        "--body-timeout-seconds", "5", "--fair-share-bytes-per-second", str(fair_share),
        *identity,
        cpus=run.cpus("front"),
    )  # fmt: skip
    step = await start(
        "-m", "promptcache.cli", "gateway-policy", "--listen", f"127.0.0.1:{step_port}",
        "--upstream", f"127.0.0.1:{picker_port}", "--isolation-mode", "PerKey",
        "--salt-key-file", str(salt), "--max-body-bytes", str(STEP_MAX_BODY),
        "--max-buffered-bytes", str(STEP_BUDGET), "--body-timeout-seconds", "5",
        "--metrics-listen", "", "--fair-share-bytes-per-second", str(fair_share),
        *identity,
        cpus=run.cpus("step"),
    )  # fmt: skip
    return Pods(standin, front, picker, step, standin_port, front_port, step_port)


async def warm_up(http: aiohttp.ClientSession, pods: Pods) -> None:
    await wait_ok(http, pods.standin_url + "/health", pods.standin)
    await wait_ok(http, pods.front_url + "/readyz", pods.front)
    for _ in range(100):  # the step: one decided exchange
        with contextlib.suppress(grpc.aio.AioRpcError):
            gw = Gateway(pods.step_target)
            await gw.exchange(headers_msg({KEY: "w"}), body_msg(b'{"messages":[]}'))
            await gw.close()
            break
        await asyncio.sleep(0.1)
    # torch loads at the first prompt-embeds payload: in the baseline, not the growth
    with contextlib.suppress(aiohttp.ClientError):
        async with http.post(
            pods.front_url + "/v1/completions",
            json={"model": "m", "prompt": "x", "prompt_embeds": WARM_PAYLOAD},
            headers={KEY: "warm"},
        ) as warm:
            await warm.read()


COUNTED = (
    "promptcache_front_tenant_share_refusals_total",
    "promptcache_front_deadlines_total",
    'promptcache_front_refusals_total{code="front_overloaded"}',
    'promptcache_front_refusals_total{code="body_reads_saturated"}',
    'promptcache_front_refusals_total{code="memory_budget_exhausted"}',
)
"""The front's counters a run prints: who was refused for a share, and which deadlines fired."""


async def front_counters(http: aiohttp.ClientSession, url: str) -> list[str]:
    """The `COUNTED` samples of the front's /metrics, as `name{labels} value`."""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with http.get(url + "/metrics") as answer:
            text = await answer.text()
        return [
            line.removeprefix("promptcache_front_")
            for line in text.splitlines()
            if line.startswith(COUNTED) and not line.startswith("#")
        ]
    return []


def pooled(phases: list[Phase]) -> Phase:
    """The phases of several rounds as one: latencies and counts together, cores averaged."""
    out = Phase()
    for p in phases:
        for name in ("health", "front", "step", "engine"):
            mine, theirs = getattr(out, name), getattr(p, name)
            mine.latencies += theirs.latencies
            mine.ok += theirs.ok
            mine.failed += theirs.failed
        for k, v in p.cpu.items():
            out.cpu[k] = out.cpu.get(k, 0.0) + v / len(phases)
    return out


def ratios(name: str, quiets: list[Phase], louds: list[Phase]) -> list[float]:
    """Each round's hostile p99 over its quiet p99 for `name`'s tenants."""
    return [
        p99(getattr(h, name).latencies) / p99(getattr(q, name).latencies)
        for q, h in zip(quiets, louds, strict=True)
    ]


def round_line(i: int, quiet: Phase, loud: Phase, load: float, run: Run) -> str:
    """One round's p99 ratios and the load average as it ended: how noisy the rounds are."""
    parts = []
    for name in ("front", "step"):
        if name in run.attacked:
            q, h = p99(getattr(quiet, name).latencies), p99(getattr(loud, name).latencies)
            parts.append(f"{name} {q * 1e3:.1f} -> {h * 1e3:.1f} ms ({h / q:.2f}x)")
    return f"  round {i}: " + "; ".join(parts) + f"; load average {load:.1f}"


async def one_run(
    run: Run,
    seconds: float,
    attacks: Attacks,
    fair_share: int,
    tenant_share: int = 50,
    rounds: int = 1,
    nice: int = ATTACKER_NICENESS,
    engine_blocks: int = ENGINE_BLOCKS,
    token_ms: float = 0.0,
) -> bool:
    if run.pins:
        os.sched_setaffinity(0, run.cpus("rest") or os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        salt = Path(tmp) / "salt-key"
        secret = os.urandom(32)
        salt.write_bytes(secret)
        account = "account" in attacks.kinds
        if account:
            attacks = dataclasses.replace(attacks, holder=Holder(Attester(secret, KEY)))
        pods = await start_pods(
            run, salt, fair_share, account, tenant_share, engine_blocks, token_ms
        )
        try:
            timeout = aiohttp.ClientTimeout(total=60)
            async with aiohttp.ClientSession(timeout=timeout) as http:
                await warm_up(http, pods)
            before = {"front": peak_rss(pods.front.pid), "step": peak_rss(pods.step.pid)}
            load = os.getloadavg()[0]
            quiets: list[Phase] = []
            louds: list[Phase] = []
            lines = []
            for i in range(rounds):  # alternated: a busy spell of the machine hits both
                quiets.append(await phase(pods, run, seconds, None, secret, nice))
                louds.append(await phase(pods, run, seconds, attacks, secret, nice))
                lines.append(round_line(i + 1, quiets[-1], louds[-1], os.getloadavg()[0], run))
            quiet, loud = pooled(quiets), pooled(louds)
            after = {"front": peak_rss(pods.front.pid), "step": peak_rss(pods.step.pid)}
            async with aiohttp.ClientSession(timeout=timeout) as http:
                counted = await front_counters(http, pods.front_url)
        finally:
            await pods.stop()
    print(
        f"\n== {run.name}: {rounds} x ({seconds:g} s quiet then {seconds:g} s hostile) "
        f"(attacking {', '.join(sorted(run.attacked))} with {', '.join(sorted(attacks.kinds))}"
        f"; fair share {fair_share} bytes/s; tenant share {tenant_share} %; attackers at "
        f"nice {nice}; engine {engine_blocks} KV blocks, {token_ms:g} ms per token)"
        f"; load average {load:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after"
    )
    if rounds > 1:
        print("\n".join(lines))
        print("  median of the rounds' ratios: " + ", ".join(
            f"{name} {statistics.median(ratios(name, quiets, louds)):.2f}x "
            f"(range {min(ratios(name, quiets, louds)):.2f}-{max(ratios(name, quiets, louds)):.2f})"
            for name in ("front", "step") if name in run.attacked
        ))  # fmt: skip
    good = True
    if "front" in run.attacked:
        health = p99(loud.health.latencies) * 1e3
        good &= health < 100
        print(
            f"  /healthz p99            quiet {p99(quiet.health.latencies) * 1e3:.1f} ms, "
            f"hostile {health:.1f} ms (served {loud.health.rate():.2%}, longest "
            f"{max(loud.health.latencies, default=0) * 1e3:.0f} ms)  "
            f"{'ok' if health < 100 else 'MISSED'} (goal < 100 ms)"
        )
    tallies = {"front": ("front tenants", "front"), "step": ("policy-step tenants", "step")}
    for target, (label, attr) in tallies.items():
        if target in run.attacked:
            ok, line = report(label, getattr(quiet, attr), getattr(loud, attr))
            good &= ok
            print(line)
    if "front" in run.attacked:
        print(report("engine direct (control)", quiet.engine, loud.engine, goal=False)[1])
    for name, budget in (("front", FRONT_BUDGET), ("step", STEP_BUDGET)):
        if name not in run.attacked:
            continue
        peak, growth = after[name], after[name] - before[name]
        fits = growth <= budget + RSS_MARGIN
        good &= fits
        print(
            f"  peak RSS {name:<6} {before[name] >> 20} MiB warm, {peak >> 20} MiB after "
            f"(+{growth >> 20} MiB); budget {budget >> 20} MiB + margin "
            f"{RSS_MARGIN >> 20} MiB  {'ok' if fits else 'MISSED'}"
        )
    if "front" in run.attacked and counted:
        print("  front counted: " + ", ".join(counted))
    print("  cores used, quiet -> hostile: " + ", ".join(
        f"{name} {quiet.cpu.get(name, 0):.2f} -> {loud.cpu.get(name, 0):.2f}" for name in loud.cpu
    ))  # fmt: skip
    return good


async def main(args: argparse.Namespace) -> None:
    kinds = frozenset(args.attacks.split(","))
    if not kinds <= ATTACK_KINDS | MODIFIERS:
        known = sorted(ATTACK_KINDS | MODIFIERS)
        raise SystemExit(f"--attacks: unknown {sorted(kinds - ATTACK_KINDS - MODIFIERS)} ({known})")
    attacks = Attacks.build(kinds)
    for run in runs(args.layout):
        await one_run(
            run, args.seconds, attacks, args.fair_share, args.tenant_share, args.rounds,
            args.attacker_nice, args.engine_blocks, args.engine_token_ms,
        )  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.hostile_load", description=__doc__)
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    ap.add_argument(
        "--layout",
        default="shared,sidecar,pod",
        help="CPU layouts, comma-separated: shared, sidecar, pod",
    )
    ap.add_argument(
        "--attacks",
        default=DEFAULT_ATTACKS,
        help="which attacks, comma-separated: bombs, readers, writers, hold (one at a time "
        "shows what each costs); add keys to send the bombs under a new isolation key each, "
        "account to spread the hold tenant over keys of one account",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="quiet and hostile phases alternated this many times (pooled, and each round "
        "printed with the load average: how noisy the machine made the ratio)",
    )
    ap.add_argument(
        "--attacker-nice",
        type=int,
        default=ATTACKER_NICENESS,
        help="niceness of the attackers' process (0: they compete for the cores as "
        "equals, as before; a real attacker's client is not on the server's cores)",
    )
    ap.add_argument(
        "--engine-blocks",
        type=int,
        default=ENGINE_BLOCKS,
        help="the stand-in vLLM's KV cache in blocks (the attacker's held streams reserve "
        "257 each): large shows what the front and the step cost apart from the engine",
    )
    ap.add_argument(
        "--engine-token-ms",
        type=float,
        default=0.0,
        help="the stand-in vLLM's milliseconds per generated token (0: as fast as it can "
        "write; then one of the attacker's streams writes its 4 096 events without yielding "
        "its loop, and a burst of them stalls every request to it for seconds, which a "
        "real engine producing tokens at a rate does not do)",
    )
    ap.add_argument(
        "--fair-share",
        type=int,
        default=DEFAULT_FAIR_SHARE_BYTES_PER_SECOND,
        help="each key's share (spec.front.fairShareBytesPerSecond) for the front and the "
        "step; 0 shows what they do unmetered",
    )
    ap.add_argument(
        "--tenant-share",
        type=int,
        default=50,
        help="each client identity's share of the slots, body reads and budgets "
        "(spec.front.tenantSharePercent) for the front and the step; 100 shows them off",
    )
    return ap


if __name__ == "__main__":
    asyncio.run(main(_parser().parse_args()))

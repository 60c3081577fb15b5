"""What the gateway hop costs: promptcache's own picker (the product, no hop) and the gateway
policy step (the `llm-d-router` path), each against the upstream GIE v1.5.0 picker alone,
in one run (issue 26, "The gateway hop"; issue 42, "Measure").

The pods run as rendered (`promptcache render` of examples/minimal.yaml at 4 replicas,
isolation PerKey) on the local control plane, with stand-in model servers on the kwok pod
IPs that the pickers scrape every 50 ms. One binary serves every arm: promptcache's picker
build (`picker/`), which with a config naming none of its plugins and none of its flags is
the upstream picker exactly. The arms, cell by cell:

* **gie** (the baseline): the resource rendered for `gateway.picker: gie-v1.5`, its picker
  alone on its own ext_proc port, with bodies that already carry a `cache_salt` of the
  step's shape (so it does the routing work of the other arms);
* **promptcache** (the product): the same resource rendered for `gateway.picker:
  promptcache`, its picker with its rendered config (the tenant-salt parser and the
  predicted-match plugin), args (the body bounds) and environment (`GOMEMLIMIT`, `GOGC`),
  sent the tenant's key in the isolation header and no salt; served in plain gRPC as the
  baseline is (the load generator speaks plain gRPC). Nothing else differs from the
  baseline (same binary, pool, scheduling profile, log verbosity);
* **step**: the rendered `gateway-policy` container in front of the gie picker, sent the
  key and no salt: what every request of an `llm-d-router` pool crosses;
* **step-Nw** (`--workers N`), **promptcache-unbounded** (`--bounds-off`: the product with
  its body bounds off, to tell their cost from the parser's) and **picker+salt**
  (`--salting-picker`, the prototype that preceded the product) on request.

An exchange is one HTTP request's whole ext_proc stream as a gateway sends it in
FULL_DUPLEX_STREAMED mode, the only mode the pickers support and the one every
InferencePool gateway configures (the renderer emits the InferencePool; the gateway picks
the mode, see docs/endpoint-picker.md): request headers; the body, in one message
("buffered": what a gateway forwards when the whole body arrived before it called the
picker, and what BUFFERED mode sends) or in 16 KiB messages ("streamed": one HTTP/2 DATA
frame each, the default frame size); the picker's verdict; then the response headers and
the answer, one JSON message (buffered) or 16 server-sent events (streamed, one per
token). The load generator is `bench/gateway_hop_load` (Go, grpc-go and go-control-plane
at the picker's own versions), because a Python gRPC client spends about as much CPU per
message as the step it measures and would be the bottleneck on two cores; its CPU is
reported per cell so a reader can check it never is.

Per cell (body 1 KiB / 32 KiB / 1 MiB x mode x concurrency 1 / 64, and 1 MiB at 256 for
memory, x arm): exchanges per second; per core (exchanges per CPU second of the arm's
processes: the picker, plus the step and its worker processes in a step arm); the pick
latency p50/p99 (request headers sent to the picker's verdict received, what a client's
first byte waits for) and the added latency of each arm; CPU per exchange; peak RSS of the
step and of each picker; plots in docs/img/ (`gateway-hop-throughput.png`,
`gateway-hop-latency.png`). Goals: promptcache's picker >= 0.95x the GIE picker per core at
64 for every size and mode, added p50 <= 0.1 ms at 1, RSS under its rendered limit at
1 MiB x 256; the step >= 0.8x, <= 1 ms (1 KiB), RSS under its limit.

    python -m bench.gateway_hop            # every cell (~12 min on a quiet machine)
    python -m bench.gateway_hop --quick    # 1 KiB and 32 KiB, concurrency 1 and 64, 3 s
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import statistics
import string
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOADGEN_DIR = ROOT / "bench" / "gateway_hop_load"
KEY_HEADER = "x-prompt-cache-isolation-key"
SIZES = {"1KiB": 1024, "32KiB": 32 * 1024, "1MiB": 1024 * 1024}
MODES = ("buffered", "streamed")
CONCURRENCY = (1, 64)
"""Every cell's; the 1 MiB cells also run at `--memory-concurrency` (256)."""
FRAME_BYTES = 16 * 1024
"""HTTP/2's default SETTINGS_MAX_FRAME_SIZE: what one DATA frame, so one streamed body
message, carries."""
STREAMED_ANSWER_PARTS = 16
"""Server-sent events per streamed answer (one per token of a short answer)."""
CONNECTIONS = 8
"""HTTP/2 connections the load generator spreads its streams over, as a gateway with 8
worker threads would (SO_REUSEPORT spreads connections, not streams, over step workers)."""
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


# --- the load generator --------------------------------------------------------------------


def loadgen_binary() -> Path:
    """The Go load generator, built once per source digest (like tests/gateway's decoder)."""
    return _go_tool(LOADGEN_DIR, "gateway_hop_load")


def _go_tool(source: Path, name: str, flags: Sequence[str] = ()) -> Path:
    from harness.localcluster.build import go_bin, go_env  # noqa: PLC0415 - only when built

    digest = hashlib.sha256()
    for file in ("go.mod", "go.sum", "main.go"):
        digest.update((source / file).read_bytes())
    cache = Path(os.environ.get("PROMPTCACHE_CACHE_DIR", Path.home() / ".cache" / "promptcache"))
    binary = cache / "go-tools" / f"{name}-{digest.hexdigest()[:16]}"
    if not binary.exists():
        binary.parent.mkdir(parents=True, exist_ok=True)
        partial = binary.with_suffix(".partial")
        print(f"building {source.relative_to(ROOT)} ...", flush=True)
        env = {**go_env(), "CGO_ENABLED": "0"}
        subprocess.run(
            [go_bin(), "build", *flags, "-o", str(partial), "."],
            check=True,
            env=env,
            cwd=source,
            timeout=3600,
        )
        partial.rename(binary)
    return binary


# --- workload ------------------------------------------------------------------------------


def _text(rng: random.Random, n: int) -> str:
    alphabet = string.ascii_letters + string.digits + "      "
    return "".join(rng.choices(alphabet, k=n))


def bodies(size: int, stream: bool, salted: bool, count: int, seed: int = 26) -> list[bytes]:
    """`count` chat bodies of about `size` bytes: a system prompt shared by all, a unique
    user turn. `salted`: with a `cache_salt` of the step's shape at the end, as the step
    forwards it (the picker alone gets those, so it hashes the same bytes)."""
    rng = random.Random(seed)
    system = _text(rng, size // 4)
    out = []
    for i in range(count):
        body: dict[str, Any] = {
            "model": "bench-model",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": ""}],
            "max_tokens": 16,
            "stream": stream,
        }
        if salted:
            body["cache_salt"] = "pck1-" + _text(rng, 43).replace(" ", "A")
        fixed = len(json.dumps(body, separators=(",", ":")))
        body["messages"][1]["content"] = f"{i} " + _text(rng, max(size - fixed - 8, 1))
        out.append(json.dumps(body, separators=(",", ":")).encode())
    return out


# --- what the processes spend --------------------------------------------------------------


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                out += [int(c) for c in (task / "children").read_text().split()]
    return out


def tree(pid: int) -> list[int]:
    """`pid` and its descendants (the step's decide workers)."""
    out = [pid]
    for child in _children(pid):
        out += tree(child)
    return out


def cpu_ticks(pid: int) -> int:
    """utime + stime of one live process, in clock ticks."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def rss(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except OSError:
        return 0


class Meter:
    """CPU seconds of process trees over a cell, and their peak summed RSS (sampled every
    50 ms, so a short peak between samples may be missed; VmHWM is reported too)."""

    def __init__(self, roots: dict[str, int]) -> None:
        self.roots = roots
        self.start: dict[str, dict[int, int]] = {}
        self.peak: dict[str, int] = dict.fromkeys(roots, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self.t0 = 0.0
        self.own0 = 0.0

    def _ticks(self) -> dict[str, dict[int, int]]:
        return {name: {p: cpu_ticks(p) for p in tree(pid)} for name, pid in self.roots.items()}

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            for name, pid in self.roots.items():
                self.peak[name] = max(self.peak[name], sum(rss(p) for p in tree(pid)))

    def __enter__(self) -> Meter:
        self.start = self._ticks()
        self.t0 = time.monotonic()
        self.own0 = time.process_time()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def cpu_seconds(self) -> dict[str, float]:
        """Per tree: CPU since `__enter__` (a process born since counts from zero)."""
        now = self._ticks()
        out = {}
        for name, pids in now.items():
            before = self.start.get(name, {})
            out[name] = sum(t - before.get(p, 0) for p, t in pids.items()) / TICK
        out["harness"] = time.process_time() - self.own0
        return out


# --- cells ---------------------------------------------------------------------------------

PICKER = "gie"
"""The baseline: the upstream GIE v1.5.0 picker alone (promptcache's binary with the
rendered `gie-v1.5` config, which names none of its plugins, and none of its flags: the
upstream picker exactly), on its own port, with bodies that already carry a salt."""
PRODUCT = "promptcache"
"""The product: promptcache's picker as rendered for `gateway.picker: promptcache` (its
tenant-salt parser derives the salt; its body bounds on), sent the key, no salt."""


@dataclass(frozen=True)
class Cell:
    size: str
    mode: str
    concurrency: int
    arm: str
    """`PICKER`, or the name of a step arm (`step`: as rendered; `step-2w`: two workers)."""


@dataclass
class Result:
    cell: Cell
    seconds: float
    exchanges: int
    refused: dict[str, int]
    errors: int
    first_error: str
    pick_ms: dict[str, float]
    exchange_ms: dict[str, float]
    cpu: dict[str, float]
    """CPU seconds in the measured window: picker, step (with its workers), loadgen, harness."""
    step_peak_rss: int
    picker_peak_rss: int = 0
    """The arm's picker process (for the step arm: the GIE picker behind it)."""
    loads: tuple[float, float] = (0.0, 0.0)

    @property
    def rate(self) -> float:
        return self.exchanges / self.seconds if self.seconds else 0.0

    @property
    def pod_cpu(self) -> float:
        return self.cpu["picker"] + self.cpu["step"]

    @property
    def per_core(self) -> float:
        return self.exchanges / self.pod_cpu if self.pod_cpu else 0.0

    def ms_per_exchange(self, who: str) -> float:
        return 1000 * self.cpu[who] / self.exchanges if self.exchanges else float("nan")


@dataclass
class Arm:
    target: str
    picker_pid: int
    step_pid: int | None = None
    """The step's process (tree): its CPU and memory count as the step's."""
    salts: bool = True
    """Whether this arm derives the salt (the client sends the key, no salt)."""


@dataclass
class Setup:
    arms: dict[str, Arm]
    step_memory_limit: str
    loadgen: Path
    workdir: Path
    picker_memory_limit: str = ""
    body_files: dict[tuple[str, str, bool], Path] = field(default_factory=dict)

    def body_file(self, size: str, mode: str, salted: bool) -> Path:
        key = (size, mode, salted)
        if key not in self.body_files:
            count = 8 if SIZES[size] >= 1024 * 1024 else 64
            path = self.workdir / f"bodies-{size}-{mode}-{'salted' if salted else 'plain'}.txt"
            path.write_bytes(b"\n".join(bodies(SIZES[size], mode == "streamed", salted, count)))
            self.body_files[key] = path
        return self.body_files[key]


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def timing(cell: Cell, seconds: float, warmup: float) -> tuple[float, float]:
    """(measured, warm-up) seconds for a cell: large bodies at high concurrency take seconds
    per exchange, so the warm-up must outlast one exchange and the window hold many."""
    mib = SIZES[cell.size] / 1024**2
    return max(seconds, 12.0 * mib), warmup + 0.04 * mib * cell.concurrency


def run_cell(setup: Setup, cell: Cell, seconds: float, warmup: float) -> Result:
    arm = setup.arms[cell.arm]
    seconds, warmup = timing(cell, seconds, warmup)
    step = arm.salts
    args = [
        str(setup.loadgen),
        f"-target={arm.target}",
        f"-concurrency={cell.concurrency}",
        f"-conns={min(CONNECTIONS, cell.concurrency)}",
        f"-warmup={warmup}s",
        f"-duration={seconds}s",
        f"-bodies={setup.body_file(cell.size, cell.mode, salted=not step)}",
        f"-chunk={FRAME_BYTES if cell.mode == 'streamed' else 0}",
        f"-answer-parts={STREAMED_ANSWER_PARTS if cell.mode == 'streamed' else 1}",
        f"-key-header={KEY_HEADER if step else ''}",
    ]
    errors = setup.workdir / "loadgen.err"
    with errors.open("w") as err:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, text=True)
    assert proc.stdout is not None

    def failed() -> RuntimeError:
        proc.wait(timeout=120)
        return RuntimeError(f"load generator failed ({proc.returncode}): {errors.read_text()}")

    # The generator prints "measuring" and "measured" around its measured window: the
    # pod's CPU is read over exactly that window.
    if proc.stdout.readline().strip() != "measuring":
        raise failed()
    before = loadavg()
    roots = {"picker": arm.picker_pid, "step": arm.step_pid or -1}
    with Meter(roots) as meter:
        if proc.stdout.readline().strip() != "measured":
            raise failed()
        cpu = meter.cpu_seconds()
    out = proc.stdout.read()
    if proc.wait(timeout=120) != 0:
        raise failed()
    report = json.loads(out)
    cpu["loadgen"] = report["cpu_seconds"]  # its own getrusage over the same window
    return Result(
        cell=cell,
        seconds=report["seconds"],
        exchanges=report["exchanges"],
        refused=report["refused"],
        errors=report["errors"],
        first_error=report["first_error"],
        pick_ms=report["pick_ms"],
        exchange_ms=report["exchange_ms"],
        cpu=cpu,
        step_peak_rss=meter.peak["step"],
        picker_peak_rss=meter.peak["picker"],
        loads=(before, loadavg()),
    )


def pooled(rounds: Sequence[Result]) -> Result:
    """One cell's rounds as one result: exchanges, seconds and CPU summed (so per core is
    every round's exchanges over every round's CPU), latencies the median of the rounds',
    peaks the highest. Rounds of the arms alternate (`--rounds`), so what else ran on the
    shared cores weighs on every arm alike rather than on whichever arm it met."""
    if len(rounds) == 1:
        return rounds[0]

    def median_of(key: Callable[[Result], dict[str, float]]) -> dict[str, float]:
        names = set().union(*(key(r) for r in rounds))
        return {n: statistics.median(key(r)[n] for r in rounds if n in key(r)) for n in names}

    refused: dict[str, int] = {}
    for r in rounds:
        for k, v in r.refused.items():
            refused[k] = refused.get(k, 0) + v
    return Result(
        cell=rounds[0].cell,
        seconds=sum(r.seconds for r in rounds),
        exchanges=sum(r.exchanges for r in rounds),
        refused=refused,
        errors=sum(r.errors for r in rounds),
        first_error=next((r.first_error for r in rounds if r.first_error), ""),
        pick_ms=median_of(lambda r: r.pick_ms),
        exchange_ms=median_of(lambda r: r.exchange_ms),
        cpu={k: sum(r.cpu[k] for r in rounds) for k in rounds[0].cpu},
        step_peak_rss=max(r.step_peak_rss for r in rounds),
        picker_peak_rss=max(r.picker_peak_rss for r in rounds),
        loads=(rounds[0].loads[0], rounds[-1].loads[1]),
    )


# --- the pod -------------------------------------------------------------------------------


@contextlib.contextmanager
def picker_pod(
    replicas: int = 4,
    workers: Sequence[int] = (),
    salting: Path | None = None,
    bounds_off: bool = False,
    env_arms: Sequence[dict[str, str]] = (),
) -> Iterator[tuple[Any, Setup]]:
    """The rendered `gie-v1.5` picker pod (picker + policy step) on a fresh local control
    plane, with stand-in model servers on the kwok pods' IPs; beside it, the same resource
    rendered for `gateway.picker: promptcache` (its picker, config and args) watching the
    same pool; plus, for each of `workers`, the rendered step again with that many worker
    processes, in front of the GIE picker; plus, with `salting`, the prototype picker."""
    from harness import pytest_cluster  # noqa: PLC0415 - the harness, only when it runs
    from harness.epp.launch import Launcher, routing_patch  # noqa: PLC0415
    from harness.epp.shim import GatewayPolicyProcess  # noqa: PLC0415
    from harness.epp.traffic import use_gie_picker  # noqa: PLC0415
    from promptcache.contract import GatewayPolicyEnv  # noqa: PLC0415

    use_gie_picker()
    patch = routing_patch(replicas=replicas, with_front=True)
    patch["isolation"] = {"mode": "PerKey"}
    cluster = pytest_cluster.start_local_cluster(gateway_crds=True)
    extra: list[Any] = []
    try:
        with tempfile.TemporaryDirectory(prefix="gateway-hop-") as tmp:
            launcher = Launcher(cluster, cluster.create_namespace("hop"), Path(tmp))
            try:
                pool = launcher(spec_patch=patch, start_epp=False, apply=False)
                pool.apply()
                # The stand-ins answer the picker's scrapes on the target port directly: the
                # fronts are not on the ext_proc path, and their scrape relays would only
                # add load that is the same in both arms.
                pool.start_pods(with_front=False)
                epp = pool.start_epp()
                container = pool.rendered.gateway_policy_container
                assert pool.shim is not None, "PerKey isolation renders the policy step"
                assert container is not None
                env = {e["name"]: str(e["value"]) for e in container["env"] if "value" in e}
                ours, ours_limit = _promptcache_picker(
                    launcher, pool, patch, Path(tmp) / "promptcache-picker"
                )
                extra.append(ours)
                arms = {
                    PICKER: Arm(f"127.0.0.1:{epp.ports.grpc}", epp.pid, salts=False),
                    PRODUCT: Arm(f"127.0.0.1:{ours.ports.grpc}", ours.pid),
                    "step": Arm(pool.shim.target, epp.pid, pool.shim.pid),
                }
                if bounds_off:
                    off, _ = _promptcache_picker(
                        launcher, pool, patch, Path(tmp) / "bounds-off", BOUNDS_OFF_FLAGS
                    )
                    extra.append(off)
                    arms[BOUNDS_OFF] = Arm(f"127.0.0.1:{off.ports.grpc}", off.pid)
                for i, env_over in enumerate(env_arms):
                    name = env_arm_name(env_over)
                    variant, _ = _promptcache_picker(
                        launcher, pool, patch, Path(tmp) / f"env-{i}", env=env_over
                    )
                    extra.append(variant)
                    arms[name] = Arm(f"127.0.0.1:{variant.ports.grpc}", variant.pid)
                for n in workers:
                    more = GatewayPolicyProcess(
                        container["args"],
                        {**env, GatewayPolicyEnv.WORKERS: str(n)},
                        epp.ports.grpc,
                        Path(tmp) / f"gateway-policy-{n}w",
                        salt_key_file=pool.salt_key_file,
                    ).start()
                    extra.append(more)
                    more.wait_ready()
                    arms[f"step-{n}w"] = Arm(more.target, epp.pid, more.pid)
                if salting is not None:
                    own = _salting_picker(pool, salting, Path(tmp) / "salting-picker")
                    extra.append(own)
                    arms[SALTING] = Arm(f"127.0.0.1:{own.ports.grpc}", own.pid)
                yield (
                    pool,
                    Setup(
                        arms=arms,
                        step_memory_limit=container["resources"]["limits"]["memory"],
                        loadgen=Path(),
                        workdir=Path(tmp),
                        picker_memory_limit=ours_limit,
                    ),
                )
            finally:
                for more in extra:
                    more.stop()
                launcher.close()
    finally:
        pytest_cluster.stop_cluster(cluster)


BOUNDS_OFF = "promptcache-unbounded"
"""`--bounds-off`: the product with its body bounds off, to tell their cost from the
parser's."""
BOUNDS_OFF_FLAGS = ("--max-body-bytes=0", "--body-timeout-seconds=0")

ENV_ARM_PREFIX = "promptcache+"
"""`--env-arm GOGC=100`: the product again, its rendered environment overridden, measured as
an arm of its own (a collector setting tried against the rendered one in the same run)."""


def env_arm_name(env: dict[str, str]) -> str:
    return ENV_ARM_PREFIX + ",".join(f"{k}={v}" for k, v in env.items())


def parse_env_arm(text: str) -> dict[str, str]:
    """`NAME=VALUE[,NAME=VALUE...]`, refused with a clear message otherwise."""
    env: dict[str, str] = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise argparse.ArgumentTypeError(f"expected NAME=VALUE[,NAME=VALUE], got {text!r}")
        env[name.strip()] = value.strip()
    return env


def _promptcache_picker(
    launcher: Any,
    pool: Any,
    patch: dict[str, Any],
    workdir: Path,
    flags: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> Any:
    """promptcache's picker beside the rendered GIE one, on the same pool: the resource
    rendered for `gateway.picker: promptcache` (same names, so the same InferencePool), its
    config (salt key file at the pool's) and args. Plain gRPC (`--secure-serving=false`),
    the baseline's transport: the load generator speaks plain gRPC, and TLS would be a cost
    of the gateway's choosing, not of the picker. Returns it and its rendered memory limit."""
    from harness.epp.process import EppProcess  # noqa: PLC0415
    from harness.epp.rendered import Rendered  # noqa: PLC0415
    from promptcache.contract import PickerFlag, PickerTarget  # noqa: PLC0415

    saved = launcher.picker
    launcher.picker = PickerTarget.PROMPTCACHE
    try:
        rendered: Rendered = launcher.render(spec_patch=patch)
    finally:
        launcher.picker = saved
    assert rendered.pool_name == pool.rendered.pool_name
    assert PickerFlag.MAX_BODY_BYTES in rendered.epp_args, "the product runs with its bounds"
    workdir.mkdir(parents=True, exist_ok=True)
    picker = EppProcess(
        _picker_binary(),
        rendered.epp_config_text_with_salt_key(pool.salt_key_file),
        workdir,
        pool_name=rendered.pool_name,
        pool_namespace=rendered.namespace,
        extra_args=[*rendered.epp_args, "--secure-serving=false", *flags],
        kubeconfig=pool.service_account_kubeconfig(),
    )
    # The container's own environment as rendered (GOMEMLIMIT above all: without it the Go
    # heap grows to twice its live data before collecting, and the memory cell would measure
    # a picker no pod runs).
    picker.env.update(
        {e["name"]: e["value"] for e in rendered.epp_container.get("env", []) if "value" in e}
    )
    picker.env.update(env or {})
    picker.start()
    picker.wait_ready()
    picker.wait_scraped({p.name: float(p.server.snapshot().waiting) for p in pool.pods})
    return picker, str(rendered.epp_container["resources"]["limits"]["memory"])


def _picker_binary() -> Path:
    """promptcache's picker build: the very binary of the GIE arm (`PROMPTCACHE_GIE_EPP_BIN`
    names another build for both)."""
    from harness.epp.binary import find_epp_binary, missing_reason  # noqa: PLC0415
    from promptcache.contract import PickerTarget  # noqa: PLC0415

    found = find_epp_binary(PickerTarget.PROMPTCACHE)
    if found is None:
        raise SystemExit(missing_reason(PickerTarget.PROMPTCACHE))
    return found


SALTING = "picker+salt"
"""The arm without a hop: bench/salting_picker, the picker deriving the salt itself."""
SALTING_DIR = ROOT / "bench" / "salting_picker"


def salting_picker_binary() -> Path:
    """The prototype picker, built once per source digest (the picker's own module versions:
    a machine that built picker/ has every module)."""
    return _go_tool(SALTING_DIR, "salting_picker", ["-trimpath", "-ldflags", "-s -w"])


def _salting_picker(pool: Any, binary: Path, workdir: Path) -> Any:
    """The prototype beside the rendered picker: the same config and args, plus its parser."""
    import copy  # noqa: PLC0415

    from harness.epp.process import EppProcess  # noqa: PLC0415

    config = copy.deepcopy(pool.rendered.epp_config)
    config["plugins"].append(
        {
            "name": "promptcache-salt",
            "type": "promptcache-salting-parser",
            "parameters": {"saltKeyFile": str(pool.salt_key_file), "isolationHeader": KEY_HEADER},
        }
    )
    config["parser"] = {"pluginRef": "promptcache-salt"}
    workdir.mkdir(parents=True, exist_ok=True)
    picker = EppProcess(
        binary,
        json.dumps(config),
        workdir,
        pool_name=pool.rendered.pool_name,
        pool_namespace=pool.rendered.namespace,
        extra_args=pool.rendered.epp_args,
        kubeconfig=pool.service_account_kubeconfig(),
    ).start()
    picker.wait_ready()
    picker.wait_scraped({p.name: float(p.server.snapshot().waiting) for p in pool.pods})
    return picker


# --- report --------------------------------------------------------------------------------


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def pairs(results: Sequence[Result]) -> Iterator[tuple[Result, Result]]:
    """(picker alone, a step arm) for each cell measured both ways."""
    by = {r.cell: r for r in results}
    for r in results:
        if r.cell.arm != PICKER:
            base = by.get(Cell(r.cell.size, r.cell.mode, r.cell.concurrency, PICKER))
            if base is not None:
                yield base, r


def table(results: Sequence[Result]) -> str:
    cols = [
        "body", "mode", "conc", "arm", "picker alone /s", "arm /s", "raw ratio",
        "picker alone /s/core", "arm /s/core", "per-core ratio", "pick p50 alone (ms)",
        "added p50", "pick p99 alone", "added p99", "step CPU ms/req", "picker CPU ms/req",
        "loadgen CPU (cores)", "step peak RSS", "picker peak RSS alone / arm", "refused/failed",
    ]  # fmt: skip
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for a, b in pairs(results):
        row = [
            a.cell.size, a.cell.mode, str(a.cell.concurrency), b.cell.arm,
            f"{a.rate:.0f}", f"{b.rate:.0f}", f"{b.rate / a.rate:.2f}" if a.rate else "-",
            f"{a.per_core:.0f}", f"{b.per_core:.0f}",
            f"{b.per_core / a.per_core:.2f}" if a.per_core else "-",
            _ms(a.pick_ms.get("p50")),
            _ms(b.pick_ms.get("p50", 0) - a.pick_ms.get("p50", 0)),
            _ms(a.pick_ms.get("p99")),
            _ms(b.pick_ms.get("p99", 0) - a.pick_ms.get("p99", 0)),
            f"{b.ms_per_exchange('step'):.2f}", f"{b.ms_per_exchange('picker'):.2f}",
            f"{max(a.cpu['loadgen'] / a.seconds, b.cpu['loadgen'] / b.seconds):.2f}",
            f"{b.step_peak_rss / 1024**2:.0f} MiB",
            f"{a.picker_peak_rss / 1024**2:.0f} / {b.picker_peak_rss / 1024**2:.0f} MiB",
            str(sum(b.refused.values()) + b.errors),
        ]  # fmt: skip
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def goals(results: Sequence[Result], memory_limit: str, picker_limit: str = "") -> list[str]:
    """The goals, judged on what this run measured: for promptcache's picker (issue 42)
    >= 0.95x per core at 64, added p50 <= 0.1 ms at 1, RSS under its rendered limit at
    1 MiB; for the policy step (issue 26, the llm-d-router path) 0.8x, 1 ms, its limit."""
    out = []
    for a, b in pairs(results):
        c = a.cell
        product = b.cell.arm in (PRODUCT, BOUNDS_OFF) or b.cell.arm.startswith(ENV_ARM_PREFIX)
        ratio_goal, p50_goal = (0.95, 0.1) if product else (0.8, 1.0)
        if not (a.exchanges and b.exchanges):
            out.append(f"no exchanges completed in {c.size} {c.mode} c={c.concurrency}")
            continue
        if c.concurrency == 64:
            ok = b.per_core / a.per_core >= ratio_goal
            out.append(
                f"{'met   ' if ok else 'missed'} {c.size} {c.mode} c=64 {b.cell.arm}: per core "
                f"{b.per_core / a.per_core:.2f}x the GIE picker alone (goal >= {ratio_goal}x); "
                f"raw {b.rate / a.rate:.2f}x on this machine"
            )
        if c.concurrency == 1 and (product or c.size == "1KiB"):
            added = b.pick_ms.get("p50", 0) - a.pick_ms.get("p50", 0)
            out.append(
                f"{'met   ' if added <= p50_goal else 'missed'} {c.size} {c.mode} c=1 "
                f"{b.cell.arm}: added p50 {added:.2f} ms (goal <= {p50_goal} ms)"
            )
        if c.size == "1MiB" and c.concurrency >= 64:
            if product:
                limit_text, peak, who = picker_limit, b.picker_peak_rss, "picker"
            else:
                limit_text, peak, who = memory_limit, b.step_peak_rss, "step"
            ok = bool(limit_text) and peak < _quantity(limit_text)
            out.append(
                f"{'met   ' if ok else 'missed'} 1MiB {c.mode} c={c.concurrency} {b.cell.arm}: "
                f"{who} peak RSS {peak / 1024**2:.0f} MiB (GIE alone "
                f"{a.picker_peak_rss / 1024**2:.0f} MiB), rendered limit {limit_text} "
                f"({sum(b.refused.values())} refused, {b.errors} failed)"
            )
    return out


def _quantity(text: str) -> int:
    units = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}
    for suffix, scale in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * scale)
    return int(text)


def plot(results: Sequence[Result], out: Path, load: tuple[float, float]) -> list[Path]:
    import matplotlib  # noqa: PLC0415 - only the bench draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    out.mkdir(parents=True, exist_ok=True)
    sizes = list(dict.fromkeys(r.cell.size for r in results))
    modes = list(dict.fromkeys(r.cell.mode for r in results))
    arms = list(dict.fromkeys(r.cell.arm for r in results))
    paths = []
    figures: list[tuple[str, Callable[[Result], float], str]] = [
        ("throughput", lambda r: r.per_core, "exchanges per CPU second of the pod"),
        ("latency", lambda r: r.pick_ms.get("p50", float("nan")), "pick latency p50 (ms)"),
    ]
    for name, value, label in figures:
        fig, axes = plt.subplots(
            len(modes), len(sizes), figsize=(4 * len(sizes), 3.2 * len(modes)), squeeze=False
        )
        for i, mode in enumerate(modes):
            for j, size in enumerate(sizes):
                ax = axes[i][j]
                for arm in arms:
                    pts = sorted(
                        (r.cell.concurrency, value(r))
                        for r in results
                        if (r.cell.size, r.cell.mode, r.cell.arm) == (size, mode, arm)
                    )
                    ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=arm)
                ax.set_xscale("log", base=2)
                ax.set_xticks(sorted({r.cell.concurrency for r in results}))
                ax.set_xticklabels([str(c) for c in sorted({r.cell.concurrency for r in results})])
                ax.set_yscale("log")
                ax.set_title(f"{size}, {mode}")
                ax.set_xlabel("concurrency")
                if j == 0:
                    ax.set_ylabel(label)
        axes[0][0].legend(fontsize=8)
        fig.suptitle(
            f"The gateway hop: GIE v1.5.0 picker alone vs promptcache's picker and the step "
            f"(load average {load[0]:.1f} before, {load[1]:.1f} after)"
        )
        fig.tight_layout()
        path = out / f"gateway-hop-{name}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 KiB and 32 KiB, c=1 and 64, 3 s")
    ap.add_argument("--seconds", type=float, default=None, help="measured seconds per cell")
    ap.add_argument("--warmup", type=float, default=1.5)
    ap.add_argument("--sizes", default=None, help="comma-separated: 1KiB,32KiB,1MiB")
    ap.add_argument("--modes", default=None, help="comma-separated: buffered,streamed")
    ap.add_argument("--concurrency", default=None, help="comma-separated, e.g. 1,64,256")
    ap.add_argument("--workers", default="", help="extra step arms with N workers, e.g. 2,4")
    ap.add_argument(
        "--memory-concurrency",
        type=int,
        default=256,
        help="also run the 1 MiB cells at this concurrency (memory); 0: not",
    )
    ap.add_argument(
        "--bounds-off",
        action="store_true",
        help=f"add the product with its body bounds off ({BOUNDS_OFF})",
    )
    ap.add_argument(
        "--env-arm",
        type=parse_env_arm,
        action="append",
        default=[],
        metavar="NAME=VALUE[,NAME=VALUE]",
        help="add the product again with this environment over its rendered one, e.g. "
        f"GOGC=100 (arm {ENV_ARM_PREFIX}GOGC=100); repeatable",
    )
    ap.add_argument(
        "--salting-picker",
        action="store_true",
        help="add the prototype that preceded promptcache's picker (bench/salting_picker)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure each cell this many times, the arms alternating, and pool the rounds "
        "(a shared machine's load then weighs on every arm alike)",
    )
    ap.add_argument(
        "--arms",
        default=None,
        help=f"comma-separated arms to measure besides {PICKER} (default: every arm set up)",
    )
    ap.add_argument("--json", type=Path, default=None, help="write every cell here")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="plot directory")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    quick_sizes = ["1KiB", "32KiB"] if args.quick else list(SIZES)
    sizes = args.sizes.split(",") if args.sizes else quick_sizes
    modes = args.modes.split(",") if args.modes else list(MODES)
    quick_conc = list(CONCURRENCY)
    conc = [int(c) for c in args.concurrency.split(",")] if args.concurrency else quick_conc
    workers = [int(n) for n in args.workers.split(",") if n]
    seconds = args.seconds or (3.0 if args.quick else 8.0)
    loadgen = loadgen_binary()
    salting = salting_picker_binary() if args.salting_picker else None
    t0, load0 = time.monotonic(), loadavg()
    results: list[Result] = []
    cells = [(size, mode, c) for size in sizes for mode in modes for c in conc]
    if args.memory_concurrency and "1MiB" in sizes and args.memory_concurrency not in conc:
        cells += [("1MiB", mode, args.memory_concurrency) for mode in modes]
    with picker_pod(
        workers=workers, salting=salting, bounds_off=args.bounds_off, env_arms=args.env_arm
    ) as (
        _pool,
        setup,
    ):
        setup.loadgen = loadgen
        chosen = [PICKER, *args.arms.split(",")] if args.arms else list(setup.arms)
        arms = [a for a in setup.arms if a in chosen]
        for size, mode, c in cells:
            rounds: dict[str, list[Result]] = {arm: [] for arm in arms}
            for _ in range(max(args.rounds, 1)):
                for arm in arms:
                    r = run_cell(setup, Cell(size, mode, c, arm), seconds, args.warmup)
                    rounds[arm].append(r)
                    print(
                        f"{size:>6} {mode:>8} c={c:<3} {arm:>7}: {r.rate:6.0f}/s "
                        f"{r.per_core:6.0f}/s/core pick p50 {r.pick_ms.get('p50', 0):7.2f} "
                        f"p99 {r.pick_ms.get('p99', 0):7.2f} ms  cores "
                        + " ".join(f"{k}={v / r.seconds:.2f}" for k, v in r.cpu.items())
                        + f" rss step {r.step_peak_rss / 1024**2:.0f}M"
                        + f" picker {r.picker_peak_rss / 1024**2:.0f}M"
                        + f" refused={r.refused} errors={r.errors} {r.first_error[:80]}"
                        + f" load {r.loads[0]:.1f}->{r.loads[1]:.1f}",
                        flush=True,
                    )
            results += [pooled(rs) for rs in rounds.values()]
    load = (load0, loadavg())
    print()
    print(table(results))
    print()
    print("\n".join(goals(results, setup.step_memory_limit, setup.picker_memory_limit)))
    print(
        f"\nload average {load[0]:.2f} before, {load[1]:.2f} after; "
        f"{time.monotonic() - t0:.0f} s; 2 CPUs; step memory limit {setup.step_memory_limit}; "
        f"promptcache picker memory limit {setup.picker_memory_limit}"
    )
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    if not args.no_plot:
        for path in plot(results, args.out, load):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

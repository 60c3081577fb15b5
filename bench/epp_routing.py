#!/usr/bin/env python3
"""How often the real Endpoint Picker sends a chat turn to the pod that holds its prefix.

Workload: N conversations x T turns with growing prompts (a system prompt shared
by a few conversations, then alternating user/assistant messages), interleaved
across conversations, routed over ext_proc through the real EPP with the config
`promptcache render` generates for examples/minimal.yaml (4 replicas). A turn
is a hit when it goes to the pod that served the same conversation's previous
turn (that pod holds the conversation's prefix). Turn 1 has no prefix and is
not counted.

Baselines measured in the same run on the same workload: the oracle (always
the previous pod: 1.0 by construction, counted, not assumed) and a random
router. The stand-in pods report load that follows the routing (a pod's queue
and KV usage grow with the turns recently sent to it and drain over time), so
the load scorers push back against piling conversations on one pod.

Run: `python bench/epp_routing.py` (about a minute; `--full` for 200 x 10
over 8 pods; `--cluster` to discover pods through the local control plane
instead of a file). Needs the EPP binary (see docs/endpoint-picker.md).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

import pytest_cluster  # e2e/: the same local control plane the tests use
from epp.binary import EPP_VERSION, find_epp_binary, missing_reason
from epp.extproc import ExtProcClient
from epp.fake_pod import FakePod
from epp.file_pool import FilePool
from epp.launch import Launcher, routing_patch
from epp.rendered import EXAMPLES, Rendered, load_example, render_resource

GOAL = 0.9


@dataclass
class Conversation:
    cid: str
    system: str
    messages: list[dict[str, str]] = field(default_factory=list)
    last_pod: str | None = None

    def next_turn(self, rng: random.Random) -> list[dict[str, str]]:
        """Add this turn's user message and return the whole prompt."""
        self.messages.append({"role": "user", "content": words(rng, rng.randint(40, 90))})
        return [{"role": "system", "content": self.system}, *self.messages]

    def answered(self, rng: random.Random) -> None:
        self.messages.append({"role": "assistant", "content": words(rng, rng.randint(60, 140))})


VOCAB = [f"w{i:04d}" for i in range(2000)]


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(n))


def workload(convs: int, turns: int, seed: int) -> list[tuple[int, int]]:
    """(conversation, turn) in an interleaved order: turns of one conversation stay ordered."""
    rng = random.Random(seed)
    pending = {c: 0 for c in range(convs)}
    order = []
    while pending:
        c = rng.choice(sorted(pending))
        order.append((c, pending[c]))
        pending[c] += 1
        if pending[c] == turns:
            del pending[c]
    return order


class LoadModel:
    """Pod metrics that follow routing: recent turns queue up and fill the KV cache."""

    def __init__(self, pods: list[FakePod], window: int, capacity: int) -> None:
        self.pods = {p.address: p for p in pods}
        self.recent: dict[str, deque[float]] = {a: deque() for a in self.pods}
        self.window_s = window
        self.capacity = capacity
        self.lock = threading.Lock()

    def routed(self, address: str) -> None:
        now = time.monotonic()
        with self.lock:
            self.recent[address].append(now)
            self._publish(now)

    def _publish(self, now: float) -> None:
        for addr, q in self.recent.items():
            while q and now - q[0] > self.window_s:
                q.popleft()
            active = len(q)
            self.pods[addr].set(
                running=min(active, self.capacity),
                waiting=max(0, active - self.capacity),
                kv_cache_usage=min(1.0, active / (2.0 * self.capacity)),
            )


@dataclass
class Result:
    hits: int
    counted: int
    pick_ms: float
    per_pod: dict[str, int]

    @property
    def fraction(self) -> float:
        return self.hits / self.counted

    @property
    def busiest_share(self) -> float:
        """The busiest pod's share of all turns (1/pods is perfectly even)."""
        return max(self.per_pod.values()) / sum(self.per_pod.values())


def run_policy(
    client: ExtProcClient | None,
    pods: list[str],
    convs: int,
    turns: int,
    seed: int,
    policy: str,
    session_header: str | None,
    pace_s: float,
    load: LoadModel | None,
) -> Result:
    """Route the workload and count the turns that went to the previous turn's pod."""
    rng = random.Random(seed)
    systems = [words(rng, 250) for _ in range(max(1, convs // 10))]
    conversations = [Conversation(f"conv-{c}", systems[c % len(systems)]) for c in range(convs)]
    pick_rng = random.Random(seed + 1)
    hits = counted = 0
    latency = 0.0
    per_pod = dict.fromkeys(pods, 0)
    for c, turn in workload(convs, turns, seed):
        conv = conversations[c]
        body: dict[str, Any] = {
            "model": "bench-model",
            "messages": conv.next_turn(rng),
            "max_tokens": 64,
        }
        if policy == "epp":
            assert client is not None
            headers = {session_header: conv.cid} if session_header else {}
            t0 = time.perf_counter()
            answer = client.pick(body, headers=headers)
            latency += time.perf_counter() - t0
            if answer.endpoint is None:
                raise RuntimeError(f"EPP gave no endpoint: {answer}")
            pod = answer.endpoint
        elif policy == "oracle":
            pod = conv.last_pod or pick_rng.choice(pods)
        else:
            pod = pick_rng.choice(pods)
        if turn > 0:
            counted += 1
            hits += pod == conv.last_pod
        conv.last_pod = pod
        per_pod[pod] = per_pod.get(pod, 0) + 1
        conv.answered(rng)
        if load is not None:
            load.routed(pod)
        if pace_s:
            time.sleep(pace_s)
    return Result(hits, counted, latency / max(1, convs * turns) * 1000, per_pod)


def rendered_config(session: bool, pods: int, namespace: str = "bench") -> Rendered:
    patch = routing_patch(replicas=pods, session=session)
    return Rendered(render_resource(load_example(EXAMPLES / "minimal.yaml", namespace, patch)))


def session_header_of(rendered: Rendered) -> str | None:
    for p in rendered.epp_config["plugins"]:
        if p["type"].startswith("session-affinity"):
            return str(p["parameters"]["sessionIdConfig"]["sources"][0]["header"])
    return None


def measure(
    args: argparse.Namespace, session: bool, capacity: int, workdir: Path, cluster: Any | None
) -> Result:
    """One EPP run on the workload, with pods from a file or from the local cluster."""
    if cluster is None:
        rendered = rendered_config(session, args.pods)
        with FilePool(rendered, workdir, args.pods, net=78 if session else 77) as pool:
            return drive(args, pool.epp, pool.pods, rendered, capacity)
    launcher = Launcher(cluster, cluster.create_namespace("bench"), workdir)
    try:
        cpool = launcher(spec_patch=routing_patch(replicas=args.pods, session=session))
        return drive(args, cpool.epp, [p.server for p in cpool.pods], cpool.rendered, capacity)
    finally:
        launcher.close()


def drive(
    args: argparse.Namespace, epp: Any, pods: list[FakePod], rendered: Rendered, capacity: int
) -> Result:
    load = LoadModel(pods, args.load_window, capacity)
    with epp.client() as client:
        return run_policy(
            client,
            [p.address for p in pods],
            args.conversations,
            args.turns,
            args.seed,
            "epp",
            session_header_of(rendered),
            args.pace,
            load,
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="200 conversations x 10 turns over 8 pods")
    ap.add_argument("--conversations", type=int, default=50)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--pods", type=int, default=4)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--pace", type=float, default=0.02, help="seconds between requests")
    ap.add_argument(
        "--load-window", type=float, default=1.0, help="seconds a routed turn counts as load"
    )
    ap.add_argument(
        "--pod-capacity", type=int, default=16, help="requests a pod runs before it queues"
    )
    ap.add_argument(
        "--cluster", action="store_true", help="discover pods via the local control plane"
    )
    args = ap.parse_args(argv)
    if args.full:
        args.conversations, args.turns, args.pods = 200, 10, 8
    if find_epp_binary() is None:
        print(missing_reason(), file=sys.stderr)
        return 2

    addresses = [f"pod-{i}" for i in range(args.pods)]  # the baselines need names only
    t0 = time.monotonic()
    shape = (args.conversations, args.turns, args.seed)
    oracle = run_policy(None, addresses, *shape, "oracle", None, 0, None)
    rand = run_policy(None, addresses, *shape, "random", None, 0, None)
    rows: list[tuple[str, Result]] = [("oracle (previous pod)", oracle), ("random pod", rand)]
    regimes = [("pods keep up", args.pod_capacity), ("overloaded", max(1, args.pod_capacity // 2))]
    cluster = pytest_cluster.start_local_cluster(gateway_crds=True) if args.cluster else None
    try:
        with tempfile.TemporaryDirectory(prefix="epp-bench-") as tmp:
            for regime, capacity in regimes:
                for session in (False, True):
                    workdir = Path(tmp) / f"{capacity}-{session}"
                    workdir.mkdir()
                    label = f"EPP, {regime}: prefix+load" + (" +session" if session else "")
                    rows.append((label, measure(args, session, capacity, workdir, cluster)))
    finally:
        if cluster is not None:
            pytest_cluster.stop_cluster(cluster)
    elapsed = time.monotonic() - t0

    print(
        f"Endpoint Picker routing: llm-d-router {EPP_VERSION}, generated config of "
        f"examples/minimal.yaml; {args.conversations} conversations x {args.turns} turns over "
        f"{args.pods} pods ({'cluster' if args.cluster else 'file'} discovery), {elapsed:.0f} s"
    )
    print(
        f"load: a turn counts {args.load_window:g} s; pods run {args.pod_capacity} at once "
        f"('overloaded': {regimes[1][1]}) before queueing"
    )
    print(f"{'router':44} {'hits':>9} {'fraction':>8} {'/oracle':>8} {'busiest':>8} {'pick ms':>8}")
    for label, r in rows:
        print(
            f"{label:44} {r.hits:>4}/{r.counted:<4} {r.fraction:>8.3f} "
            f"{r.fraction / oracle.fraction:>8.3f} {r.busiest_share:>8.2f} {r.pick_ms:>8.2f}"
        )
    print(f"(busiest = the busiest pod's share of turns; {1 / args.pods:.2f} is even)")
    for label, r in rows[2:]:
        ratio = r.fraction / oracle.fraction
        verdict = "meets" if ratio >= GOAL else "below"
        times_random = r.fraction / rand.fraction
        print(
            f"{label}: {ratio:.3f} of oracle, {times_random:.1f}x random -> {verdict} goal {GOAL}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

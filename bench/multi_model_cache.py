#!/usr/bin/env python3
"""Prefix-cache hits of a mixed multi-model, multi-adapter, multi-tenant workload on real
engines: one shared Gateway (body-based router) against the same workload split by hand.

What a platform team gives up, or not, by putting several models behind one Gateway is cache
hits: every request must still reach a pod of its own model whose cache holds its prefix,
with its tenant's salt, through one more hop. This bench sends one workload both ways, on
the same real engines, at the same time, and compares what the engines themselves count.

* **Engines**: `alpha` (tiny model A served as `base-a` with two LoRA adapters, `sql-lora`
  and `chat-lora`; two pods) and `beta` (tiny model B as `base-b`; one pod): three real
  `vllm serve` processes behind the real cache fronts, each with a small KV cache
  (`--kv-mib`, default 6 MiB: 192 blocks of 32 tokens) so that the workload does not fit.
* **Shared Gateway** (the `shared` arm): GIE's real `bbr`, the rendered HTTPRoutes, then the
  pool's rendered policy step and real GIE v1.5 picker (prefix-cache and LoRA-affinity
  scorers), as `harness/engine/gateway.py` plays an Envoy Gateway.
* **Split by hand** (the `split` arm): one Gateway per base model and no router; the client
  knows which pool serves which name and asks that pool's policy step and picker itself
  (an adapter goes to its base model's pool: vLLM serves it from the same pods).
* **Workload** (seeded): 3 tenants x 4 names (the two bases and both adapters, by
  popularity 0.35/0.25/0.15/0.25); each (tenant, name) has a system prompt of 200 words;
  sessions of 3 turns whose history grows with each answer. The two arms run the same
  sessions interleaved turn by turn (so both see the same cache pressure), each with its own
  isolation keys (so neither can hit the other's blocks).
* **Reported**: per arm and per name, cached prompt tokens / prompt tokens as the engines'
  `usage` reports them; shared/split; that every answer came from the model or adapter
  named.

Run: `python -m bench.multi_model_cache` (3 engines, about 6 minutes warm; `--sessions` to
change the length). Needs `e2e/cluster build --only epp bbr` and `scripts/engine`. Quote
figures with the load average of the run (token counts, not timings, so load matters little).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from harness import pytest_cluster
from harness.engine.client import Answer, long_text
from harness.engine.cluster_pods import start_pool_pods
from harness.engine.gateway import ADAPTERS, SERVED, Gateway, send, two_model_resources
from harness.epp.bbr import BbrProcess, chart_router_args
from harness.epp.extproc import DESTINATION_HEADER
from harness.epp.pool import PoolOnCluster
from harness.epp.rendered import Rendered, render_resource
from harness.pod import ProcessPod
from harness.vllm import TinyModel, tiny_model
from harness.vllm.adapters import tiny_adapter
from promptcache.contract import DEFAULT_ISOLATION_HEADER
from tools import install_assets

POPULARITY = {"base-a": 0.35, "sql-lora": 0.25, "chat-lora": 0.15, "base-b": 0.25}
TENANTS = ("t1", "t2", "t3")
ARMS = ("shared", "split")


@dataclass(frozen=True)
class Plan:
    sessions: int
    turns: int
    kv_mib: int
    seed: int
    out: Path | None = None


def parse_args(argv: list[str] | None = None) -> Plan:
    p = argparse.ArgumentParser(prog="python -m bench.multi_model_cache", description=__doc__)
    p.add_argument("--sessions", type=int, default=80, help="sessions per arm")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--kv-mib", type=int, default=6, help="KV cache per engine")
    p.add_argument("--seed", type=int, default=24)
    p.add_argument("--out", default="docs/img", help="folder of the PNG ('' for none)")
    a = p.parse_args(argv)
    return Plan(a.sessions, a.turns, a.kv_mib, a.seed, Path(a.out) if a.out else None)


@dataclass
class Session:
    tenant: str
    name: str
    system: str
    questions: list[str]
    history: dict[str, list[dict[str, str]]] = field(default_factory=dict)


def workload(plan: Plan) -> list[Session]:
    rng = random.Random(plan.seed)
    systems = {
        (t, n): long_text(1000 + 10 * i + j, words=200)
        for i, t in enumerate(TENANTS)
        for j, n in enumerate(POPULARITY)
    }
    names, weights = list(POPULARITY), list(POPULARITY.values())
    out = []
    for s in range(plan.sessions):
        tenant, name = rng.choice(TENANTS), rng.choices(names, weights)[0]
        questions = [long_text(5000 + s * 10 + k, words=40) for k in range(plan.turns)]
        out.append(Session(tenant, name, systems[(tenant, name)], questions))
    return out


@dataclass
class Tally:
    prompt: int = 0
    cached: int = 0
    requests: int = 0
    wrong_model: int = 0

    def ratio(self) -> float:
        return self.cached / self.prompt if self.prompt else 0.0


def chat(session: Session, arm: str, turn: int) -> dict[str, Any]:
    history = session.history.setdefault(arm, [])
    return {
        "model": session.name,
        "messages": [
            {"role": "system", "content": session.system},
            *history,
            {"role": "user", "content": session.questions[turn]},
        ],
        "max_tokens": 8,
        "temperature": 0,
    }


async def split_send(
    http: aiohttp.ClientSession, gateway: Gateway, body: dict[str, Any], key: str
) -> Answer:
    """The hand-split world: the client picks the pool of the name's base model itself."""
    pool = gateway.pools[SERVED[body["model"]]]
    headers = {"content-type": "application/json", DEFAULT_ISOLATION_HEADER: key}

    def pick() -> tuple[str, bytes, dict[str, str]]:
        raw = json.dumps(body).encode()
        with pool.client() as picker:
            picked = picker.pick(raw, headers=headers, path="/v1/chat/completions")
        assert picked.endpoint is not None, picked
        sent = {**headers, **picked.set_headers}
        drop = (":", "content-length", DESTINATION_HEADER)
        sent = {k: v for k, v in sent.items() if not k.startswith(drop)}
        return picked.endpoint, picked.body or raw, sent

    endpoint, raw, sent = await asyncio.to_thread(pick)
    async with http.post(f"http://{endpoint}/v1/chat/completions", data=raw, headers=sent) as r:
        text = await r.text()
        answer = Answer(r.status, dict(r.headers), raw=text)
    answer.body = json.loads(text)
    return answer


async def run(gateway: Gateway, sessions: list[Session], plan: Plan) -> dict[str, dict[str, Tally]]:
    tallies: dict[str, dict[str, Tally]] = {arm: defaultdict(Tally) for arm in ARMS}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        for turn in range(plan.turns):
            for i, session in enumerate(sessions):
                order = ARMS if (i + turn) % 2 == 0 else ARMS[::-1]
                for arm in order:
                    body = chat(session, arm, turn)
                    key = f"{arm}-{session.tenant}"
                    if arm == "shared":
                        _, answer = await send(
                            http, gateway, "POST", "/v1/chat/completions", body, key
                        )
                    else:
                        answer = await split_send(http, gateway, body, key)
                    assert answer.status == 200, answer.raw[:300]
                    t = tallies[arm][session.name]
                    t.requests += 1
                    t.prompt += answer.usage["prompt_tokens"]
                    t.cached += answer.cached
                    t.wrong_model += answer.body["model"] != session.name
                    reply = answer.body["choices"][0]["message"]["content"]
                    session.history[arm] += [
                        {"role": "user", "content": session.questions[turn]},
                        {"role": "assistant", "content": reply},
                    ]
    return tallies


@contextlib.contextmanager
def shared_gateway(plan: Plan, workdir: Path) -> Iterator[Gateway]:
    cluster = pytest_cluster.start_local_cluster(gateway_crds=True)
    try:
        model_a, model_b = tiny_model(), tiny_model(TinyModel(seed=1))
        adapters_dir = tiny_adapter(model_a, next(iter(ADAPTERS.values()))).parent
        ns = cluster.create_namespace("mm-bench")
        docs = two_model_resources(model_a, model_b, adapters_dir, alpha_replicas=2)
        pools: dict[str, PoolOnCluster] = {}
        pods: dict[str, list[ProcessPod]] = {}
        args = chart_router_args(install_assets.helm_template)
        with (
            BbrProcess(
                pytest_cluster.built_binary("bbr"),
                workdir / "bbr",
                cluster.kubeconfig,
                args,
                namespace=None,  # its own control plane: every namespace, the chart's default
            ) as bbr,
            contextlib.ExitStack() as teardown,
        ):
            core = 0
            started = time.monotonic()
            for name, doc in docs.items():
                doc["metadata"]["namespace"] = ns
                pool = PoolOnCluster(cluster, Rendered(render_resource(doc)), workdir / name)
                teardown.callback(pool.close)
                pools[name] = pool
                pool.apply()
            for name, pool in pools.items():
                started_pods = start_pool_pods(pool, workdir, plan.kv_mib << 20, first_core=core)
                core += len(started_pods)
                for p in started_pods:
                    teardown.callback(p.stop)
                pods[name] = started_pods
                pool.start_epp(wait_scraped=False)
            print(f"engines Ready after {time.monotonic() - started:.0f} s")
            bbr.wait_ready()
            routes = [o for p in pools.values() for o in p.rendered.of_kind("HTTPRoute")]
            yield Gateway(
                bbr, routes, pools, {n: p[0] for n, p in pods.items()}, docs, all_pods=pods
            )
    finally:
        pytest_cluster.stop_cluster(cluster)


def report(tallies: dict[str, dict[str, Tally]], plan: Plan, elapsed: float) -> None:
    print(f"\n{plan.sessions} sessions x {plan.turns} turns per arm, {plan.kv_mib} MiB KV per "
          f"engine, {elapsed:.0f} s")  # fmt: skip
    print(f"{'name':<10} {'shared':>8} {'split':>8} {'shared/split':>13} {'requests':>9}")
    totals = {arm: Tally() for arm in ARMS}
    for name in POPULARITY:
        s, p = tallies["shared"][name], tallies["split"][name]
        for arm, t in (("shared", s), ("split", p)):
            tot = totals[arm]
            tot.prompt += t.prompt
            tot.cached += t.cached
            tot.requests += t.requests
            tot.wrong_model += t.wrong_model
        rel = s.ratio() / p.ratio() if p.ratio() else float("nan")
        print(f"{name:<10} {s.ratio():8.3f} {p.ratio():8.3f} {rel:13.3f} {s.requests:9d}")
    s, p = totals["shared"], totals["split"]
    print(f"{'all':<10} {s.ratio():8.3f} {p.ratio():8.3f} {s.ratio() / p.ratio():13.3f} "
          f"{s.requests:9d}")  # fmt: skip
    print(f"answers from another model or adapter: shared {s.wrong_model}, split {p.wrong_model}")
    print(f"prompt tokens: shared {s.prompt}, split {p.prompt}; cached: {s.cached}, {p.cached}")


def main(argv: list[str] | None = None) -> int:
    plan = parse_args(argv)
    print(f"load average at start: {os.getloadavg()}")
    sessions = workload(plan)
    with (
        tempfile.TemporaryDirectory(prefix="mm-bench-") as tmp,
        shared_gateway(plan, Path(tmp)) as gw,
    ):
        print(f"load average with the engines up: {os.getloadavg()}")
        started = time.monotonic()
        tallies = asyncio.run(run(gw, sessions, plan))
        report(tallies, plan, time.monotonic() - started)
    print(f"load average at end: {os.getloadavg()}")
    if plan.out is not None:
        print(f"plot: {plot(tallies, plan.out)}")
    return 0


def plot(tallies: dict[str, dict[str, Tally]], out: Path) -> Path:
    """Cached share of prompt tokens per name, both arms side by side."""
    import matplotlib  # noqa: PLC0415 - only the bench draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    names = list(POPULARITY)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for k, (arm, colour, label) in enumerate(
        (("shared", "#dd8452", "one Gateway, body-based router"),
         ("split", "#4c72b0", "split by hand, one Gateway per model"))
    ):  # fmt: skip
        xs = [i + (k - 0.5) * 0.38 for i in range(len(names))]
        ax.bar(xs, [tallies[arm][n].ratio() for n in names], width=0.36, color=colour, label=label)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("cached / prompt tokens")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title("Prefix-cache hits on real engines, same workload, same run")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "multi-model-cache.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


if __name__ == "__main__":
    raise SystemExit(main())

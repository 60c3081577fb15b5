"""Changing a live resource's LoRA adapters, and per-adapter status, on real engines.

On the local control plane, the operator reconciles `alpha` (the tiny model served as
`base-a`, one locally made adapter `sql-lora` on a hostPath volume); the real Deployment
controller rolls its model-server pods; the harness's kubelet (`ProcessKubelet`) runs each
pod kwok gives an IP as processes (the real cache front before a real `vllm serve`, exactly
as the API server holds the pod) and stops each deleted pod as a kubelet would (the vllm
container's preStop hook, SIGTERM, the grace period). The pool's picker as rendered by
default (promptcache's own build: GIE v1.5.0's runner and scorers with promptcache's
plugins) chooses the pod of every request, as the Gateway would ask it.

What must hold, read back from the real API server and from what clients received:

* `status.adapters` says `Served` with the number of ready pods that serve each adapter;
* while continuous traffic (base model and adapters, whole and streamed answers) runs, an
  adapter is added and then removed: the Deployment rolls a new pod in and the old one
  out, every request gets its whole answer (no 5xx, no connection error, no truncated
  stream), some of them were in flight on the old pod as it was stopped, and the status
  follows (the new adapter `NotOnEveryPod` with 0 ready pods, then `Served` by 1);
* an adapter whose path holds nothing shows `AdapterNotFound`, and one whose rank is above
  `engine.maxLoraRank` shows `RankOverLimit`, both from what vLLM said as it stopped (the
  termination message), while the old pod goes on serving the rest;
* with two pods and an adapter running on one of them, the picker's `lora-affinity-scorer`
  (reading `vllm:lora_requests_info`) sends that adapter's requests to that pod, and with
  its weight at 0 the same picker sends them to the idle pod; each pick counts only when
  the picker's own scores for it (its debug log, `harness.epp.scores`) show what it saw.

Cost on this 2-core machine (real engines; `--durations`, 2026-12-07): the whole module
6.0-6.7 min in CI runs since engine pods start inside their core (`harness.vllm.affinity`;
8.6-12.4 min in the last quiet CI runs before, where a new pod's start could stall for
minutes), 10.5 min with one core kept busy by an unrelated process before that. Set-up
(operator, one engine pod) 40 s; adding and removing an adapter 2.6-3.5 min (two
rollouts, each a new engine start beside the old pod, then its drain); the bad adapters
about 2 min (two engine starts that fail); the picker test 1.3-1.5 min (one more engine pod,
two picker starts).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from harness.engine.cluster_pods import PROCESS_POD_TEMPLATE, ProcessKubelet
from harness.engine.pods import engine_resource
from harness.epp.binary import find_epp_binary, missing_reason
from harness.epp.extproc import DESTINATION_HEADER, REQUEST_ID_HEADER
from harness.epp.pool import PoolOnCluster
from harness.epp.rendered import Rendered, deep_merge, render_resource
from harness.epp.scores import DEBUG_LOG_ARG, scores_of
from harness.net import accepts_connections
from harness.operator import namespaced_operator, parse_prometheus, wait_for
from harness.pod import ProcessPod
from harness.pytest_cluster import Cluster
from harness.vllm.adapters import TinyAdapter, tiny_adapter
from harness.vllm.server import START_TIMEOUT_S
from harness.waiting import eventually
from promptcache.contract import DEFAULT_ISOLATION_HEADER, VLLM_LOCAL_PORT, PickerTarget
from promptcache.render.epp_config import KV_CACHE_SCORER, LORA_SCORER

pytestmark = [pytest.mark.cluster]

NAME = "alpha"
BASE = "base-a"
MOUNT = "/adapters"
KV_CACHE_BYTES = 8 << 20
SQL, CHAT, BIG = TinyAdapter(seed=1), TinyAdapter(seed=2), TinyAdapter(seed=3, rank=32)
ROLLOUT_TIMEOUT_S = START_TIMEOUT_S + 300
"""A new engine's start on a loaded 2-core machine, plus the old pod's drain."""


@dataclass
class Alpha:
    cluster: Cluster
    ns: str
    op: Any
    doc: dict[str, Any]
    kubelet: ProcessKubelet
    pool: PoolOnCluster
    folders: dict[str, Path]

    def adapters(self, *entries: dict[str, Any], engine: dict[str, Any] | None = None) -> None:
        """Set `model.adapters` (and `engine` fields) on the live resource."""
        patch: dict[str, Any] = {"spec": {"model": {"adapters": list(entries)}}}
        if engine is not None:
            patch["spec"]["engine"] = engine
        self.cluster.kubectl(
            "-n", self.ns, "patch", "pcd", NAME, "--type=merge", "-p", json.dumps(patch)
        )

    def status(self) -> dict[str, dict[str, Any]]:
        pcd = self.cluster.pcd_json(self.ns, NAME)
        return {a["name"]: a for a in (pcd.get("status") or {}).get("adapters") or []}

    def wait_adapters(
        self, want: dict[str, tuple[str, int]], what: str, *, pods_must_start: bool = False
    ) -> None:
        """Until status.adapters is exactly `want` (name -> (reason, readyReplicas)); a
        failure names the last status seen. With `pods_must_start`, a pod whose engine keeps
        failing ends the wait at once with the engine's own words (a first pod that cannot
        load its adapter would otherwise cost the whole rollout timeout: 20 min in one CI
        run, the status saying only `False`)."""

        def seen() -> dict[str, tuple[Any, Any]]:
            return {
                n: (a.get("reason"), a.get("readyReplicas", 0)) for n, a in self.status().items()
            }

        def engine_keeps_failing() -> str | None:
            for pod in list(self.kubelet.pods.values()):
                if (failing := pod.crash_looping()) is not None:
                    return failing
            return None

        wait_for(
            seen,
            f"{what}: status.adapters {want}",
            ROLLOUT_TIMEOUT_S,
            operator=self.op,
            until=lambda got: got == want,
            fail_if=engine_keeps_failing if pods_must_start else None,
        )

    def entry(self, name: str, folder: str | None = None, **extra: Any) -> dict[str, Any]:
        """An adapter named `name` on the folder made for `folder` (default: for `name`)."""
        return {"name": name, "path": f"{MOUNT}/{self.folders[folder or name].name}", **extra}


@pytest.fixture(scope="module")
def alpha(
    cluster: Cluster, engine_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Alpha]:
    if (
        find_epp_binary(PickerTarget.PROMPTCACHE) is None
    ):  # `e2e/cluster build` builds it: never skip
        pytest.fail(missing_reason(PickerTarget.PROMPTCACHE))
    workdir = tmp_path_factory.mktemp("adapters")
    folders = {
        "sql-lora": tiny_adapter(engine_model, SQL),
        "chat-lora": tiny_adapter(engine_model, CHAT),
        "big-lora": tiny_adapter(engine_model, BIG),
    }
    root = folders["sql-lora"].parent
    assert all(f.parent == root for f in folders.values())
    (root / "empty").mkdir(exist_ok=True)  # a directory that holds no adapter
    folders["empty"] = root / "empty"
    first = {"name": "sql-lora", "path": f"{MOUNT}/{folders['sql-lora'].name}"}
    with namespaced_operator(cluster, "adapters", workdir) as env:
        ns, op = env["ns"], env["op"]
        doc = engine_resource(engine_model, name=NAME, engine={"maxModelLen": 2048})
        doc["metadata"]["namespace"] = ns
        deep_merge(
            doc["spec"],
            {
                "model": {
                    "servedModelName": BASE,
                    "adapters": [first],
                    "podTemplate": {
                        **PROCESS_POD_TEMPLATE,
                        "spec": {
                            "volumes": [{"name": "adapters", "hostPath": {"path": str(root)}}],
                            "containers": [
                                {
                                    "name": "vllm",
                                    "volumeMounts": [
                                        {"name": "adapters", "mountPath": MOUNT, "readOnly": True}
                                    ],
                                }
                            ],
                        },
                    },
                }
            },
        )
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
        pool = PoolOnCluster(cluster, Rendered(render_resource(doc)), workdir / "pool")
        with ProcessKubelet(
            cluster,
            ns,
            pool.rendered.label_selector,
            workdir / "pods",
            kv_cache_bytes=KV_CACHE_BYTES,
        ) as kubelet:
            found = Alpha(cluster, ns, op, doc, kubelet, pool, folders)
            found.wait_adapters({"sql-lora": ("Served", 1)}, "the first pod", pods_must_start=True)
            pool.start_epp(wait_scraped=False)
            try:
                yield found
            finally:
                pool.stop_picker()


# --- the clients ----------------------------------------------------------------------------


@dataclass
class Outcome:
    model: str
    stream: bool
    endpoint: str
    started: float
    ended: float
    status: int
    whole: bool
    detail: str = ""


def _whole(stream: bool, raw: str) -> tuple[bool, str]:
    """Whether an answer is complete: a JSON body with a finish reason, or an event stream
    whose last choice has one and that ends with `[DONE]`."""
    if not stream:
        try:
            body = json.loads(raw)
        except ValueError:
            return False, raw[:200]
        choices = body.get("choices") or [{}]
        return choices[0].get("finish_reason") == "length", ""
    lines = [ln[6:] for ln in raw.splitlines() if ln.startswith("data: ")]
    if not lines or lines[-1].strip() != "[DONE]":
        return False, raw[-200:]
    finished = [
        c.get("finish_reason")
        for ev in lines[:-1]
        for c in (json.loads(ev).get("choices") or [])
        if c.get("finish_reason")
    ]
    return finished == ["length"], ""


PACE_S = 1.0
"""Each client's pause between two requests. Asking back to back, three clients and the
pinned streams kept the old pod's engine busy on both cores (its worker on one, its
scheduling loop on most of the other), and the new pod's engine, which must import and
start three Python processes beside it, took 8-9.5 min to start instead of 22 s (measured
2026-12-07: the roll's engine starts are what this module's time went to). A 40-token
answer takes about 0.1 s, so paced clients still have requests on the pods all along the
roll; what must be in flight as the old pod stops is the pinned streams' job. (The old
worker still holds its own core: the CPU build's worker spins for a second after each
step, so any steady traffic keeps it there; what pacing frees is the other core.)"""


class Traffic:
    """Clients that keep asking through the picker until stopped, each pausing `PACE_S`
    between requests, and what they got."""

    def __init__(self, pool: PoolOnCluster, models: list[str], clients: int = 3) -> None:
        self.pool, self.models, self.clients = pool, models, clients
        self.outcomes: list[Outcome] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def _pick(self, raw: bytes, headers: dict[str, str]) -> tuple[str, dict[str, str]] | str:
        """The pod the picker chose and the headers it set, or why it chose none (an
        outcome of its own: a client whose pick failed must record it and go on, not die
        and leave the test waiting for traffic that never comes)."""
        with self.pool.client() as picker:
            picked = picker.pick(raw, headers=headers, path="/v1/completions")
        if picked.immediate_status is not None or picked.endpoint is None:
            return f"the picker chose no pod: {picked}"
        extra = {
            k: v
            for k, v in picked.set_headers.items()
            if not k.startswith(":") and k not in ("content-length", DESTINATION_HEADER)
        }
        return picked.endpoint, extra

    async def request(
        self,
        http: aiohttp.ClientSession,
        model: str,
        stream: bool,
        key: str,
        *,
        endpoint: str | None = None,
        max_tokens: int = 40,
    ) -> None:
        """One request, to the pod the picker picks (or to `endpoint`), recorded."""
        body = {
            "model": model,
            "prompt": f"{key} request {len(self.outcomes)}: the adapters change while we talk",
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "stream": stream,
        }
        raw = json.dumps(body).encode()
        headers = {"content-type": "application/json", DEFAULT_ISOLATION_HEADER: key}
        started = time.monotonic()
        if endpoint is None:
            picked = await asyncio.to_thread(self._pick, raw, headers)
            if isinstance(picked, str):
                now = time.monotonic()
                self.outcomes.append(Outcome(model, stream, "", started, now, 0, False, picked))
                await asyncio.sleep(0.5)  # the picker's view of the pool changes in seconds
                return
            target, extra = picked
            headers.update(extra)
        else:
            target = endpoint
        try:
            async with http.post(
                f"http://{target}/v1/completions", data=raw, headers=headers
            ) as resp:
                text = await resp.text()
                whole, detail = _whole(stream, text) if resp.status == 200 else (False, text)
                status = resp.status
        except aiohttp.ClientError as error:
            status, whole, detail = 0, False, repr(error)
        self.outcomes.append(
            Outcome(model, stream, target, started, time.monotonic(), status, whole, detail)
        )

    async def _client(self, http: aiohttp.ClientSession, n: int) -> None:
        i = 0
        while not self._stop.is_set():
            model = self.models[(n + i) % len(self.models)]
            await self.request(http, model, (n + i) % 2 == 0, f"t{n}")
            i += 1
            await asyncio.sleep(PACE_S)

    async def pinned(
        self, http: aiohttp.ClientSession, alpha: Alpha, pod: str, endpoint: str
    ) -> None:
        """Long streams on one pod, one after another, until the kubelet begins to stop it:
        what a Gateway that picked the pod a moment ago sends. (The picker's own choices
        go to the idle new pod as soon as it is Ready; these make sure requests are in
        flight on the old one when it stops, on a fast machine too.) `_roll` starts them
        once the new pod's engine listens, not while it starts (see `PACE_S`)."""
        while pod not in alpha.kubelet.stopping:
            await self.request(http, BASE, True, "pinned", endpoint=endpoint, max_tokens=300)

    def start(self, http: aiohttp.ClientSession) -> None:
        self._tasks = [asyncio.create_task(self._client(http, n)) for n in range(self.clients)]

    async def stop(self) -> list[Outcome]:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        return self.outcomes

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status != 200 or not o.whole]


async def _wait(cond: Any, what: str, alpha: Alpha) -> None:
    """`wait_for` off the event loop, so the clients keep running."""
    await asyncio.to_thread(wait_for, cond, what, ROLLOUT_TIMEOUT_S, operator=alpha.op)


def _pod_endpoints(alpha: Alpha) -> dict[str, str]:
    return {name: f"{pod.ip}:{pod.ports['http']}" for name, pod in alpha.kubelet.pods.items()}


async def _new_engine_listens(alpha: Alpha, old: str, what: str) -> None:
    """Until the engine of a pod other than `old` accepts connections. The pod cannot be
    Ready before that: its engine's startup probe must pass first (every 10 s), then the
    front's readiness, then the Deployment controller must see the pod Ready and delete
    the old one, and the kubelet see the deletion (every 0.5 s): seconds in which the
    pinned streams start. A new pod whose engine keeps failing, or an old pod that stops
    first, ends the wait at once."""

    def new_pods() -> list[ProcessPod]:
        return [pod for name, pod in list(alpha.kubelet.pods.items()) if name != old]

    def listening() -> list[str]:  # a loopback connect: refused or accepted at once
        return [pod.name for pod in new_pods() if accepts_connections(pod.ip, VLLM_LOCAL_PORT)]

    def gone_wrong() -> str | None:
        if old in alpha.kubelet.stopping:
            return "the old pod began to stop first"
        return next(filter(None, (pod.crash_looping() for pod in new_pods())), None)

    await eventually(
        listening,
        f"{what}: a new pod's engine listens",
        within_s=ROLLOUT_TIMEOUT_S,
        fail_if=gone_wrong,
        detail=lambda: f"pods {list(alpha.kubelet.pods)}",
    )


async def _roll(
    alpha: Alpha, traffic: Traffic, http: aiohttp.ClientSession, change: Any, what: str
) -> tuple[str, float]:
    """Apply `change`, then wait until the old pod was replaced and has stopped; returns the
    old pod's endpoint and when its stop began (monotonic). The pinned streams on the old
    pod begin once the new pod's engine listens: begun with the change, they kept the old
    engine busy through the whole of the new one's start (see `PACE_S`)."""
    (old,) = alpha.kubelet.pods
    old_endpoint = _pod_endpoints(alpha)[old]
    change()
    await _new_engine_listens(alpha, old, what)
    pinned = asyncio.create_task(traffic.pinned(http, alpha, old, old_endpoint))
    await _wait(lambda: old in alpha.kubelet.terminated, f"{what}: the old pod stopped", alpha)
    await pinned
    (new,) = alpha.kubelet.pods
    assert alpha.kubelet.pods[new].ready
    return old_endpoint, alpha.kubelet.stopping[old]


async def test_adding_and_removing_an_adapter_drops_no_request(alpha: Alpha) -> None:
    assert alpha.status()["sql-lora"]["reason"] == "Served"
    traffic = Traffic(alpha.pool, [BASE, "sql-lora"])
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
        traffic.start(http)
        await _wait(lambda: len(traffic.outcomes) >= 6, "traffic before the change", alpha)

        # Add chat-lora: a new pod, the old one drained; the status read all along.
        seen: list[tuple[str, int]] = []

        def watch_chat() -> bool:
            entry = alpha.status().get("chat-lora")
            if entry is not None and (entry["reason"], entry.get("readyReplicas", 0)) not in seen:
                seen.append((entry["reason"], entry.get("readyReplicas", 0)))
            return entry is not None and entry["reason"] == "Served"

        watching = asyncio.create_task(_wait(watch_chat, "chat-lora Served", alpha))
        old, stopped_at = await _roll(
            alpha,
            traffic,
            http,
            lambda: alpha.adapters(alpha.entry("sql-lora"), alpha.entry("chat-lora")),
            "adding chat-lora",
        )
        stops = [(old, stopped_at)]
        await watching
        assert seen[0] == ("NotOnEveryPod", 0), seen
        assert seen[-1] == ("Served", 1), seen
        assert alpha.status()["chat-lora"]["readyReplicas"] == 1
        on_old = [o for o in traffic.outcomes if o.endpoint == old]
        assert any(o.started < stopped_at < o.ended for o in on_old), (
            "no request was in flight on the old pod as it was stopped: the test proved nothing"
        )
        traffic.models.append("chat-lora")
        count = len(traffic.outcomes)
        # Requests to chat-lora itself, not just any six: each client picks its model in
        # turn, and six answers (three of them asked before the append) once held none.
        await _wait(
            lambda: sum(o.model == "chat-lora" for o in traffic.outcomes[count:]) >= 2,
            "traffic with chat-lora",
            alpha,
        )

        # Remove it again: clients stop asking for it first, as they would.
        traffic.models.remove("chat-lora")
        await asyncio.sleep(2)
        stops.append(
            await _roll(
                alpha,
                traffic,
                http,
                lambda: alpha.adapters(alpha.entry("sql-lora")),
                "removing chat-lora",
            )
        )
        await _wait(lambda: "chat-lora" not in alpha.status(), "chat-lora gone from status", alpha)
        count = len(traffic.outcomes)
        await _wait(lambda: len(traffic.outcomes) >= count + 4, "traffic after removal", alpha)
        outcomes = await traffic.stop()
    assert not traffic.failures(), traffic.failures()[:5]
    in_flight = [
        sum(1 for o in outcomes if o.endpoint == endpoint and o.started < at < o.ended)
        for endpoint, at in stops
    ]
    print(
        f"\n{len(outcomes)} requests ({sum(o.stream for o in outcomes)} streamed), all whole; "
        f"in flight on the old pod as it stopped: {in_flight}; pod stops took "
        f"{[round(t, 1) for t in alpha.kubelet.terminated.values()]} s"
    )
    assert all(in_flight), f"a roll with no request in flight on the old pod: {in_flight}"
    assert {o.model for o in outcomes} >= {BASE, "sql-lora", "chat-lora"}
    assert {o.stream for o in outcomes} == {True, False}
    assert alpha.status() == {
        "sql-lora": {
            "name": "sql-lora",
            "readyReplicas": 1,
            "reason": "Served",
            "message": "served by 1 ready pod(s)",
        }
    }


async def test_a_bad_adapter_is_named_in_status_while_the_old_pod_serves(alpha: Alpha) -> None:
    """A path with no adapter, then a rank above the limit: the new pod's engine stops, the
    status names the adapter and why, and the old pod answers everything meanwhile."""
    traffic = Traffic(alpha.pool, [BASE, "sql-lora"], clients=2)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
        traffic.start(http)
        alpha.adapters(alpha.entry("sql-lora"), alpha.entry("gone", folder="empty"))
        await asyncio.to_thread(
            alpha.wait_adapters,
            {"sql-lora": ("Served", 1), "gone": ("AdapterNotFound", 0)},
            "a path without an adapter",
        )
        gone = alpha.status()["gone"]["message"]
        assert "No adapter found" in gone, gone
        assert "model.adapters[].path" in gone, gone

        alpha.adapters(
            alpha.entry("sql-lora", rank=8), alpha.entry("big-lora"), engine={"maxLoraRank": 8}
        )
        await asyncio.to_thread(
            alpha.wait_adapters,
            {"sql-lora": ("Served", 1), "big-lora": ("RankOverLimit", 0)},
            "a rank above the limit",
        )
        big = alpha.status()["big-lora"]["message"]
        assert "rank 32" in big, big
        assert "engine.maxLoraRank to at least 32" in big, big

        alpha.adapters(alpha.entry("sql-lora"), engine={"maxLoraRank": None})
        await asyncio.to_thread(alpha.wait_adapters, {"sql-lora": ("Served", 1)}, "reverted")
        outcomes = await traffic.stop()
    assert outcomes
    assert not traffic.failures(), traffic.failures()[:5]


async def _series(
    http: aiohttp.ClientSession, url: str, name: str
) -> list[tuple[dict[str, str], float]]:
    """The samples named `name` on the pod's `/metrics` now: (labels, value)."""
    async with http.get(url + "/metrics") as resp:
        samples = parse_prometheus(await resp.text())
    return [(dict(labels), value) for (n, labels), value in samples.items() if n == name]


async def _kv_tokens(http: aiohttp.ClientSession, url: str) -> int:
    """The pod's KV cache in tokens, as its engine reports it (`vllm:cache_config_info`)."""
    ((info, _),) = await _series(http, url, "vllm:cache_config_info")
    return int(info["num_gpu_blocks"]) * int(info["block_size"])


class _AdapterKeptRunning:
    """`sql-lora` kept running on one pod for as long as the block lasts: a chain of
    streams in which each one starts the next when a quarter of its tokens have come, so
    the next has three quarters of a stream's time to get its first token before the last
    one ends, however fast the engine decodes and however late the test's event loop wakes
    up. `running` counts the streams between their first token and their end: it never
    falls to 0 inside the block.

    What did not hold: a keeper that started a stream every second while fewer than three
    were unfinished (on a loaded machine its one-second sleeps took 2.2 s, longer than a
    whole stream), and three clients that each streamed one answer after another (the
    engine batched them into lockstep: they ended in the same step, and restarted together,
    leaving a gap with nothing running), and a chain that started the next stream halfway
    through (its first token came 2.4 s later on a loaded machine, after the last one
    ended).

    The streams together hold at most `KV_SHARE` of the pod's KV cache (at most `HANDOFF`
    at once, a quarter of a stream apart): the pod must be busier than the idle one (its
    KV use above 0), but not so busy that the load scorers outweigh affinity. GIE scores
    lora-affinity 1.0 where the adapter runs and 0.8 where it could be loaded,
    kv-cache-utilization 1 - use, and the queue 1 on the shorter queue and 0 on the longer
    (min-max over the pods). With the rendered weights (kv 2, queue 2) the load of the
    busy pod can take at most 2 x 0.25 + 2 = 2.5 from it (a new stream of the chain waits
    a step in its queue), so this test gives affinity a weight of 20 (a gap of 4). At a
    weight of 4 (a gap of 0.8), three streams of 1,500 tokens on an 8k cache took the
    busy pod's KV use above 0.4, and a pick went to the idle pod."""

    KV_SHARE = 0.25
    HANDOFF = 4  # the next stream starts when 1/HANDOFF of this one's tokens have come
    PROMPT_TOKENS = 64  # at most, for the prompt and its block
    PROMPT = "a long answer keeps this adapter running on one pod"

    def __init__(self, http: aiohttp.ClientSession, url: str, kv_tokens: int) -> None:
        self.http, self.url = http, url
        # In flight at once: streams at 0, 1/4, 2/4 and 3/4 of their tokens, 1.5 streams.
        budget = kv_tokens * self.KV_SHARE - self.HANDOFF * self.PROMPT_TOKENS
        self.max_tokens = int(budget * 2 / (self.HANDOFF - 1))
        assert self.max_tokens >= 200, f"a KV cache of {kv_tokens} tokens is too small"
        self.running = 0
        self.started = 0
        self.ended: list[str] = []  # how each finished stream ended, for a failure's message
        self._keeper: asyncio.Task[None] | None = None
        self._streams: set[asyncio.Task[bool]] = set()
        self.last_info: object = None

    async def __aenter__(self) -> _AdapterKeptRunning:
        self._keeper = asyncio.create_task(self._keep())
        deadline = time.monotonic() + 120
        while self.running == 0:  # the first stream's first token
            assert time.monotonic() < deadline, f"no stream started in 120 s: {self.ended}"
            refused = [e for e in self.ended if not e.startswith("whole")]
            assert not refused, f"the pod refused a stream of sql-lora: {refused}"
            await asyncio.sleep(0.05)
        return self

    async def __aexit__(self, *exc: object) -> None:
        tasks: list[asyncio.Task[Any]] = [*self._streams]
        if self._keeper is not None:
            tasks.append(self._keeper)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def no_proof(self) -> str:
        return (
            f"sql-lora not running on the engine at a pick: no proof ({self.started} streams"
            f" started of {self.max_tokens} tokens; the last ones ended: {self.ended[-6:]};"
            f" the engine's last lora_requests_info: {self.last_info})"
        )

    async def on_engine(self) -> bool:
        """Whether the engine itself says `sql-lora` runs now: its newest
        `vllm:lora_requests_info` series (vLLM sets each to the time it was last true). The
        picker reads the same series; what this test's client sees of its own streams lags
        when the machine starves the test's process, so the engine is asked."""
        infos = await _series(self.http, self.url, "vllm:lora_requests_info")
        if not infos:
            self.last_info = "none"
            return False
        newest, _ = max(infos, key=lambda info: info[1])
        self.last_info = newest
        return "sql-lora" in newest.get("running_lora_adapters", "").split(",")

    async def wait_on_engine(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not await self.on_engine():
            assert time.monotonic() < deadline, self.no_proof()
            await asyncio.sleep(0.05)

    async def _keep(self) -> None:
        while True:
            handoff = asyncio.Event()
            stream = asyncio.create_task(self._stream(handoff))
            self._streams.add(stream)
            stream.add_done_callback(self._streams.discard)
            waiter = asyncio.create_task(handoff.wait())
            try:
                await asyncio.wait({stream, waiter}, return_when=asyncio.FIRST_COMPLETED)
            finally:  # asyncio.wait leaves its tasks running when the keeper is cancelled
                waiter.cancel()
            if not handoff.is_set():
                await asyncio.sleep(0.5)  # refused or cut short: not retried at once

    async def _stream(self, handoff: asyncio.Event) -> bool:
        """One stream, which sets `handoff` when the next should start; whether it came
        whole."""
        body = {
            "model": "sql-lora",
            "prompt": self.PROMPT,
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
        }
        headers = {DEFAULT_ISOLATION_HEADER: "busy"}
        started, lines, counted = time.monotonic(), 0, False
        self.started += 1
        how = "cancelled"
        try:
            async with self.http.post(
                f"{self.url}/v1/completions", json=body, headers=headers
            ) as resp:
                if resp.status != 200:
                    how = f"{resp.status}: {(await resp.text())[:200]}"
                    return False
                async for _ in resp.content:  # an event and a blank line per token
                    lines += 1
                    if not counted:
                        self.running += 1
                        counted = True
                    if lines >= 2 * self.max_tokens / self.HANDOFF and not handoff.is_set():
                        handoff.set()
                        await asyncio.sleep(0)  # the keeper starts the next one now, not
                        # after a burst of buffered lines (a starved loop reads them at once)
                how = "whole"
        except Exception as exc:  # recorded for the failure's message
            how = repr(exc)
        finally:
            if counted:
                self.running -= 1
            self.ended.append(f"{how} after {lines} lines, {time.monotonic() - started:.1f} s")
        return how == "whole"


def _scored(pool: PoolOnCluster) -> bool:
    """The picker has fresh metrics of both pods, and read the busy pod's KV use while a
    stream ran there (the same scrape reads its running adapters): its scores now
    depend on the streams. Until then a pod it has not scraped scores like an idle one,
    and GIE breaks the tie at random (a 3 s sleep here once picked [idle, busy, ...])."""
    assert pool.epp is not None
    gauges = pool.epp.pool_gauges()
    return gauges.get("ready_pods") == 2 and gauges.get("average_kv_cache_utilization", 0) > 0


def _settled(alpha: Alpha, replicas: int) -> bool:
    """`replicas` ready pods of one ReplicaSet and no other pod: a rollout still under way
    (two ready pods, one of them about to be replaced) stops the stream a test keeps
    running on it (seen once: the picks then had no proof)."""
    pods = list(alpha.kubelet.pods.values())
    template_hashes = {pod.name.rsplit("-", 2)[1] for pod in pods}
    return len(pods) == replicas and all(p.ready for p in pods) and len(template_hashes) == 1


async def _pick(pool: PoolOnCluster, request_id: str) -> str | None:
    """The pod the picker picks for a `sql-lora` request, or None when it has no candidate
    at all: on an overloaded machine the kubelet's probes can time out and mark both pods
    not Ready for a moment (seen once in CI, at a load of 14 on 2 cores), and a picker
    without ready pods answers 503. That says nothing of where it sends the adapter."""
    raw = json.dumps({"model": "sql-lora", "prompt": f"which pod {request_id}?", "max_tokens": 1})
    headers = {
        "content-type": "application/json",
        DEFAULT_ISOLATION_HEADER: request_id,
        REQUEST_ID_HEADER: request_id,
    }

    def pick() -> str | None:
        with pool.client() as picker:
            picked = picker.pick(raw.encode(), headers=headers, path="/v1/completions")
        if picked.immediate_status == 503 and "endpoint candidates" in picked.immediate_body:
            return None
        assert picked.immediate_status is None, picked
        assert picked.endpoint is not None, picked
        return picked.endpoint

    return await asyncio.to_thread(pick)


async def _picker_scores(pool: PoolOnCluster, request_id: str) -> dict[str, dict[str, float]]:
    """What the picker scored for the request, per pod and scorer, from its debug log (the
    lines are written as it schedules, before it answers; a few tries cover the file's
    write reaching the reader on a starved machine)."""
    assert pool.epp is not None
    for _ in range(50):
        log = pool.epp.log()
        scores = scores_of(log, request_id)
        if len(scores) == 2:
            return scores
        await asyncio.sleep(0.1)
    lines = [ln for ln in log.splitlines() if request_id in ln and "Calculated score" in ln]
    raise AssertionError(
        f"the picker's scores of {request_id} name {len(scores)} pods: {lines[:3]}"
    )


@dataclass(frozen=True)
class _Premise:
    """What the picker must itself have seen at a pick for the pick to prove the claim."""

    scorer: str
    favours: str  # "busy" or "idle": the pod this scorer must score higher
    expect: str  # the pod the pick must then go to

    def holds(self, scores: dict[str, dict[str, float]], busy: str, idle: str) -> bool:
        pods = {"busy": busy, "idle": idle}
        other = idle if self.favours == "busy" else busy
        mine = scores.get(pods[self.favours], {}).get(self.scorer)
        theirs = scores.get(other, {}).get(self.scorer)
        return mine is not None and theirs is not None and mine > theirs


AFFINITY = _Premise(LORA_SCORER, favours="busy", expect="busy")
"""With affinity weighted: the picker saw `sql-lora` running on the busy pod (its
lora-affinity score there above the idle pod's), so the pick goes to the busy pod."""
NO_AFFINITY = _Premise(KV_CACHE_SCORER, favours="idle", expect="idle")
"""With affinity at weight 0: the picker saw the busy pod's KV use (its kv-cache score
below the idle pod's), so the load scorers send the pick to the idle pod."""


async def test_the_picker_sends_an_adapter_to_the_pod_that_runs_it(
    alpha: Alpha, record_testsuite_property: Callable[[str, object], None]
) -> None:
    """GIE's `lora-affinity-scorer` on `vllm:lora_requests_info`: with two pods and
    `sql-lora` running on one of them (a long stream sent there directly), the picker sends
    new `sql-lora` requests to that pod, although it is the busier one; with the scorer's
    weight at 0 the same picker sends them to the idle pod (the load scorers' choice). So
    the choice is the scorer's, read from the engine's metric.

    A pick counts only when the picker's own scores for it (its debug log) show the premise:
    GIE scores each pick from its last scrape of each pod, taken on its own schedule, so
    the engine saying `sql-lora` runs just before and after a pick did not prove the
    picker saw it at the pick (that check let a pick scored from a scrape between two
    streams of the chain count, and the picker then broke the tie at random: CI's
    "no affinity: the idle pod" failures). A pick the picker scored without the premise
    proves nothing either way and is not counted; more than a few of them fail the test.
    How many were not counted, at each weight, is kept in the run's JUnit XML (a suite
    property), so a CI run shows how near the limit it came, passed or not."""
    patch = {"spec": {"model": {"replicas": 2}, "prefixCache": {"weights": {"loraAffinity": 20}}}}
    alpha.cluster.kubectl(
        "-n", alpha.ns, "patch", "pcd", NAME, "--type=merge", "-p", json.dumps(patch)
    )
    await _wait(lambda: _settled(alpha, 2), "two ready pods of one ReplicaSet, no other", alpha)
    busy, idle = sorted(alpha.kubelet.ready(), key=lambda p: p.name)
    endpoints = {p.name: f"{p.ip}:{p.ports['http']}" for p in (busy, idle)}

    async def choices(weight: float, premise: _Premise) -> list[str]:
        doc = json.loads(json.dumps(alpha.doc))
        deep_merge(doc["spec"], patch["spec"])
        doc["spec"]["prefixCache"]["weights"]["loraAffinity"] = weight
        alpha.pool.start_epp(
            config_text=Rendered(render_resource(doc)).epp_config_text_with_salt_key(
                alpha.pool.salt_key_file
            ),
            extra_args=[DEBUG_LOG_ARG],
            wait_scraped=False,
        )
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
            kv_tokens = await _kv_tokens(http, busy.url())
            async with _AdapterKeptRunning(http, busy.url(), kv_tokens) as kept:
                await _wait(lambda: _scored(alpha.pool), "the picker scored the streams", alpha)
                picked: list[str] = []
                unproven: list[str] = []
                engine_only = 0
                while len(picked) < 6:
                    await kept.wait_on_engine()
                    await _wait(lambda: _settled(alpha, 2), "two ready pods again", alpha)
                    request_id = f"w{weight:g}-{len(picked) + len(unproven)}"
                    endpoint = await _pick(alpha.pool, request_id)
                    scores = (
                        {} if endpoint is None else await _picker_scores(alpha.pool, request_id)
                    )
                    if endpoint is None:
                        unproven.append("no ready pod")
                    elif not premise.holds(scores, busy.name, idle.name):
                        unproven.append(f"{endpoint}, picker's scores {scores}")
                        # What the engine-side check alone would have done with this pick.
                        engine_only += await kept.on_engine()
                    else:
                        expected = endpoints[busy.name if premise.expect == "busy" else idle.name]
                        assert endpoint == expected, (
                            f"pick {request_id} went to {endpoint}, not the {premise.expect} pod"
                            f" {expected}, although the picker scored {scores}"
                            f" (busy {busy.name}, idle {idle.name})"
                        )
                        picked.append(endpoint)
                    assert len(unproven) <= 12, (
                        f"the picker scored {len(unproven)} picks without its premise"
                        f" ({premise}): {unproven}; {kept.no_proof()}"
                    )
                    await asyncio.sleep(0.2)
        print(
            f"\nweight {weight:g}: 6 picks proven, {len(unproven)} not (the engine said the"
            f" adapter ran at {engine_only} of them): {unproven}"
        )
        record_testsuite_property(
            f"adapter picks at weight {weight:g}: not proven / of them the engine ran it",
            f"{len(unproven)} / {engine_only}",
        )
        return picked

    assert await choices(20, AFFINITY) == [endpoints[busy.name]] * 6, "affinity: where it runs"
    assert await choices(0, NO_AFFINITY) == [endpoints[idle.name]] * 6, "no affinity: idle pod"

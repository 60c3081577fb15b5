"""The hit-ratio ladder on real engines: three workloads, three diagnoses (issue 39).

On the local control plane the operator reconciles a resource whose model-server pod runs
as processes (`ProcessKubelet`: the real cache front before a real `vllm serve`), and
promptcache's own picker (`gateway.picker: promptcache`, the default) picks the pod of
every request over ext_proc, with the rendered config and the salt Secret the operator
made; each request then goes to the picked pod with exactly the headers the picker set
(the signed prediction among them). The operator scrapes the fronts and writes the ladder
into `status.cache`; what is checked is what `kubectl describe pcd` says:

* a chat workload that fits (8 conversations of 5 turns, each with its own 2000-character
  system prompt, on a pod with 64 MiB of KV cache, ~65k tokens against a working set of
  ~20k): the ladder is near flat and no loss is named;
* the same workload on a pod with 4 MiB of KV cache (128 blocks, ~4k tokens, the least
  vLLM takes for `maxModelLen` 4096): the conversations evict one another, and the
  capacity loss is named;
* a workload whose prompts share nothing (on the first pod, after the first workload has
  left the status window: the operator runs with `--status-window-seconds` 60): the
  workload is named, nothing to gain.

The roomy pool serves the first and the third workloads; the tight pool serves the second
in between, while the first leaves the roomy pool's status window (the third must not
find it there). The roomy engine idles meanwhile (about 1 % of a core: it does not spin
while it waits for work), so two engines run at once only while the tight one serves.

What the real engines gave (2026-12-06): fits — workload 71 %, capacity 71 %, routing
74 %, delivered 75 %, no loss named; tight — 71 %, 2 %, 0 %, 0 %, capacity named (69
points); nothing shared — 0 % everywhere, workload named.

Cost on this 2-core machine (real engines; `--durations`, 2026-12-06, at load 7-21 with
another real-engine run beside it): the whole module 10.5 min. Set-up of each pool (one
engine start, the picker) 1.8 min (roomy) and 4.3 min (tight, under load 21); the chat
workloads 20 s (roomy) and 70 s (tight: every prompt prefilled whole). In CI (2026-12-07)
3.7 min, of which 2 min waited for the window to empty before the unshared workload: the
tight pool's test now runs in that wait.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.engine.cluster_pods import PROCESS_POD_TEMPLATE, ProcessKubelet, salt_key_of
from harness.engine.pods import SERVED_NAME, engine_resource
from harness.epp.binary import find_epp_binary, missing_reason
from harness.epp.pool import PoolOnCluster
from harness.epp.rendered import Rendered, deep_merge, render_resource
from harness.extproc_gateway import envoy_applies
from harness.operator import (
    OperatorProcess,
    condition,
    namespaced_operator,
    wait_for,
)
from harness.pod import ProcessPod
from harness.pytest_cluster import Cluster
from harness.vllm.server import START_TIMEOUT_S
from promptcache.contract import DEFAULT_ISOLATION_HEADER, LadderCounter, PickerTarget

pytestmark = [pytest.mark.cluster]

WINDOW_S = 60
"""The operator's status window here: long enough to hold a whole workload (5-10 s quiet,
20-70 s on a loaded machine: one longer is judged on its last `WINDOW_S`, see
`settled_ladder`), short enough that the roomy pool's first workload has left it by the
time the tight pool's test, run in between, is done."""
RESYNC_S = 2
"""`namespaced_operator`'s resync period (the operator scrapes the pods at each)."""
ROOMY_KV_BYTES = 64 << 20
"""~65k tokens of the tiny model (1 KiB a token): the chat workload's ~20k fit."""
TIGHT_KV_BYTES = (4 << 20) + (32 << 10)
"""129 blocks of 32 tokens, ~4k tokens: what vLLM needs at least for one `maxModelLen`
request (128 blocks, and the block pool keeps one back: with 4 MiB it refuses to start)."""
MAX_MODEL_LEN = 4096
CONVERSATIONS, TURNS = 8, 5
SYSTEM_CHARS, TURN_CHARS = 2000, 300
"""The chat workload's shape: its working set (~20k tokens, about 1.6 characters a token
with the tiny model's tokenizer) is far below the roomy pod's KV cache and far above the
tight one's (and above what the picker's simulation of it holds, 128 blocks of 128
characters: GIE's blocks are 4 characters a token)."""
UNIQUE_PROMPTS, UNIQUE_CHARS = 12, 2400
ANSWER_TOKENS = 8
STATUS_TIMEOUT_S = WINDOW_S + 180
_WORDS = [
    *("the", "a", "of", "to", "and", "in", "cache", "prompt", "token", "model", "tenant"),
    *("block", "prefix", "chat", "engine", "pool", "pod", "picker", "window", "ladder"),
    *("route", "serve", "answer", "question", "system", "user", "memory", "capacity"),
]


def words(seed: int, chars: int) -> str:
    """`chars` characters of words, different for each seed (a deterministic generator: a
    run is the same workload each time)."""
    rng = random.Random(seed)
    out: list[str] = []
    length = 0
    while length < chars:
        word = rng.choice(_WORDS) + ("" if rng.random() < 0.7 else str(rng.randint(0, 99)))
        out.append(word)
        length += len(word) + 1
    return " ".join(out)[:chars]


@dataclass
class Served:
    """One pool on the cluster: its resource, its pod's processes and its picker."""

    cluster: Cluster
    ns: str
    name: str
    op: OperatorProcess
    pool: PoolOnCluster
    kubelet: ProcessKubelet

    @property
    def pod(self) -> ProcessPod:
        (pod,) = self.kubelet.ready()
        return pod

    def ask(self, messages: list[dict[str, str]], key: str) -> dict[str, Any]:
        """One chat request: the picker picks (ext_proc, as the gateway asks it), then the
        request goes to the picked pod with the headers the picker set. Returns the answer."""
        body = {
            "model": SERVED_NAME,
            "messages": messages,
            "max_tokens": ANSWER_TOKENS,
            "ignore_eos": True,
            "temperature": 0,
        }
        with self.pool.client() as picker:
            pick = picker.pick(body, headers={DEFAULT_ISOLATION_HEADER: key})
        assert pick.immediate_status is None, pick
        assert pick.endpoint is not None, pick
        skip = {"host", "content-length", "transfer-encoding"}
        headers = {
            k: v
            for k, v in envoy_applies(pick.sent_headers, pick.responses)
            if not k.startswith(":") and k not in skip
        }
        req = urllib.request.Request(
            f"http://{pick.endpoint}/v1/chat/completions",
            data=pick.body,
            headers=headers,
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=300) as resp:
            answer: dict[str, Any] = json.loads(resp.read())
        return answer

    def counters(self) -> dict[LadderCounter, float]:
        """The pod's front's ladder counters, summed over scope classes."""
        with urllib.request.urlopen(f"{self.pod.url()}/metrics", timeout=30) as resp:
            text = resp.read().decode()
        out = dict.fromkeys(LadderCounter, 0.0)
        for counter in LadderCounter:
            for m in re.finditer(rf"^{counter.value}_total(?:\{{[^}}]*\}})? (\S+)$", text, re.M):
                out[counter] += float(m[1])
        return out

    def cache_status(self) -> dict[str, Any] | None:
        pcd = self.cluster.pcd_json(self.ns, self.name) or {}
        cache = (pcd.get("status") or {}).get("cache")
        return dict(cache) if cache else None

    def settled_ladder(self, run: Run) -> dict[str, Any]:
        """`status.cache` once it holds every prompt token the front accounted during `run`
        and nothing else (the window holds the workload whole, and only it); or, for a
        workload that lasted longer than the window, once the window is full and was scraped
        after the workload's last answer (it then holds the workload's last `WINDOW_S`)."""
        accounted = round(run.accounted[LadderCounter.ACCOUNTED])
        deadline = time.monotonic() + STATUS_TIMEOUT_S
        cache = None
        while time.monotonic() < deadline:
            assert not self.op.exited(), f"the operator exited:\n{self.op.log_tail()}"
            cache = self.cache_status()
            if cache and cache.get("promptTokens") == accounted:
                return cache
            if (
                cache
                and time.monotonic() - run.ended > 3 * RESYNC_S
                and 0 < cache.get("promptTokens", 0) < accounted
                and cache.get("windowSeconds", 0) >= WINDOW_S - RESYNC_S
            ):
                print(f"{self.name}: the window holds the last {WINDOW_S} s of {run.seconds:.0f}")
                return cache
            time.sleep(1.0)
        raise AssertionError(
            f"{self.name}: no status.cache of the {accounted} prompt tokens the front accounted"
            f" in {run.seconds:.0f} s (last: {cache})\n{self.op.log_tail()}"
        )

    def described(self) -> str:
        out = self.cluster.kubectl("describe", "pcd", self.name, "-n", self.ns).stdout
        return re.sub(r"\s+", " ", str(out))

    def delivering(self) -> dict[str, Any] | None:
        return condition(self.cluster.pcd_json(self.ns, self.name), "CacheDelivering")


@dataclass(frozen=True)
class Run:
    """A workload played: what the pod's front accounted meanwhile, and when."""

    accounted: dict[LadderCounter, float]
    ended: float
    """`time.monotonic()` after the last answer."""
    seconds: float

    def shares(self) -> str:
        """The front's own ratios, for the record."""
        total = self.accounted[LadderCounter.ACCOUNTED] or 1.0
        ratios = ", ".join(f"{k.name.lower()} {v / total:.2f}" for k, v in self.accounted.items())
        return f"{total:.0f} prompt tokens in {self.seconds:.0f} s ({ratios})"


@dataclass
class Env:
    cluster: Cluster
    ns: str
    op: OperatorProcess
    model: Path
    workdir: Path


@pytest.fixture(scope="module")
def env(
    cluster: Cluster, engine_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Env]:
    if find_epp_binary(PickerTarget.PROMPTCACHE) is None:  # `e2e/cluster build` builds it
        pytest.fail(missing_reason(PickerTarget.PROMPTCACHE))
    workdir = tmp_path_factory.mktemp("ladder")
    extra = ["--status-window-seconds", str(WINDOW_S)]
    with namespaced_operator(cluster, "ladder-engine", workdir, extra_args=extra) as found:
        yield Env(cluster, found["ns"], found["op"], engine_model, workdir)


@pytest.fixture(scope="module")
def roomy(env: Env) -> Iterator[Served]:
    with serving(env, "roomy", ROOMY_KV_BYTES) as served:
        yield served


@pytest.fixture
def tight(env: Env) -> Iterator[Served]:
    with serving(env, "tight", TIGHT_KV_BYTES) as served:
        yield served


@contextlib.contextmanager
def serving(env: Env, name: str, kv_cache_bytes: int) -> Iterator[Served]:
    """A one-pod resource with `kv_cache_bytes` of KV cache, its pod Ready, its picker
    running and scraped; everything stopped and the resource deleted after."""
    doc = engine_resource(env.model, name=name, engine={"maxModelLen": MAX_MODEL_LEN})
    doc["metadata"]["namespace"] = env.ns
    deep_merge(doc["spec"], {"model": {"podTemplate": PROCESS_POD_TEMPLATE}})
    rendered = Rendered(render_resource(doc))
    assert rendered.picker is PickerTarget.PROMPTCACHE, "the default picker is ours"
    env.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
    pool = PoolOnCluster(env.cluster, rendered, env.workdir / name)
    try:
        with ProcessKubelet(
            env.cluster, env.ns, rendered.label_selector, env.workdir / f"{name}-pods",
            kv_cache_bytes=kv_cache_bytes,
        ) as kubelet:  # fmt: skip
            wait_for(
                lambda: len(kubelet.ready()) == 1,
                f"{name}'s engine pod Ready",
                START_TIMEOUT_S + 300,
                every=1.0,
                operator=env.op,
            )
            key = salt_key_of(env.cluster, rendered)
            assert key is not None, "the operator mounts a salt Secret for promptcache's picker"
            pool.salt_key_file.write_bytes(key)  # the fronts' key: the picker signs with it
            try:
                epp = pool.start_epp(wait_scraped=False)
                (pod,) = kubelet.ready()
                epp.wait_scraped({pod.name: 0.0})
                yield Served(env.cluster, env.ns, name, env.op, pool, kubelet)
            finally:
                pool.stop_picker()
    finally:
        env.cluster.kubectl("delete", "pcd", name, "-n", env.ns, "--wait=false", check=False)


# --- the workloads ----------------------------------------------------------------------------


def chat(served: Served, key: str) -> Run:
    """`CONVERSATIONS` conversations of `TURNS` turns, taking turns (a chat service's many
    users at once), each with its own system prompt and its history resent every turn, as
    chat clients do."""
    before, started = served.counters(), time.monotonic()
    history = [
        [{"role": "system", "content": words(1000 + c, SYSTEM_CHARS)}] for c in range(CONVERSATIONS)
    ]
    for turn in range(TURNS):
        for c, messages in enumerate(history):
            messages.append({"role": "user", "content": words(100 * c + turn, TURN_CHARS)})
            answer = served.ask(messages, key)
            reply = answer["choices"][0]["message"]["content"]
            messages.append({"role": "assistant", "content": reply})
    return played(served, before, started)


def nothing_shared(served: Served, key: str) -> Run:
    """`UNIQUE_PROMPTS` one-turn chats that share no prefix of a block's length."""
    before, started = served.counters(), time.monotonic()
    for n in range(UNIQUE_PROMPTS):
        served.ask([{"role": "user", "content": words(50_000 + n, UNIQUE_CHARS)}], key)
    return played(served, before, started)


def played(served: Served, before: dict[LadderCounter, float], started: float) -> Run:
    ended = time.monotonic()
    after = served.counters()
    return Run({k: after[k] - before[k] for k in LadderCounter}, ended, ended - started)


def gone_from_window(served: Served, run: Run) -> None:
    """Until the status window no longer holds anything of `run`: a window (and two
    scrapes) after its last answer, when `status.cache` is gone (too few prompt tokens to
    judge)."""
    wait_for(
        lambda: (
            time.monotonic() - run.ended > WINDOW_S + 2 * RESYNC_S and served.cache_status() is None
        ),
        f"{served.name}: the window emptied",
        STATUS_TIMEOUT_S,
        every=2.0,
        operator=served.op,
    )


# --- the diagnoses ----------------------------------------------------------------------------


def judged(served: Served, run: Run, label: str) -> tuple[dict[str, Any], str]:
    """`run`'s settled ladder (printed) and what `kubectl describe` says of it."""
    ladder = served.settled_ladder(run)
    print(f"{label}: status.cache {ladder}")
    return ladder, served.described()


FITS: list[Run] = []
"""The roomy pool's first workload, once it ran: the third must wait for it to leave the
status window."""


def test_a_chat_workload_that_fits_loses_nothing_worth_naming(roomy: Served) -> None:
    run = chat(roomy, "team-fits")
    FITS.append(run)
    print(f"\nfits: the front accounted {run.shares()}")
    estimated = run.accounted[LadderCounter.ESTIMATED]
    assert estimated == run.accounted[LadderCounter.ACCOUNTED], (
        "every request carried the picker's workload and capacity estimates"
    )
    ladder, text = judged(roomy, run, "fits")
    assert ladder["largestLoss"] == "None", text
    assert "no step loses more than 10 points" in text, text
    assert ladder["workload"] >= 0.5, ladder
    assert ladder["delivered"] >= 0.5, ladder
    cond = roomy.delivering()
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("True", "AsPredicted")


def test_the_same_chat_workload_on_a_small_kv_cache_names_capacity(tight: Served) -> None:
    run = chat(tight, "team-tight")
    print(f"\ntight: the front accounted {run.shares()}")
    assert run.accounted[LadderCounter.ESTIMATED] == run.accounted[LadderCounter.ACCOUNTED]
    ladder, text = judged(tight, run, "tight")
    assert ladder["largestLoss"] == "Capacity", text
    assert "the largest loss is capacity" in text, text
    assert "KV cache is too small for the working set" in text, text
    assert ladder["workload"] >= 0.5, ladder
    assert ladder["capacity"] <= ladder["workload"] - 0.3, ladder


def test_a_workload_that_shares_nothing_names_the_workload(roomy: Served) -> None:
    """On the roomy pool again, once the first workload has left its status window (the
    tight pool's test ran meanwhile)."""
    for earlier in FITS:  # its requests must have left the window
        gone_from_window(roomy, earlier)
    run = nothing_shared(roomy, "team-unique")
    print(f"\nnothing shared: the front accounted {run.shares()}")
    ladder, text = judged(roomy, run, "nothing shared")
    assert ladder["largestLoss"] == "Workload", text
    assert "the largest loss is workload" in text, text
    assert "little for any cache to gain" in text, text
    assert ladder["workload"] < 0.1, ladder
    assert ladder["delivered"] < 0.1, ladder

"""The gateway half on the real Endpoint Pickers (issues 8 and 16).

Each test renders an example through `promptcache render` for one picker target
(`spec.gateway.picker`), applies it to the local control plane (kwok gives the
model-server pods loopback IPs), binds a stand-in vLLM metrics server on every pod
IP (optionally behind the real cache front), runs the real EPP of that target with
the rendered config and args (only ports and file paths rewritten) as the rendered
ServiceAccount, and asks it where requests go over ext_proc, as the gateway does.

Every test runs on the upstream GIE EPP v1.5.0, which `e2e/cluster build` builds (its
absence fails, never skips), and on llm-d-router v0.10.0 where that binary exists;
tests of what only llm-d-router has (session plugins, strict decoding, the 64-token
floor) skip with the reason elsewhere. Sessions on promptcache's own picker, whose session
plugin reads the body too, are `e2e/test_epp_sessions.py` (never skipped). See
docs/endpoint-picker.md.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.epp.binary import find_epp_binary, missing_reason
from harness.epp.extproc import chat_body
from harness.epp.fake_pod import VllmMetrics
from harness.epp.launch import Launcher, routing_patch, shape_patch
from harness.epp.pool import PoolOnCluster
from harness.epp.rendered import example_files, load_example, render_resource
from harness.epp.scenarios import (
    handicap,
    index_grows,
    prefixed,
    settle_index,
    unique_text,
    wait_scrapes,
)
from harness.waiting import NotMet, wait_until
from promptcache.api.rules import GIE_SESSIONS_MESSAGE, GIE_TIERS_MESSAGE
from promptcache.contract import PROFILES, PickerTarget

pytestmark = [pytest.mark.epp, pytest.mark.cluster]

SHAPES = [pytest.param(False, id="vllm-only"), pytest.param(True, id="with-front")]
LLMD = PickerTarget.LLM_D_ROUTER
GIE = PickerTarget.GIE
needs_llmd = pytest.mark.skipif(find_epp_binary(LLMD) is None, reason=missing_reason(LLMD))
PICKERS = [pytest.param(GIE, id="gie"), pytest.param(LLMD, id="llmd", marks=needs_llmd)]


@pytest.fixture(params=PICKERS)
def picker(request: pytest.FixtureRequest) -> PickerTarget:
    target: PickerTarget = request.param
    if target is GIE and find_epp_binary(GIE) is None:
        pytest.fail(missing_reason(GIE))  # `e2e/cluster build` builds it: never a skip
    return target


@pytest.fixture
def launch(
    cluster: Any, namespace: str, tmp_path: Path, picker: PickerTarget
) -> Iterator[Launcher]:
    launcher = Launcher(cluster, namespace, tmp_path, picker)
    try:
        yield launcher
    finally:
        launcher.close()


@pytest.fixture
def llmd_launch(cluster: Any, namespace: str, tmp_path: Path) -> Iterator[Launcher]:
    """For what only llm-d-router has; skips with the reason where its binary is absent."""
    if find_epp_binary(LLMD) is None:
        pytest.skip(missing_reason(LLMD))
    launcher = Launcher(cluster, namespace, tmp_path, LLMD)
    try:
        yield launcher
    finally:
        launcher.close()


GIE_REFUSES = {"sessionAffinity": {"enabled": False}, "prefixCache": {"tiers": []}}
"""What an example must drop to run on GIE (the CLI refuses it otherwise, tested below)."""


def for_picker(picker: PickerTarget, patch: dict[str, Any]) -> dict[str, Any]:
    if picker is not GIE:
        return patch
    return {**patch, **{k: {**v, **patch.get(k, {})} for k, v in GIE_REFUSES.items()}}


def servers(pool: PoolOnCluster) -> list[Any]:
    return [p.server for p in pool.pods]


def pod_at(pool: PoolOnCluster, endpoint: str | None) -> Any:
    handle = pool.by_endpoint(endpoint)
    assert handle is not None, (
        f"EPP picked {endpoint!r}, not one of {[p.endpoint for p in pool.pods]}"
    )
    return handle


def indexed(pool: PoolOnCluster, by: int = 1) -> AbstractContextManager[None]:
    """Around a pick with a fresh prefix: until the picker's prefix index holds it (GIE
    pickers report the index's size). llm-d-router's index metric is unverified here (its
    binary cannot be built on this machine), so there it is still a fixed pause."""
    assert pool.epp is not None
    if PROFILES[pool.rendered.picker].gie_based:
        return index_grows(pool.epp, by)
    return _paused()


@contextmanager
def _paused() -> Iterator[None]:
    yield
    settle_index()


def log_records(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


# --------------------------------------------------------------------------- start-up


@pytest.mark.parametrize("with_front", SHAPES)
@pytest.mark.parametrize("example", example_files(), ids=lambda p: p.stem)
def test_epp_starts_on_every_generated_config(
    launch: Launcher, example: Path, with_front: bool, picker: PickerTarget
) -> None:
    pool = launch(example, spec_patch=for_picker(picker, shape_patch(with_front)))
    assert pool.epp is not None
    config = pool.rendered.epp_config
    records = log_records(pool.epp.log())

    effective = [r for r in records if "Effective raw configuration" in r.get("msg", "")]
    assert effective, f"no effective configuration logged:\n{pool.epp.log_tail()}"
    text = effective[0]["config"]
    for plugin in config["plugins"]:
        assert f"Type: {plugin['type']}" in text, f"{plugin['type']} missing from {text}"

    # Each producer logs the configuration it really runs with: the rendered values.
    producers = [p for p in config["plugins"] if p["type"] == "approx-prefix-cache-producer"]
    initialized_msg = {
        LLMD: "Prefix DataProducer initialized",
        GIE: "Prefix PrepareData initialized",
    }[picker]
    initialized = [r["config"] for r in records if r.get("msg") == initialized_msg]
    assert len(initialized) == len(producers), pool.epp.log_tail()
    for p in producers:
        assert any(all(cfg[k] == v for k, v in p["parameters"].items()) for cfg in initialized), (
            p,
            initialized,
        )

    if picker is LLMD:
        # The scheduler got every scorer with its rendered weight.
        parsed = next(r["scheduler-config"] for r in records if r.get("msg") == "parsed config")
        types = {p.get("name", p["type"]): p["type"] for p in config["plugins"]}
        for ref in config["schedulingProfiles"][0]["plugins"]:
            if ref.get("weight") is not None:
                name = ref["pluginRef"]
                assert f"{name}/{types[name]}: {float(ref['weight']):.6f}" in parsed, parsed
    else:
        # GIE logs the effective profiles: every scorer with its rendered weight.
        for ref in config["schedulingProfiles"][0]["plugins"]:
            if ref.get("weight") is not None:
                entry = f"{{PluginRef: {ref['pluginRef']}, Weight: {float(ref['weight']):.2f}}}"
                assert entry in text, (entry, text)
    # It found the pool's pods through the InferencePool (with the rendered RBAC) and
    # scraped their metrics, through the front when there is one.
    assert len(pool.pods) == pool.rendered.replicas
    pool.wait_scraped()


@pytest.mark.parametrize("example", example_files(), ids=lambda p: p.stem)
def test_gie_refuses_what_it_cannot_honour_in_the_cli(example: Path) -> None:
    """Tiers and sessions on GIE: `promptcache render` names the field and the target."""
    doc = load_example(example, spec_patch={"gateway": {"picker": GIE.value}})
    spec = doc["spec"]
    refused = []
    if spec.get("prefixCache", {}).get("tiers"):
        refused.append(GIE_TIERS_MESSAGE)
    if spec.get("sessionAffinity", {}).get("enabled"):
        refused.append(GIE_SESSIONS_MESSAGE)
    if not refused:
        render_resource(doc)  # renders cleanly
        return
    with pytest.raises(RuntimeError) as failed:
        render_resource(doc)
    for message in refused:
        assert message in str(failed.value)


def test_wrongly_typed_parameter_makes_epp_exit_nonzero(launch: Launcher) -> None:
    """A broken config stops either picker at start-up (GIE decodes leniently, so a typo
    would pass there; a wrong type does not)."""
    pool = launch(spec_patch=routing_patch(replicas=1), start_epp=False)
    config = pool.rendered.epp_config
    producer = next(p for p in config["plugins"] if p["type"] == "approx-prefix-cache-producer")
    producer["parameters"]["blockSizeTokens"] = "sixty-four"
    with pytest.raises(NotMet, match=r"EPP exited with [1-9]"):
        pool.start_epp(config_text=yaml.safe_dump(config))
    assert pool.epp is not None
    assert pool.epp.returncode not in (None, 0)
    assert "blockSizeTokens" in pool.epp.log(), pool.epp.log_tail()


def test_unknown_parameter_makes_epp_exit_nonzero(llmd_launch: Launcher) -> None:
    """Proof the start-up test would catch a generator mistake (llm-d-router decodes strictly)."""
    pool = llmd_launch(spec_patch=routing_patch(replicas=1), start_epp=False)
    config = pool.rendered.epp_config
    producer = next(p for p in config["plugins"] if p["type"] == "approx-prefix-cache-producer")
    producer["parameters"]["blockSizeToken"] = 64  # a typo of blockSizeTokens
    with pytest.raises(NotMet, match=r"EPP exited with [1-9]"):
        pool.start_epp(config_text=yaml.safe_dump(config))
    assert pool.epp is not None
    assert pool.epp.returncode not in (None, 0)
    errors = [r.get("error", "") for r in log_records(pool.epp.log())]
    assert any(
        "failed to create plugin" in e and 'unknown field "blockSizeToken"' in e for e in errors
    ), pool.epp.log_tail()


def test_session_plugin_needs_the_experimental_flag(llmd_launch: Launcher) -> None:
    """Session affinity is Alpha upstream: the renderer must pass --allow-experimental-plugins."""
    pool = llmd_launch(spec_patch=routing_patch(replicas=1, session=True), start_epp=False)
    flag = "--allow-experimental-plugins"
    assert flag in pool.rendered.epp_args
    without = [a for a in pool.rendered.epp_args if a != flag]
    with pytest.raises(NotMet, match=r"EPP exited with [1-9]"):
        pool.start_epp(rendered_args=without)
    assert pool.epp is not None
    assert "has Alpha stability level" in pool.epp.log()


def test_the_epp_really_runs_as_the_rendered_service_account(
    launch: Launcher, cluster: Any
) -> None:
    """Without the Role's pods rule the EPP never gets ready: the RBAC proof is not vacuous.
    It is not ready at first, says the API server refused it the pods, and is still not
    ready after that (a 20 s wait for readiness that never came proved the same with less
    to show, and cost 20 s)."""
    pool = launch(spec_patch=routing_patch(replicas=1), start_epp=False)
    (role,) = pool.rendered.of_kind("Role")
    crippled = json.loads(json.dumps(role))
    crippled["rules"] = [r for r in crippled["rules"] if "pods" not in r["resources"]]
    cluster.kubectl("apply", "-n", pool.rendered.namespace, "-f", "-", input=json.dumps(crippled))
    with pytest.raises(NotMet, match="the EPP serving health and ext_proc: not met within"):
        pool.start_epp(ready_timeout_s=3)
    epp = pool.epp
    assert epp is not None
    who = f"system:serviceaccount:{pool.rendered.namespace}:{pool.rendered.service_account}"
    refused = f'User "{who}" cannot list resource "pods"'
    wait_until(
        lambda: epp.log().replace('\\"', '"'),
        "the picker's log saying it may not list the pods",
        within_s=60,
        until=lambda text: refused in text,
        fail_if=lambda: None if epp.returncode is None else f"it exited with {epp.returncode}",
        detail=epp.log_tail,
    )
    assert not epp.healthy(), "its health says SERVING without the pods it routes to"


def test_two_replicas_elect_a_leader_with_the_rendered_rbac(
    launch: Launcher, cluster: Any, picker: PickerTarget
) -> None:
    """gateway.replicas > 1 renders leader election; the rendered Role must allow the lease."""
    patch = {**routing_patch(replicas=1), "gateway": {"replicas": 2}}
    pool = launch(spec_patch=patch)
    assert "--ha-enable-leader-election" in pool.rendered.epp_args
    assert pool.epp is not None
    suffix = {LLMD: "llm-d.ai", GIE: "gateway-api-inference-extension.sigs.k8s.io"}[picker]
    lease = f"epp-{pool.rendered.namespace}-{pool.rendered.pool_name}.{suffix}"
    spec = cluster.get_json("lease", "-n", pool.rendered.namespace, lease)["spec"]
    assert spec.get("holderIdentity"), "the lease has no holder"
    with pool.epp.client() as client:
        assert client.pick(chat_body(unique_text(300))).endpoint == pool.pods[0].endpoint


# --------------------------------------------------------------------------- prefix affinity


@pytest.mark.parametrize("with_front", SHAPES)
def test_shared_prefix_follows_the_pod_that_served_it(launch: Launcher, with_front: bool) -> None:
    pool = launch(spec_patch=routing_patch(with_front=with_front))
    prefix = unique_text(2000)  # ~500 tokens: 7+ blocks of 64 under the estimate tokenizer
    with pool.epp.client() as client:  # type: ignore[union-attr]
        with indexed(pool):
            first = pod_at(pool, client.pick(chat_body(prefixed(prefix))).endpoint)
        # The pod holding the prefix is now slightly worse by load; the prefix must win.
        handicap(servers(pool), first.server)
        follow = [client.pick(chat_body(prefixed(prefix))).endpoint for _ in range(8)]
        assert follow == [first.endpoint] * 8

        # Unrelated prompts go where load says: away from the handicapped pod,
        # and to whichever pod is idle when the others queue.
        unrelated = Counter(client.pick(chat_body(unique_text(1500))).endpoint for _ in range(12))
        assert first.endpoint not in unrelated
        idle = next(p for p in pool.pods if p is not first)
        for p in pool.pods:
            p.set(waiting=0 if p is idle else 4, kv_cache_usage=0.0)
        wait_scrapes(servers(pool))
        picks = {client.pick(chat_body(unique_text(1500))).endpoint for _ in range(8)}
        assert picks == {idle.endpoint}


def test_different_cache_salts_do_not_attract(launch: Launcher) -> None:
    pool = launch(spec_patch=routing_patch())
    prompt_prefix = unique_text(2000)
    with pool.epp.client() as client:  # type: ignore[union-attr]
        with indexed(pool):
            first = pod_at(
                pool,
                client.pick(chat_body(prefixed(prompt_prefix), cache_salt="tenant-a")).endpoint,
            )
        handicap(servers(pool), first.server)
        same = [
            client.pick(chat_body(prefixed(prompt_prefix), cache_salt="tenant-a")).endpoint
            for _ in range(5)
        ]
        other = [
            client.pick(chat_body(prefixed(prompt_prefix), cache_salt="tenant-b")).endpoint
            for _ in range(5)
        ]
        unsalted = [client.pick(chat_body(prefixed(prompt_prefix))).endpoint for _ in range(5)]
    assert same == [first.endpoint] * 5
    assert first.endpoint not in other, "tenant-b was drawn to tenant-a's prefix"
    assert first.endpoint not in unsalted, "an unsalted request was drawn to tenant-a's prefix"


# --------------------------------------------------------------------------- autoTune


def _attracts(pool: PoolOnCluster, common_bytes: int) -> bool:
    """Whether a prompt sharing `common_bytes` (role included) with a served one follows it."""
    shared = unique_text(common_bytes - len("user"))
    with pool.epp.client() as client:  # type: ignore[union-attr]
        for p in pool.pods:
            p.set(kv_cache_usage=0.0, waiting=0)
        wait_scrapes(servers(pool))
        with indexed(pool):
            first = pod_at(pool, client.pick(chat_body(shared + "A" * 1200)).endpoint)
        handicap(servers(pool), first.server)
        picks = [client.pick(chat_body(shared + c * 1200)).endpoint for c in "BCD"]
    assert len(set(picks)) == 1 or first.endpoint not in picks, picks
    return picks == [first.endpoint] * 3


def test_autotune_block_size_follows_cache_config_info(
    launch: Launcher, picker: PickerTarget
) -> None:
    # vLLM's default block size 16 is reported: llm-d-router floors it at 64, GIE uses 16.
    pool = launch(spec_patch=routing_patch(), metrics=lambda i: VllmMetrics(block_size=16))
    # 200 shared bytes = 50 tokens: 3 blocks of 16, but no whole block of 64.
    if picker is LLMD:
        assert not _attracts(pool, 200), "matched at 16-token blocks: the 64-token floor failed"
    else:
        assert _attracts(pool, 200), "GIE did not use the pods' 16-token blocks"
    # 600 shared bytes = 150 tokens: two whole 64-token blocks.
    assert _attracts(pool, 600)

    # The pods now report 256-token blocks: 150 shared tokens no longer fill one block.
    for s in servers(pool):
        s.set(block_size=256)
    wait_scrapes(servers(pool))
    assert not _attracts(pool, 600), "block size did not follow vllm:cache_config_info"
    assert _attracts(pool, 2400)  # 600 tokens: two whole 256-token blocks
    config = pool.rendered.epp_config
    producer = next(p for p in config["plugins"] if p["type"] == "approx-prefix-cache-producer")
    assert producer["parameters"]["autoTune"] is True


def test_autotune_capacity_follows_num_gpu_blocks(launch: Launcher, picker: PickerTarget) -> None:
    """A pod reporting 4 GPU blocks is indexed with 4 entries: older prefixes fall out."""
    # Two 64-token blocks per prompt: llm-d-router counts the role's bytes, GIE hashes the
    # JSON of the messages (about 30 bytes of it before the text).
    size = {LLMD: 480, GIE: 560}[picker]

    def remembered(pool: PoolOnCluster, capacity: int) -> bool:
        target = pool.pods[0]
        with pool.epp.client() as client:  # type: ignore[union-attr]
            for p in pool.pods:
                p.set(waiting=0 if p is target else 10, kv_cache_usage=0.0)
            wait_scrapes(servers(pool))
            first = unique_text(size)  # 2 blocks of 64 tokens
            with indexed(pool, by=2):
                assert client.pick(chat_body(first)).endpoint == target.endpoint
            for held in (2, 4, 6):  # 6 more blocks on the same pod
                if held < capacity:
                    with indexed(pool, by=2):
                        assert client.pick(chat_body(unique_text(size))).endpoint == target.endpoint
                else:
                    # At its capacity the pod's index evicts as much as it adds: its size,
                    # the one thing the picker shows of it, stays put. Nothing to wait on.
                    assert client.pick(chat_body(unique_text(size))).endpoint == target.endpoint
                    settle_index(0.25)
            handicap(servers(pool), target.server)
            return client.pick(chat_body(first + "x" * 300)).endpoint == target.endpoint

    # 64-token blocks on both pickers (GIE has no floor), so a 480-byte prompt is 2 blocks:
    # smaller than the pod's LRU (a request bigger than it is kept by an upstream quirk).
    pool = launch(
        spec_patch=routing_patch(),
        metrics=lambda i: VllmMetrics(num_gpu_blocks=4, block_size=64),
    )
    assert not remembered(pool, capacity=4), "a 4-block pod still remembered 8 blocks back"
    for s in servers(pool):
        s.set(num_gpu_blocks=5000)
    wait_scrapes(servers(pool))
    pool.start_epp()  # capacity is fixed when a pod is first indexed: fresh process
    assert remembered(pool, capacity=5000), "a 5000-block pod forgot a prefix 8 blocks back"


# --------------------------------------------------------------------------- session affinity


def test_session_header_sticks_even_when_load_says_otherwise(llmd_launch: Launcher) -> None:
    pool = llmd_launch(spec_patch=routing_patch(session=True))
    header = pool.rendered.epp_config["plugins"]
    session = next(p for p in header if p["type"] == "session-affinity-filter")
    name = session["parameters"]["sessionIdConfig"]["sources"][0]["header"]
    with pool.epp.client() as client:  # type: ignore[union-attr]
        bound = {}
        for sid in ("alice", "bob", "carol"):
            bound[sid] = pod_at(
                pool, client.pick(chat_body(unique_text(300)), headers={name: sid}).endpoint
            )
        settle_index()
        for handle in bound.values():  # every bound pod is now the worst choice by load
            handle.set(waiting=20, kv_cache_usage=0.95)
        wait_scrapes(servers(pool))
        for sid, handle in bound.items():
            picks = {
                client.pick(chat_body(unique_text(300)), headers={name: sid}).endpoint
                for _ in range(4)
            }
            assert picks == {handle.endpoint}, (sid, picks)
        # Without the header, load decides.
        loaded = {h.endpoint for h in bound.values()}
        free = [client.pick(chat_body(unique_text(300))).endpoint for _ in range(6)]
        if len(loaded) < len(pool.pods):
            assert not loaded & set(free), free


def test_user_field_reaches_the_epp_through_the_policy_step(llmd_launch: Launcher) -> None:
    """spec/004: a `user` body field names the session as well as the header does.

    The EPP reads headers only, and the cache front sees the request after the pick, so
    the rendered EPP pod puts the gateway's policy step (`promptcache gateway-policy`) on
    the port the gateway dials. Here both run as rendered: the EPP with its rendered args
    (its `--grpc-port` moved off the Service's port, plain gRPC), the step with the
    rendered container's args and env, relaying to the EPP (see
    PoolOnCluster.start_gateway_policy)."""
    pool = llmd_launch(spec_patch=routing_patch(session=True))
    assert pool.epp is not None
    gateway_policy_container = pool.rendered.gateway_policy_container
    assert gateway_policy_container is not None, "sessionAffinity renders the policy step"
    assert pool.rendered.epp_grpc_port != 9002  # the Service's port belongs to the shim
    session = next(
        p for p in pool.rendered.epp_config["plugins"] if p["type"] == "session-affinity-filter"
    )
    header = session["parameters"]["sessionIdConfig"]["sources"][0]["header"]
    shim = pool.start_gateway_policy()
    with shim.client() as gateway, pool.epp.client() as direct:
        answer = gateway.pick(chat_body(unique_text(300), user="alice"))
        home = pod_at(pool, answer.endpoint)
        # The pod is told the session too (the EPP echoes the headers it saw).
        assert answer.set_headers.get(header) == "alice"
        settle_index()
        home.set(waiting=20, kv_cache_usage=0.95)
        wait_scrapes(servers(pool))
        via_shim = {
            gateway.pick(chat_body(unique_text(300), user="alice")).endpoint for _ in range(5)
        }
        assert via_shim == {home.endpoint}
        # Straight to the EPP, `user` alone is invisible: load moves the request away.
        direct_picks = {
            direct.pick(chat_body(unique_text(300), user="alice")).endpoint for _ in range(5)
        }
        assert home.endpoint not in direct_picks
        # An explicit header wins over `user`.
        explicit = gateway.pick(chat_body(unique_text(300), user="alice"), headers={header: "bob"})
        assert explicit.set_headers.get(header) == "bob"
        assert explicit.endpoint != home.endpoint
        # prompt_cache_key (OpenAI's cache-routing hint) names the session before `user`.
        keyed = gateway.pick(
            chat_body(unique_text(300), user="bob") | {"prompt_cache_key": "alice"}
        )
        assert keyed.set_headers.get(header) == "alice"
        assert keyed.endpoint == home.endpoint
        # A `user` the front would refuse is refused at the gateway with its error.
        hostile = gateway.pick(chat_body(unique_text(300), user="alice\r\nx-evil: 1"))
        assert hostile.immediate_status == 400
        assert hostile.endpoint is None
    assert shim.stop() == 0, shim.log()
    assert "gateway policy step stopped" in shim.log()


def test_without_user_field_the_step_ignores_user(llmd_launch: Launcher) -> None:
    """`useUserField: false`: `user` names no session (prompt_cache_key still does)."""
    patch = routing_patch(replicas=2, session=True)
    patch["sessionAffinity"]["useUserField"] = False
    pool = llmd_launch(spec_patch=patch)
    assert pool.shim is not None
    with pool.client() as gateway:
        pick = gateway.pick(chat_body(unique_text(300), user="alice"))
        pod_at(pool, pick.endpoint)
        assert "x-session-affinity" not in pick.set_headers


# --------------------------------------------------------------------------- load


@pytest.mark.parametrize("with_front", SHAPES)
def test_long_queue_or_full_kv_cache_loses_new_requests(launch: Launcher, with_front: bool) -> None:
    pool = launch(spec_patch=routing_patch(with_front=with_front))
    queued, full = pool.pods[0], pool.pods[1]
    queued.set(waiting=50)
    full.set(kv_cache_usage=1.0)
    wait_scrapes(servers(pool))
    with pool.epp.client() as client:  # type: ignore[union-attr]
        picks = Counter(client.pick(chat_body(unique_text(1200))).endpoint for _ in range(24))
    assert queued.endpoint not in picks, picks
    assert full.endpoint not in picks, picks
    assert set(picks) <= {p.endpoint for p in pool.pods[2:]}


def test_endpoint_names_are_pods_of_the_pool(launch: Launcher) -> None:
    """The EPP reports one endpoint per Ready pod of the InferencePool (rank 0 per target port)."""
    pool = launch(spec_patch=routing_patch())
    names = set(pool.epp.queue_sizes())  # type: ignore[union-attr]
    assert {re.sub(r"-rank-\d+$", "", n) for n in names} == {p.name for p in pool.pods}


def test_the_rendered_tls_picker_serves_concurrent_picks(launch: Launcher) -> None:
    """Alone on its port the picker serves TLS as rendered; picks from many threads at once,
    each a new stream on one connection through the gateway's TLS side (the relay), all
    route. The picker opens this port only after health is up (it makes its key first):
    `wait_ready` waits for it, else the first picks fail with `Socket closed`."""
    pool = launch(spec_patch=routing_patch())
    epp = pool.epp
    assert epp is not None
    assert "--secure-serving=false" not in pool.rendered.epp_args
    assert epp.secure
    endpoints = {p.endpoint for p in pool.pods}
    with epp.client() as client, ThreadPoolExecutor(16) as threads:
        picks = list(
            threads.map(lambda i: client.pick(chat_body(unique_text(400 + i))).endpoint, range(96))
        )
    assert len(picks) == 96
    assert set(picks) <= endpoints

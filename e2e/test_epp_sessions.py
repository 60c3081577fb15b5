"""Session affinity on promptcache's own picker (`gateway.picker: promptcache`, issue 42).

Each test renders a resource with `sessionAffinity` on for our picker, applies it to the
local control plane (kwok gives the model-server pods loopback IPs), binds a stand-in vLLM
on every pod IP, runs our picker binary with the rendered config and args as the rendered
ServiceAccount, and asks it where requests go over ext_proc, as the gateway does. No policy
step runs in front of it: the picker's own session plugin (`picker/plugins/sessionaffinity`)
reads the header, `prompt_cache_key` and `user` itself.

Load steers the picks here: a pod reported with a long queue and a full KV cache is the
last the scorers choose, so a request that still goes there went by its session's pin.
Every prompt is unique, so no prefix draws a request anywhere, and a pick's pin is stored
before the picker answers (the plugin's PreRequest hook runs in GIE's request path before
the response, v1.5.0 `requestcontrol/director.go` `prepareRequest`): the next request
needs no pause to see it. The llm-d-router session
tests (`e2e/test_epp.py`) skip where its binary is absent; these run on our build always.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.epp.binary import find_epp_binary, missing_reason
from harness.epp.extproc import ExtProcClient, chat_body
from harness.epp.launch import Launcher, routing_patch
from harness.epp.pool import PodHandle, PoolOnCluster
from harness.epp.scenarios import unique_text, wait_scrapes
from harness.waiting import wait_until
from promptcache.contract import SESSION_AFFINITY_PLUGIN, PickerTarget, SessionParam

pytestmark = [pytest.mark.epp, pytest.mark.cluster]

OURS = PickerTarget.PROMPTCACHE
BUSY = {"waiting": 20, "kv_cache_usage": 0.95}
IDLE = {"waiting": 0, "kv_cache_usage": 0.0}


@pytest.fixture
def launch(cluster: Any, namespace: str, tmp_path: Path) -> Iterator[Launcher]:
    if find_epp_binary(OURS) is None:
        pytest.fail(missing_reason(OURS))  # `e2e/cluster build` builds it: never a skip
    launcher = Launcher(cluster, namespace, tmp_path, OURS)
    try:
        yield launcher
    finally:
        launcher.close()


def sessions_patch(replicas: int = 4, **session: Any) -> dict[str, Any]:
    patch = routing_patch(replicas=replicas, session=True)
    patch["sessionAffinity"].update(session)
    return patch


def header_of(pool: PoolOnCluster) -> str:
    (plugin,) = [
        p for p in pool.rendered.epp_config["plugins"] if p["type"] == SESSION_AFFINITY_PLUGIN
    ]
    header: str = plugin["parameters"][SessionParam.HEADER]
    return header


def pod_at(pool: PoolOnCluster, endpoint: str | None) -> PodHandle:
    handle = pool.by_endpoint(endpoint)
    assert handle is not None, f"picked {endpoint!r}, not one of {[p.endpoint for p in pool.pods]}"
    return handle


def load(pool: PoolOnCluster, busy: list[PodHandle], live: list[PodHandle] | None = None) -> None:
    """Report `busy` as the worst pods by load and the rest as idle; wait until the picker
    has scraped every pod still in the pool (`live`, by default all)."""
    for p in pool.pods:
        p.set(**(BUSY if p in busy else IDLE))
    wait_scrapes([p.server for p in (pool.pods if live is None else live)])


def pick(client: ExtProcClient, header: str, sid: str | None = None, **body: Any) -> str | None:
    """One request of session `sid` (by header when given, else by the body fields)."""
    request = chat_body(unique_text(300)) | body
    return client.pick(request, headers={header: sid} if sid else None).endpoint


def spread(
    pool: PoolOnCluster, client: ExtProcClient, header: str, sids: list[str]
) -> dict[str, PodHandle]:
    """Place each session on its own pod: after each first request its pod turns busy, so
    the scorers send the next new session elsewhere. Returns session -> pod."""
    placed: dict[str, PodHandle] = {}
    for sid in sids:
        load(pool, list(placed.values()))
        placed[sid] = pod_at(pool, pick(client, header, sid))
    assert len({h.name for h in placed.values()}) == len(sids), placed
    return placed


def test_a_session_stays_on_its_pod_and_another_lands_elsewhere(launch: Launcher) -> None:
    pool = launch(spec_patch=sessions_patch())
    header = header_of(pool)
    assert pool.shim is None, "no policy step in front of our picker"
    assert pool.epp is not None
    with pool.epp.client() as client:
        home = pod_at(pool, pick(client, header, "alice"))
        load(pool, [home])  # alice's pod is now the worst choice by load
        picks = {pick(client, header, "alice") for _ in range(20)}
        assert picks == {home.endpoint}, picks
        # A new session is placed by load: anywhere but alice's busy pod.
        bob = pod_at(pool, pick(client, header, "bob"))
        assert bob.endpoint != home.endpoint
        # The body names sessions too, read by the picker itself: prompt_cache_key, then
        # `user`, and the header wins over both.
        assert {pick(client, header, user="alice") for _ in range(5)} == {home.endpoint}
        keyed = {pick(client, header, prompt_cache_key="alice", user="bob") for _ in range(5)}
        assert keyed == {home.endpoint}
        explicit = {pick(client, header, "bob", user="alice") for _ in range(5)}
        assert explicit == {bob.endpoint}
        # Without a session, load decides.
        free = {pick(client, header) for _ in range(8)}
        assert home.endpoint not in free, free


def test_a_session_whose_pod_leaves_the_pool_moves_and_stays(launch: Launcher) -> None:
    """The pinned pod leaves the pool (its Deployment scales down and the ReplicaSet deletes
    the pod marked cheapest to delete): the session is placed afresh, then pinned to its new
    pod, which keeps it even when load says otherwise. The other sessions do not move."""
    pool = launch(spec_patch=sessions_patch(replicas=3))
    header = header_of(pool)
    assert pool.epp is not None
    with pool.epp.client() as client:
        placed = spread(pool, client, header, ["alice", "bob", "carol"])
        gone = placed["alice"]
        deployment = pool.rendered.model_deployment["metadata"]["name"]
        ns = pool.rendered.namespace
        pool.cluster.kubectl(
            "annotate", "pod", gone.name, "-n", ns,
            "controller.kubernetes.io/pod-deletion-cost=-1000", "--overwrite",
        )  # fmt: skip
        pool.cluster.kubectl("scale", "deployment", deployment, "-n", ns, "--replicas=2")
        wait_until(
            lambda: {p["metadata"]["name"] for p in pool.ready_pods()},
            f"{gone.name} leaving the pool's ready pods",
            within_s=60,
            interval_s=0.3,
            until=lambda ready: gone.name not in ready,
        )
        remaining = [p for p in pool.pods if p is not gone]
        load(pool, [], remaining)
        # Until the picker saw it leave: each probe is a request of the session, and the
        # first that lands elsewhere is where the session now lives.
        moved = wait_until(
            lambda: pick(client, header, "alice"),
            f"the picker routing session alice away from the deleted {gone.endpoint}",
            within_s=30,
            interval_s=0.2,
            until=lambda endpoint: endpoint is not None and endpoint != gone.endpoint,
        )
        new_home = pod_at(pool, moved)
        assert new_home in remaining
        load(pool, [new_home], remaining)  # its new pod is now the worst choice by load: it stays
        assert {pick(client, header, "alice") for _ in range(10)} == {new_home.endpoint}
        for sid in ("bob", "carol"):
            assert {pick(client, header, sid) for _ in range(5)} == {placed[sid].endpoint}


TTL = 5.0
"""The ttl of the expiry test: long enough that a request every 0.3 s renews the pin with
seconds to spare, short enough to wait out."""


def renewed_while_used(
    pool: PoolOnCluster, client: ExtProcClient, header: str, sid: str
) -> PodHandle | None:
    """Pin `sid`, make its pod the worst by load, and keep the session in use for twice the
    ttl: every request goes to the pinned pod. None when the machine stalled for nearly a
    ttl between two requests (the pin may have lapsed, which proves nothing either way)."""
    home = pod_at(pool, pick(client, header, sid))
    last = time.monotonic()
    for p in pool.pods:
        p.set(**(BUSY if p is home else IDLE))
    started = last
    while last - started < 2 * TTL:
        time.sleep(0.3)
        endpoint = pick(client, header, sid)
        now = time.monotonic()
        if now - last >= TTL - 1.0:
            return None
        assert endpoint == home.endpoint, "a pin in use moved or expired"
        last = now
    return home


def test_a_pin_lives_ttl_after_its_last_use(launch: Launcher) -> None:
    """Requests of a session renew its pin, so it outlives `ttlSeconds` while in use; once
    unused for longer than that, the pin is gone and load places the session again."""
    pool = launch(spec_patch=sessions_patch(replicas=2, ttlSeconds=int(TTL)))
    header = header_of(pool)
    assert pool.epp is not None
    with pool.epp.client() as client:
        for attempt in range(3):  # a fresh session after a stalled attempt
            sid = f"alice-{attempt}"
            home = renewed_while_used(pool, client, header, sid)
            if home is not None:
                break
        else:
            pytest.fail("the machine stalled for a ttl in each of 3 attempts")
        wait_scrapes([p.server for p in pool.pods])  # the load is surely seen now
        time.sleep(TTL + 1.0)  # unused for longer than the ttl
        away = {pick(client, header, sid) for _ in range(3)}
        assert home.endpoint not in away, "the pin outlived its ttl"
        (other,) = [p for p in pool.pods if p is not home]
        assert away == {other.endpoint}

"""Tenant-aware routing on the real picker, through the gateway's rendered policy step.

Each test renders a resource with the cache front and isolation by key, applies it to the
local control plane, runs the real cache fronts on the pod IPs, and starts the Endpoint
Picker pod as rendered: the picker with its rendered args and config, and the rendered
`gateway-policy` container in front of it (plain gRPC over loopback, as rendered). One salt
Secret per pool is read by the fronts and the step alike, as in a cluster. Requests enter
where the gateway enters: the policy step's ext_proc port.

Runs on the upstream GIE EPP v1.5.0 (`e2e/cluster build` builds it: never skipped) and on
llm-d-router v0.10.0 where its binary exists. See docs/endpoint-picker.md, 'Tenants'.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.epp.binary import find_epp_binary, missing_reason
from harness.epp.extproc import chat_body
from harness.epp.launch import Launcher, routing_patch
from harness.epp.pool import PodHandle, PoolOnCluster
from harness.epp.scenarios import prefixed, settle_index, unique_text, wait_scrapes
from promptcache.contract import DEFAULT_ISOLATION_HEADER, PickerTarget
from promptcache.tenancy.salt import derive_salt

pytestmark = [pytest.mark.epp, pytest.mark.cluster]

GIE, LLMD = PickerTarget.GIE, PickerTarget.LLM_D_ROUTER
needs_llmd = pytest.mark.skipif(find_epp_binary(LLMD) is None, reason=missing_reason(LLMD))
KEY = DEFAULT_ISOLATION_HEADER


@pytest.fixture(
    params=[pytest.param(GIE, id="gie"), pytest.param(LLMD, id="llmd", marks=needs_llmd)]
)
def launch(
    cluster: Any, namespace: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Launcher]:
    picker: PickerTarget = request.param
    if find_epp_binary(picker) is None:
        pytest.fail(missing_reason(picker))  # GIE is built by `e2e/cluster build`
    launcher = Launcher(cluster, namespace, tmp_path, picker)
    try:
        yield launcher
    finally:
        launcher.close()


def tenant_pool(launch: Launcher, mode: str = "PerKey") -> PoolOnCluster:
    patch = routing_patch(replicas=4, with_front=True)
    patch["isolation"] = {"mode": mode}
    pool = launch(spec_patch=patch)
    assert pool.shim is not None, "isolation by key renders the policy step"
    assert "--secure-serving=false" in pool.rendered.epp_args  # the step dials plain gRPC
    return pool


def pod_at(pool: PoolOnCluster, endpoint: str | None) -> PodHandle:
    handle = pool.by_endpoint(endpoint)
    assert handle is not None, f"picked {endpoint!r}, not one of the pool's pods"
    return handle


def order_by_load(pool: PoolOnCluster, worst: PodHandle) -> PodHandle:
    """Make the load order strict (no ties): `worst` slightly worse than every other pod,
    one other pod the unique best. Returns the best."""
    others = [p for p in pool.pods if p is not worst]
    for rank, p in enumerate(others):
        p.set(waiting=rank, kv_cache_usage=0.0)
    worst.set(waiting=0, kv_cache_usage=0.1)
    wait_scrapes([p.server for p in pool.pods])
    return others[0]


def test_tenants_with_the_same_prompt_are_routed_by_load_not_to_each_other(
    launch: Launcher,
) -> None:
    pool = tenant_pool(launch)
    system = unique_text(2400)  # the long system prompt every tenant shares
    with pool.client() as gateway:
        home = pod_at(pool, gateway.pick(chat_body(prefixed(system)), headers={KEY: "a"}).endpoint)
        settle_index()
        best = order_by_load(pool, worst=home)
        # Tenant b, same prompt, another key: nothing of a's attracts it; load decides.
        for _ in range(4):
            pick = gateway.pick(chat_body(prefixed(system)), headers={KEY: "b"})
            assert pick.endpoint == best.endpoint, "tenant b was drawn by tenant a's prefix"
        # Tenant a's next turn is drawn to a's pod although load says otherwise.
        for _ in range(4):
            pick = gateway.pick(chat_body(prefixed(system)), headers={KEY: "a"})
            assert pick.endpoint == home.endpoint, "tenant a's follow-up lost its pod"
        # The key may come in the body field too: the same tenant, the same pod.
        body = {**chat_body(prefixed(system)), "prompt_cache_isolation_key": "a"}
        assert gateway.pick(body).endpoint == home.endpoint


def test_the_picker_hashes_and_forwards_the_salt_the_front_derives(launch: Launcher) -> None:
    pool = tenant_pool(launch)
    with pool.client() as gateway:
        pick = gateway.pick(chat_body(unique_text(600), cache_salt="mine"), headers={KEY: "a"})
    forwarded = json.loads(pick.body)
    assert forwarded["cache_salt"] == derive_salt(pool.salt_key, "a")
    # The front in the picked pod derives the same salt from the same key and Secret and
    # hands vLLM exactly that.
    handle = pod_at(pool, pick.endpoint)
    status, _ = post_to_front(handle, forwarded, {KEY: "a"})
    assert status == 200
    assert handle.server.served[-1].body["cache_salt"] == forwarded["cache_salt"]


def test_a_forged_cache_salt_routes_exactly_as_without_it(launch: Launcher) -> None:
    pool = tenant_pool(launch)
    system = unique_text(2400)
    with pool.client() as gateway:
        home = pod_at(pool, gateway.pick(chat_body(prefixed(system)), headers={KEY: "a"}).endpoint)
        settle_index()
        best = order_by_load(pool, worst=home)
        stolen = derive_salt(pool.salt_key, "a")  # the strongest forgery: a's real salt
        for forged in (stolen, "anything", ""):
            # Without a key, a forged salt (even a's own) does not reach a's prefix...
            plain = gateway.pick(chat_body(prefixed(system)))
            with_forged = gateway.pick(chat_body(prefixed(system), cache_salt=forged))
            assert with_forged.endpoint == plain.endpoint == best.endpoint
            # ...and with a's key it changes nothing either.
            keyed = gateway.pick(chat_body(prefixed(system)), headers={KEY: "a"})
            keyed_forged = gateway.pick(
                chat_body(prefixed(system), cache_salt=forged), headers={KEY: "a"}
            )
            assert keyed_forged.endpoint == keyed.endpoint == home.endpoint


def post_to_front(
    handle: PodHandle, body: dict[str, Any], headers: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    """POST a chat request to the pod's cache front, as the gateway would forward it."""
    assert handle.front is not None
    req = urllib.request.Request(
        f"http://{handle.ip}:{handle.front.port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_required_refuses_keyless_at_the_gateway_with_the_fronts_error(
    launch: Launcher,
) -> None:
    pool = tenant_pool(launch, mode="Required")
    body = chat_body(unique_text(600))
    with pool.client() as gateway:
        refused = gateway.pick(body)
        allowed = gateway.pick(body, headers={KEY: "a"})
    front_status, front_body = post_to_front(pool.pods[0], body, {})
    assert refused.endpoint is None
    assert refused.immediate_status == front_status == 400
    assert json.loads(refused.immediate_body) == front_body
    assert front_body["error"]["code"] == "isolation_key_required"
    assert allowed.endpoint in {p.endpoint for p in pool.pods}

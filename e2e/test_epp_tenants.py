"""Tenant-aware routing on the real picker, through the gateway's rendered policy step.

Each test renders a resource with the cache front and isolation by key, applies it to the
local control plane, runs the real cache fronts on the pod IPs, and starts the Endpoint
Picker pod as rendered: the picker with its rendered args and config, and the rendered
`gateway-policy` container in front of it (plain gRPC over loopback, as rendered). One salt
Secret per pool is read by the fronts and the step alike, as in a cluster. Requests enter
where the gateway enters: the policy step's ext_proc port.

Runs on the upstream GIE EPP v1.5.0 (`e2e/cluster build` builds it: never skipped), on
promptcache's own picker (`gateway.picker: promptcache`, the same binary with its tenant-salt
parser configured and no policy step: requests enter at the picker itself, and refusals
come from the front after the pick) and on llm-d-router v0.10.0 where its binary exists.
See docs/endpoint-picker.md, 'Tenants'.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.epp.binary import find_epp_binary, missing_reason
from harness.epp.extproc import chat_body
from harness.epp.launch import Launcher, routing_patch
from harness.epp.pool import PodHandle, PoolOnCluster
from harness.epp.scenarios import index_grows, prefixed, unique_text, wait_scrapes
from harness.extproc_gateway import envoy_applies
from promptcache.contract import (
    DEFAULT_ISOLATION_HEADER,
    IDENTITY_ATTESTATION_HEADER,
    GatewayPolicyEnv,
    PickerTarget,
)
from promptcache.render.epp_config import AFFINITY_FILTER
from promptcache.render.epp_sizing import STEP_COST, UTILIZATION
from promptcache.tenancy.identity import account_digest
from promptcache.tenancy.salt import derive_account_salt, derive_salt

pytestmark = [pytest.mark.epp, pytest.mark.cluster]

GIE, LLMD, OURS = PickerTarget.GIE, PickerTarget.LLM_D_ROUTER, PickerTarget.PROMPTCACHE
needs_llmd = pytest.mark.skipif(find_epp_binary(LLMD) is None, reason=missing_reason(LLMD))
KEY = DEFAULT_ISOLATION_HEADER


@pytest.fixture(
    params=[
        pytest.param(GIE, id="gie"),
        pytest.param(OURS, id="promptcache"),
        pytest.param(LLMD, id="llmd", marks=needs_llmd),
    ]
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


def tenant_pool(
    launch: Launcher, mode: str = "PerKey", identity: dict[str, Any] | None = None
) -> PoolOnCluster:
    patch = routing_patch(replicas=4, with_front=True)
    patch["isolation"] = {"mode": mode, **({"identity": identity} if identity else {})}
    pool = launch(spec_patch=patch)
    if launch.picker is OURS:
        assert pool.shim is None, "promptcache's picker derives the salt itself: no step"
        assert pool.rendered.tenant_salt_plugin is not None
        assert "--secure-serving=false" not in pool.rendered.epp_args  # it serves TLS
        return pool
    assert pool.shim is not None, "isolation by key renders the policy step"
    assert "--secure-serving=false" in pool.rendered.epp_args  # the step dials plain gRPC
    return pool


def refusal_of(pool: PoolOnCluster, body: dict[str, Any], headers: dict[str, str]) -> Any:
    """What the client gets for a request the front refuses: the policy step answers it at
    the gateway; promptcache's picker routes it with a one-off salt (it attracts no one's
    prefix), forwarding the client's bytes as sent, and the front in the picked pod
    answers. (status, JSON body)."""
    with pool.client() as gateway:
        pick = gateway.pick(body, headers=headers)
    if pool.shim is not None:
        assert pick.endpoint is None
        return pick.immediate_status, json.loads(pick.immediate_body)
    assert pick.body == json.dumps(body).encode()
    pod_headers = envoy_applies(pick.sent_headers, pick.responses)
    return post_raw(pod_at(pool, pick.endpoint), pick.body, pod_headers)


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
        with index_grows(pool.epp):
            home = pod_at(
                pool, gateway.pick(chat_body(prefixed(system)), headers={KEY: "a"}).endpoint
            )
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
        with index_grows(pool.epp):
            home = pod_at(
                pool, gateway.pick(chat_body(prefixed(system)), headers={KEY: "a"}).endpoint
            )
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
    return post_raw(handle, json.dumps(body).encode(), [*headers.items()])


def test_required_refuses_keyless_at_the_gateway_with_the_fronts_error(
    launch: Launcher,
) -> None:
    pool = tenant_pool(launch, mode="Required")
    body = chat_body(unique_text(600))
    refused = refusal_of(pool, body, {})
    with pool.client() as gateway:
        allowed = gateway.pick(body, headers={KEY: "a"})
    front_status, front_body = post_to_front(pool.pods[0], body, {})
    assert refused == (front_status, front_body)
    assert front_status == 400
    assert front_body["error"]["code"] == "isolation_key_required"
    assert allowed.endpoint in {p.endpoint for p in pool.pods}


def test_a_step_sized_for_more_traffic_runs_workers_that_derive_the_same_salt(
    launch: Launcher,
) -> None:
    """`gateway.sizing` for about 1.5 cores of policy step renders two worker processes; the
    picker hashes the salt either derives, the one the front derives."""
    if launch.picker is OURS:
        pytest.skip("promptcache's picker has no policy step to size")
    kib = 8
    rate = int(1.5 * 1000 * UTILIZATION / (STEP_COST.fixed_ms + STEP_COST.per_kib_ms * kib))
    patch = routing_patch(replicas=2, with_front=True)
    patch["isolation"] = {"mode": "PerKey"}
    patch["gateway"] = {"sizing": {"requestsPerSecond": rate, "requestKiB": kib}}
    pool = launch(spec_patch=patch)
    assert pool.shim is not None
    assert pool.shim.env[GatewayPolicyEnv.WORKERS] == "2"
    with pool.client() as gateway:
        for key in ("a", "b", "a"):
            pick = gateway.pick(chat_body(unique_text(600)), headers={KEY: key})
            assert json.loads(pick.body)["cache_salt"] == derive_salt(pool.salt_key, key)
            assert pick.endpoint in {p.endpoint for p in pool.pods}


# ------------------------------------------------------------ isolation by account (#27)

USER = "x-account-id"
"""What the gateway's authentication sets (here: the test, playing the gateway)."""


def account_pool(launch: Launcher, required: bool = False) -> PoolOnCluster:
    return tenant_pool(launch, identity={"header": USER, "bearerToken": True, "required": required})


def account_salt(pool: PoolOnCluster, user: str, key: str | None) -> str:
    secret = pool.salt_key
    return derive_account_salt(secret, account_digest(secret, "header", user), key)


def post_raw(
    handle: PodHandle, body: bytes, headers: list[tuple[str, str]]
) -> tuple[int, dict[str, Any]]:
    """POST exactly what the gateway would send the pod (headers after Envoy's mutation)."""
    assert handle.front is not None
    skip = {"host", "content-length", "transfer-encoding"}
    sent = {k: v for k, v in headers if not k.startswith(":") and k.lower() not in skip}
    req = urllib.request.Request(
        f"http://{handle.ip}:{handle.front.port}/v1/chat/completions",
        data=body,
        headers={"content-type": "application/json", **sent},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_accounts_sending_one_key_are_routed_apart_and_each_follows_its_own_prefix(
    launch: Launcher,
) -> None:
    """The picker hashes the account's salt: two accounts with the same isolation key and
    the same long prompt are strangers to each other's prefix, as is a caller without an
    account sending that key; each account's next turn is drawn to its own pod."""
    pool = account_pool(launch)
    system = unique_text(2400)
    alice = {USER: "alice", KEY: "team"}
    with pool.client() as gateway:
        with index_grows(pool.epp):
            home = pod_at(pool, gateway.pick(chat_body(prefixed(system)), headers=alice).endpoint)
        best = order_by_load(pool, worst=home)
        for stranger in ({USER: "bob", KEY: "team"}, {KEY: "team"}, {USER: "alice"}):
            for _ in range(3):
                pick = gateway.pick(chat_body(prefixed(system)), headers=stranger)
                assert pick.endpoint == best.endpoint, f"{stranger} was drawn to alice's prefix"
        for _ in range(4):
            pick = gateway.pick(chat_body(prefixed(system)), headers=alice)
            assert pick.endpoint == home.endpoint, "alice's follow-up lost its pod"
        # the same account by another carrier of the key (the body field): the same pod
        body = {**chat_body(prefixed(system)), "prompt_cache_isolation_key": "team"}
        assert gateway.pick(body, headers={USER: "alice"}).endpoint == home.endpoint


def test_the_pod_serves_the_salt_the_picker_hashed_and_nothing_forged_reaches_it(
    launch: Launcher,
) -> None:
    """Through the real picker the pod receives the account's salt with the step's signed
    account (GIE re-encodes the body on the way: the signature still holds); the same
    request sent to the pod directly, with the identity header forged or the attestation
    replayed, reaches only the key's own scope, never alice's."""
    pool = account_pool(launch)
    alice = {USER: "alice", KEY: "team"}
    with pool.client() as gateway:
        pick = gateway.pick(chat_body(unique_text(600), cache_salt="forged"), headers=alice)
    forwarded = json.loads(pick.body)
    assert forwarded["cache_salt"] == account_salt(pool, "alice", "team")
    handle = pod_at(pool, pick.endpoint)
    pod_headers = envoy_applies(pick.sent_headers, pick.responses)
    assert [k for k, _ in pod_headers].count(IDENTITY_ATTESTATION_HEADER) == 1
    served = lambda: handle.server.served[-1].body.get("cache_salt")  # noqa: E731
    assert post_raw(handle, pick.body, pod_headers)[0] == 200
    assert served() == forwarded["cache_salt"]
    # replayed: the very same request again, straight to the pod
    assert post_raw(handle, pick.body, pod_headers)[0] == 200
    assert served() == derive_salt(pool.salt_key, "team")
    # forged: the identity header, without the step's attestation
    assert post_to_front(handle, forwarded, alice)[0] == 200
    assert served() == derive_salt(pool.salt_key, "team")


def test_required_per_account_refuses_at_the_gateway_with_the_fronts_error(
    launch: Launcher,
) -> None:
    pool = account_pool(launch, required=True)
    body = chat_body(unique_text(600))
    refused = refusal_of(pool, body, {KEY: "team"})
    with pool.client() as gateway:
        allowed = gateway.pick(body, headers={"authorization": "Bearer tok-1", KEY: "team"})
    front_status, front_body = post_to_front(pool.pods[0], body, {USER: "alice", KEY: "team"})
    assert refused == (front_status, front_body)
    assert front_status == 401
    assert front_body["error"]["code"] == "identity_required"
    assert allowed.endpoint in {p.endpoint for p in pool.pods}


# ------------------------------------------- spec/002's prefix-cache affinity filter (#27)


def test_the_affinity_filter_keeps_a_held_prefix_on_its_pod_under_load(launch: Launcher) -> None:
    """`prefixCache.affinityFilter`: the pod holding most of a prompt's prefix keeps it even
    when load says otherwise; the same pool with the filter taken out of the rendered config
    lets load win (the control: the check cannot pass by itself)."""
    patch = routing_patch(replicas=4)
    patch["prefixCache"] = {
        "affinityFilter": {"enabled": True, "threshold": 0.5, "explorationProbability": 0}
    }
    pool = launch(spec_patch=patch, start_epp=False)
    with_filter = pool.rendered.epp_config_text
    assert AFFINITY_FILTER in with_filter
    doc = yaml.safe_load(with_filter)
    doc["plugins"] = [p for p in doc["plugins"] if p["type"] != AFFINITY_FILTER]
    for profile in doc["schedulingProfiles"]:
        profile["plugins"] = [r for r in profile["plugins"] if r["pluginRef"] != AFFINITY_FILTER]
    without_filter = yaml.safe_dump(doc, sort_keys=False)

    def picks_home(config_text: str) -> int:
        for p in pool.pods:
            p.set(waiting=0, kv_cache_usage=0.0)
        pool.start_epp(config_text=config_text)  # a fresh picker: an empty prefix index
        system = unique_text(2400)
        with pool.client() as gateway:
            with index_grows(pool.epp):
                home = pod_at(pool, gateway.pick(chat_body(prefixed(system))).endpoint)
            home.set(waiting=40, kv_cache_usage=0.95)  # far worse by load than every other
            wait_scrapes([p.server for p in pool.pods])
            return sum(
                gateway.pick(chat_body(prefixed(system))).endpoint == home.endpoint
                for _ in range(6)
            )

    assert picks_home(with_filter) == 6, "the filter let load move a held prefix"
    assert picks_home(without_filter) == 0, "without the filter load wins (the control)"

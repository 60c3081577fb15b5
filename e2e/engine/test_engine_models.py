"""Two models and two LoRA adapters behind one Gateway, on real engines and real routers.

`alpha` serves tiny model A as `base-a` with two LoRA adapters of A (`sql-lora`,
`chat-lora`: random peft adapters made here, on a hostPath volume as a platform team's
adapter volume would be); `beta` serves tiny model B (other weights, other tokenizer) as
`base-b`. Both route by model on one Gateway. Each resource is one rendered model-server
pod (the real cache front before a real `vllm serve`) run as processes on the IP kwok
gave its pod object, behind its own real GIE v1.5 picker and rendered gateway policy step;
GIE's real `bbr` watches the real API server for the rendered mapping ConfigMaps.

The harness plays the Gateway (`through_gateway`): `bbr`'s ext_proc sets the model
headers, the rendered HTTPRoutes choose the InferencePool, that pool's policy step and
picker choose the pod, and the request goes to the chosen pod over a real socket with
every header the ext_procs set. What is checked is what the engines say: which model
answered (greedy output equal to that engine's own answer for that name, and different
from every other name's), and how many prompt tokens came from cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from harness.engine.client import Answer, completion_body, long_text, post
from harness.engine.cluster_pods import start_pool_pods
from harness.engine.pods import engine_resource
from harness.epp.bbr import BbrProcess, chart_router_args, route_for
from harness.epp.binary import find_epp_binary, missing_reason
from harness.epp.extproc import DESTINATION_HEADER
from harness.epp.pool import PoolOnCluster
from harness.epp.rendered import Rendered, deep_merge, render_resource
from harness.pod import ProcessPod
from harness.pytest_cluster import Cluster, built_binary
from harness.vllm import TinyModel, tiny_model
from harness.vllm.adapters import TinyAdapter, tiny_adapter
from promptcache.api import parse_resource
from promptcache.contract import DEFAULT_ISOLATION_HEADER, PickerTarget
from promptcache.render.model_list import model_lists
from tools import install_assets

pytestmark = [pytest.mark.cluster, pytest.mark.helm]

KV_CACHE_BYTES = 8 << 20
"""8 MiB each: 256 blocks of 32 tokens for the tiny models."""
ADAPTER_MOUNT = "/adapters"
ADAPTERS = {"sql-lora": TinyAdapter(seed=1), "chat-lora": TinyAdapter(seed=2)}
SERVED = {"base-a": "alpha", "sql-lora": "alpha", "chat-lora": "alpha", "base-b": "beta"}
"""Every name on the Gateway and the resource that serves it."""
GATEWAY = {
    "picker": "gie-v1.5",
    "route": {"parentRefs": [{"name": "shared"}], "routeByModel": True},
}
_PSEUDO = (":", "content-length", DESTINATION_HEADER)


@dataclass
class Gateway:
    """The Gateway's data path as the harness plays it."""

    bbr: BbrProcess
    routes: list[dict[str, Any]]
    pools: dict[str, PoolOnCluster]
    pods: dict[str, ProcessPod]
    """Each resource's one model-server pod, by resource name."""
    resources: dict[str, dict[str, Any]]

    def decide(
        self, body: dict[str, Any], key: str | None, path: str
    ) -> tuple[str, str, bytes, dict[str, str]]:
        """(resource, pod endpoint, body, headers) for one request, as the Gateway would
        send it upstream: the router's headers, the rule they match, the pool's pick."""
        headers = {"content-type": "application/json"}
        if key is not None:
            headers[DEFAULT_ISOLATION_HEADER] = key
        with self.bbr.client() as router:
            routed = router.pick(body, headers=headers, path=path)
        assert routed.immediate_status is None, routed
        headers.update(routed.set_headers)
        pool_name = route_for(self.routes, path, headers)
        assert pool_name is not None, f"no HTTPRoute rule matches {headers}"
        (resource,) = [n for n, p in self.pools.items() if p.rendered.pool_name == pool_name]
        raw = routed.body or json.dumps(body).encode()
        with self.pools[resource].client() as picker:
            picked = picker.pick(raw, headers=headers, path=path)
        assert picked.immediate_status is None, picked
        assert picked.endpoint is not None, picked
        headers.update(picked.set_headers)
        sent = {k: v for k, v in headers.items() if not k.startswith(_PSEUDO)}
        return resource, picked.endpoint, picked.body or raw, sent


async def through_gateway(
    http: aiohttp.ClientSession,
    gateway: Gateway,
    body: dict[str, Any],
    key: str | None = None,
    path: str = "/v1/completions",
) -> tuple[str, Answer]:
    """One request through the Gateway: the resource whose pod answered, and the answer."""
    resource, endpoint, raw, headers = await asyncio.to_thread(gateway.decide, body, key, path)
    assert endpoint == f"{gateway.pods[resource].ip}:{gateway.pods[resource].ports['http']}"
    async with http.post(f"http://{endpoint}{path}", data=raw, headers=headers) as resp:
        text = await resp.text()
        answer = Answer(resp.status, {k.lower(): v for k, v in resp.headers.items()}, raw=text)
    answer.body = json.loads(text)
    return resource, answer


def _resources(model_a: Path, model_b: Path, adapters_dir: Path) -> dict[str, dict[str, Any]]:
    volume = {"name": "adapters", "hostPath": {"path": str(adapters_dir)}}
    mount = {"name": "adapters", "mountPath": ADAPTER_MOUNT, "readOnly": True}
    alpha = engine_resource(model_a, name="alpha", engine={"maxModelLen": 4096}, gateway=GATEWAY)
    deep_merge(
        alpha["spec"],
        {
            "model": {
                "servedModelName": "base-a",
                "adapters": [
                    {"name": name, "path": f"{ADAPTER_MOUNT}/{folder.name}", "rank": params.rank}
                    for name, params in ADAPTERS.items()
                    for folder in [tiny_adapter(model_a, params)]
                ],
                "podTemplate": {
                    "spec": {
                        "volumes": [volume],
                        "containers": [{"name": "vllm", "volumeMounts": [mount]}],
                    }
                },
            }
        },
    )
    beta = engine_resource(model_b, name="beta", engine={"maxModelLen": 4096}, gateway=GATEWAY)
    beta["spec"]["model"]["servedModelName"] = "base-b"
    return {"alpha": alpha, "beta": beta}


@pytest.fixture(scope="module")
def gateway(
    cluster: Cluster, engine_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    if find_epp_binary(PickerTarget.GIE) is None:  # `e2e/cluster build` builds it: never skip
        pytest.fail(missing_reason(PickerTarget.GIE))
    workdir = tmp_path_factory.mktemp("models")
    model_b = tiny_model(TinyModel(seed=1))
    adapters_dir = tiny_adapter(engine_model, next(iter(ADAPTERS.values()))).parent
    namespace = cluster.create_namespace("models")
    pools: dict[str, PoolOnCluster] = {}
    pods: dict[str, ProcessPod] = {}
    docs = _resources(engine_model, model_b, adapters_dir)
    pools: dict[str, PoolOnCluster] = {}
    pods: dict[str, ProcessPod] = {}
    args = chart_router_args(install_assets.helm_template)
    with (
        BbrProcess(built_binary("bbr"), workdir / "bbr", cluster.kubeconfig, args) as bbr,
        contextlib.ExitStack() as teardown,
    ):
        for core, (name, doc) in enumerate(docs.items()):
            doc["metadata"]["namespace"] = namespace
            pool = PoolOnCluster(cluster, Rendered(render_resource(doc)), workdir / name)
            teardown.callback(pool.close)
            pools[name] = pool
            pool.apply()
            (pods[name],) = start_pool_pods(pool, workdir, KV_CACHE_BYTES, first_core=core)
            teardown.callback(pods[name].stop)
            pool.start_epp(wait_scraped=False)
        bbr.wait_ready()
        routes = [o for p in pools.values() for o in p.rendered.of_kind("HTTPRoute")]
        yield Gateway(bbr, routes, pools, pods, docs)


def _prompt(seed: int) -> str:
    return long_text(seed, words=120)


async def test_each_name_is_answered_by_its_own_model_or_adapter(
    http: aiohttp.ClientSession, gateway: Gateway
) -> None:
    """Through the Gateway, each name lands on its resource's pod and is answered with
    that engine's own greedy output for the name; the four outputs differ pairwise, so an
    adapter answered as its base (or the other model) could not pass."""
    prompt = _prompt(7001)
    texts: dict[str, str] = {}
    for name, resource in SERVED.items():
        landed, answer = await through_gateway(
            http, gateway, completion_body(prompt, model=name, max_tokens=8), key="t-models"
        )
        assert answer.status == 200, answer.raw
        assert landed == resource, (name, landed)
        assert answer.body["model"] == name
        pod = gateway.pods[resource]
        direct = await post(
            http,
            f"http://{pod.ip}:8001",
            "/v1/completions",
            completion_body(prompt, model=name, max_tokens=8),
        )
        assert direct.status == 200, direct.raw
        assert answer.text == direct.text, (name, answer.text, direct.text)
        texts[name] = answer.text
    assert len(set(texts.values())) == len(texts), texts


async def test_cached_prefixes_stay_within_tenant_model_and_adapter(
    http: aiohttp.ClientSession, gateway: Gateway
) -> None:
    """By the engines' own cached-token counts: a tenant's repeat hits; the same prompt
    from another tenant, on the other model, on an adapter of the same base, or on the
    base after its adapter, gets nothing from cache."""
    prompt = _prompt(7002)

    async def cached(model: str, key: str) -> int:
        _, answer = await through_gateway(
            http, gateway, completion_body(prompt, model=model, max_tokens=2), key=key
        )
        assert answer.status == 200, answer.raw
        assert answer.usage["prompt_tokens"] > 64, answer.usage
        return answer.cached

    assert await cached("sql-lora", "tenant-a") == 0
    assert await cached("sql-lora", "tenant-a") > 0, "a tenant's repeat on an adapter hits"
    assert await cached("base-a", "tenant-a") == 0, "the base shared the adapter's blocks"
    assert await cached("chat-lora", "tenant-a") == 0, "two adapters shared blocks"
    assert await cached("sql-lora", "tenant-b") == 0, "two tenants shared an adapter's blocks"
    assert await cached("base-b", "tenant-a") == 0
    assert await cached("base-a", "tenant-a") > 0, "the control: the base's own repeat hits"


async def test_the_gateway_model_list_is_what_the_engines_serve(
    http: aiohttp.ClientSession, gateway: Gateway
) -> None:
    """The list the operator computes for the Gateway (`render.model_list`) names exactly
    what the real engines list at `GET /v1/models` through their fronts, with each
    adapter's parent."""
    (listing,) = model_lists(parse_resource(d) for d in gateway.resources.values()).values()
    computed = {(m["id"], m.get("parent")) for m in listing["data"]}
    served: set[tuple[str, str | None]] = set()
    for pod in gateway.pods.values():
        async with http.get(f"{pod.url()}/v1/models") as resp:
            assert resp.status == 200
            for model in (await resp.json())["data"]:
                served.add((model["id"], model.get("parent")))
    assert computed == served
    assert {name for name, _ in served} == set(SERVED)

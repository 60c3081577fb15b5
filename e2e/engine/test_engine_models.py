"""Two models and two LoRA adapters behind one Gateway, on real engines and real routers.

`alpha` serves tiny model A as `base-a` with two LoRA adapters of A (`sql-lora`,
`chat-lora`: random peft adapters made here, on a hostPath volume as a platform team's
adapter volume would be); `beta` serves tiny model B (other weights, other tokenizer) as
`base-b`. Both route by model on one Gateway. The real operator reconciles both: it
writes their children (the router's mapping ConfigMaps among them) and their status, read
from the real pods. Each resource is one model-server pod (the real cache front before a
real `vllm serve`) run as processes on the IP kwok gave its pod object, whose probes decide
its readiness, behind its own picker as rendered by default (promptcache's build of GIE
v1.5.0, which derives the tenant salt itself: no policy step in front of it); GIE's
real `bbr` watches the real API server for the mapping ConfigMaps, and the model-list
responder (`promptcache catalog`) reads the resources with only the chart's rights.

The harness plays the Gateway (`harness/engine/gateway.py`): `bbr`'s ext_proc sets the model
headers, the rendered HTTPRoutes and the chart's route for the responder are matched by
Gateway API precedence, the chosen pool's picker chooses the pod (or the
responder answers), over real sockets with every header the ext_procs and the route set.
What is checked is what the engines say: which model answered (greedy output equal to that
engine's own answer for that name, and different from every other name's), how many prompt
tokens came from cache, what they list, and how they refuse an unknown model.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from harness.catalog import CatalogProcess, least_privilege_kubeconfig
from harness.engine.client import completion_body, long_text, post
from harness.engine.cluster_pods import PROCESS_POD_TEMPLATE, start_pool_pods
from harness.engine.gateway import (
    ADAPTERS,
    SERVED,
    Gateway,
    chart_model_list_route,
    send,
    through_gateway,
    two_model_resources,
)
from harness.epp.bbr import BbrProcess, chart_router_args
from harness.epp.binary import find_epp_binary, missing_reason
from harness.epp.pool import PoolOnCluster
from harness.epp.rendered import Rendered, deep_merge, render_resource
from harness.operator import apply_yaml, namespaced_operator, wait_for
from harness.pod import ProcessPod
from harness.pytest_cluster import Cluster, built_binary
from harness.vllm import TinyModel, tiny_model
from harness.vllm.adapters import tiny_adapter
from promptcache.contract import PickerTarget
from promptcache.contract.router import GATEWAY_HEADER, MODEL_HEADER
from tools import install_assets

pytestmark = [pytest.mark.cluster, pytest.mark.helm]

KV_CACHE_BYTES = 8 << 20
"""8 MiB each: 256 blocks of 32 tokens for the tiny models."""


@pytest.fixture(scope="module")
def gateway(
    cluster: Cluster, engine_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """The real operator reconciles both resources (children, the router's mapping
    ConfigMaps, status from the real pods); their pods run as processes whose probes decide
    readiness; the responder reads the resources with only the chart's rights."""
    if (
        find_epp_binary(PickerTarget.PROMPTCACHE) is None
    ):  # `e2e/cluster build` builds it: never skip
        pytest.fail(missing_reason(PickerTarget.PROMPTCACHE))
    workdir = tmp_path_factory.mktemp("models")
    model_b = tiny_model(TinyModel(seed=1))
    adapters_dir = tiny_adapter(engine_model, next(iter(ADAPTERS.values()))).parent
    docs = two_model_resources(engine_model, model_b, adapters_dir)
    pools: dict[str, PoolOnCluster] = {}
    pods: dict[str, ProcessPod] = {}
    args = chart_router_args(install_assets.helm_template)
    with (
        namespaced_operator(cluster, "models", workdir) as env,
        BbrProcess(
            built_binary("bbr"), workdir / "bbr", cluster.kubeconfig, args, namespace=env["ns"]
        ) as bbr,
        contextlib.ExitStack() as teardown,
    ):
        namespace = env["ns"]
        for doc in docs.values():
            doc["metadata"]["namespace"] = namespace
            deep_merge(doc["spec"], {"model": {"podTemplate": PROCESS_POD_TEMPLATE}})
        apply_yaml(cluster.kubectl, *docs.values())
        kubeconfig = least_privilege_kubeconfig(cluster, namespace, workdir)
        catalog = teardown.enter_context(CatalogProcess(kubeconfig, [namespace], workdir / "cat"))
        for name, doc in docs.items():
            pools[name] = PoolOnCluster(cluster, Rendered(render_resource(doc)), workdir / name)
            teardown.callback(pools[name].close)
        routes = [o for p in pools.values() for o in p.rendered.of_kind("HTTPRoute")]
        routes.append(chart_model_list_route(install_assets.helm_template, "shared", namespace))
        gw = Gateway(bbr, routes, pools, pods, docs, catalog)
        # While the engines start, the responder knows both resources and lists neither.
        wait_for(
            lambda: catalog.request(
                "POST", "/v1/completions",
                {GATEWAY_HEADER: f"{namespace}/shared", MODEL_HEADER: "base-b"}, b"{}",
            )[0] == 503,
            "the responder to read both resources",
        )  # fmt: skip
        gw.notes["listed_while_starting"] = catalog.models(f"{namespace}/shared")
        for core, (name, pool) in enumerate(pools.items()):
            (pods[name],) = start_pool_pods(
                pool, workdir, KV_CACHE_BYTES, first_core=core, reports_to=cluster
            )
            teardown.callback(pods[name].stop)
            pool.start_epp(wait_scraped=False)
        bbr.wait_ready()
        yield gw


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


async def test_get_models_through_the_gateway_lists_what_the_engines_serve(
    http: aiohttp.ClientSession, gateway: Gateway
) -> None:
    """`GET /v1/models` through the Gateway (the router sees a request without a body, the
    responder's exact-path rule wins) lists exactly what the real engines list at their own
    `/v1/models`, each adapter with its parent, once the operator's status from the real
    pods says they are served; while the engines started it listed nothing."""
    assert gateway.notes["listed_while_starting"] == []
    served: set[tuple[str, str | None]] = set()
    for pod in gateway.pods.values():
        async with http.get(f"{pod.url()}/v1/models") as resp:
            assert resp.status == 200
            for model in (await resp.json())["data"]:
                served.add((model["id"], model.get("parent")))
    assert {name for name, _ in served} == set(SERVED)

    async def listed() -> set[tuple[str, str | None]]:
        backend, answer = await send(http, gateway, "GET", "/v1/models")
        assert backend == "catalog", backend
        assert answer.status == 200, answer.raw
        return {(m["id"], m.get("parent")) for m in answer.body["data"]}

    for _ in range(240):  # the operator's status follows the pods within its 2 s resync
        if await listed() == served:
            break
        await asyncio.sleep(0.5)
    assert await listed() == served
    _, answer = await send(http, gateway, "GET", "/v1/models")
    namespace = gateway.resources["alpha"]["metadata"]["namespace"]
    assert {m["id"]: m["owned_by"] for m in answer.body["data"]} == {
        name: f"{namespace}/{resource}" for name, resource in SERVED.items()
    }


async def test_an_unknown_model_gets_the_engines_own_not_found(
    http: aiohttp.ClientSession, gateway: Gateway
) -> None:
    """A model no resource serves: the router maps it to no base model, only the
    responder's lowest-precedence rule matches, and the answer is the very error a vLLM
    engine gives for a model it does not serve (not the Gateway's empty 404)."""
    body = completion_body("Hello", model="no-such-model", max_tokens=2)
    backend, answer = await send(http, gateway, "POST", "/v1/completions", body, key="t-x")
    assert backend == "catalog"
    # Each engine's own answer names its own base model as the valid alias; the Gateway's
    # names every base model it serves, in the same words.
    aliases: list[str] = []
    for pod in gateway.pods.values():
        direct = await post(http, f"http://{pod.ip}:8001", "/v1/completions", body)
        assert answer.status == direct.status == 404
        assert {k: v for k, v in answer.body["error"].items() if k != "message"} == {
            k: v for k, v in direct.body["error"].items() if k != "message"
        }
        head, own = direct.body["error"]["message"].split(" Valid aliases: ")
        assert answer.body["error"]["message"].startswith(head + " Valid aliases: ")
        aliases += own.rstrip(".").split(", ")
    assert answer.body["error"]["message"] == (
        f"{head} Valid aliases: {', '.join(sorted(aliases))}."
    )
    assert answer.body["error"]["type"] == "NotFoundError"
    nameless = {k: v for k, v in body.items() if k != "model"}
    backend, answer = await send(http, gateway, "POST", "/v1/completions", nameless, key="t-x")
    assert (backend, answer.status) == ("catalog", 400)
    assert answer.body["error"]["param"] == "model"

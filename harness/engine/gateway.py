"""The harness playing a shared Gateway: the body-based router, the HTTPRoutes, each pool's
policy step and picker, and the model-list responder, over real sockets.

A request goes as an Envoy-based Gateway would send it: GIE's real `bbr` (ext_proc, headers
and body, or headers alone for a request without a body) sets the model headers, every
HTTPRoute on the Gateway is matched by Gateway API precedence (`harness.epp.bbr.route`: the
resources' rendered routes and the responder's route the chart renders), and the chosen
backend answers: a pool through its policy step and picker to the picked pod, or the
responder. Shared by `test_engine_models.py` and `bench/multi_model_cache.py`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from harness.catalog import CatalogProcess
from harness.engine.client import Answer
from harness.engine.pods import engine_resource
from harness.epp.bbr import BbrProcess, route
from harness.epp.extproc import DESTINATION_HEADER
from harness.epp.pool import PoolOnCluster
from harness.epp.rendered import deep_merge
from harness.pod import ProcessPod
from harness.vllm.adapters import TinyAdapter, tiny_adapter
from promptcache.contract import DEFAULT_ISOLATION_HEADER, Container

_PSEUDO = (":", "content-length", DESTINATION_HEADER)
ADAPTER_MOUNT = "/adapters"
ADAPTERS = {"sql-lora": TinyAdapter(seed=1), "chat-lora": TinyAdapter(seed=2)}
SERVED = {"base-a": "alpha", "sql-lora": "alpha", "chat-lora": "alpha", "base-b": "beta"}
"""Every name on the Gateway and the resource that serves it."""
GATEWAY = {
    "route": {"parentRefs": [{"name": "shared"}], "routeByModel": True},
}


def two_model_resources(
    model_a: Path, model_b: Path, adapters_dir: Path, alpha_replicas: int = 1
) -> dict[str, dict[str, Any]]:
    """`alpha` (tiny model A as `base-a`, adapters `sql-lora` and `chat-lora` on a hostPath
    volume mounted at /adapters) and `beta` (tiny model B as `base-b`), both routing by model
    on the Gateway `shared`."""
    volume = {"name": "adapters", "hostPath": {"path": str(adapters_dir)}}
    mount = {"name": "adapters", "mountPath": ADAPTER_MOUNT, "readOnly": True}
    alpha = engine_resource(model_a, name="alpha", engine={"maxModelLen": 4096}, gateway=GATEWAY)
    deep_merge(
        alpha["spec"],
        {
            "model": {
                "servedModelName": "base-a",
                "replicas": alpha_replicas,
                "adapters": [
                    {"name": name, "path": f"{ADAPTER_MOUNT}/{folder.name}", "rank": params.rank}
                    for name, params in ADAPTERS.items()
                    for folder in [tiny_adapter(model_a, params)]
                ],
                "podTemplate": {
                    "spec": {
                        "volumes": [volume],
                        "containers": [{"name": Container.VLLM.value, "volumeMounts": [mount]}],
                    }
                },
            }
        },
    )
    beta = engine_resource(model_b, name="beta", engine={"maxModelLen": 4096}, gateway=GATEWAY)
    beta["spec"]["model"]["servedModelName"] = "base-b"
    return {"alpha": alpha, "beta": beta}


def chart_model_list_route(helm_template: Any, gateway: str, namespace: str) -> dict[str, Any]:
    """The responder's HTTPRoute for one Gateway, as the chart renders it."""
    docs = yaml.safe_load_all(
        helm_template(
            "--set",
            "bodyBasedRouter.enabled=true",
            "--set",
            "bodyBasedRouter.modelList.enabled=true",
            "--set",
            f"bodyBasedRouter.modelList.gateways[0].name={gateway}",
            "--set",
            f"bodyBasedRouter.modelList.gateways[0].namespace={namespace}",
        )
    )
    (found,) = [d for d in docs if d and d["kind"] == "HTTPRoute"]
    return dict(found)


@dataclass
class Decision:
    """Where the Gateway sends one request, with what."""

    backend: str
    """A resource name (its pool), `catalog`, or `` when the Gateway answers itself."""
    endpoint: str = ""
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    status: int | None = None
    """The Gateway's own answer: an ext_proc's immediate response, or 404 without a rule."""


@dataclass
class Gateway:
    """The Gateway's data path as the harness plays it."""

    bbr: BbrProcess
    routes: list[dict[str, Any]]
    pools: dict[str, PoolOnCluster]
    pods: dict[str, ProcessPod]
    """Each resource's one model-server pod, by resource name."""
    resources: dict[str, dict[str, Any]]
    catalog: CatalogProcess | None = None
    catalog_service: str = "promptcache-operator-models"
    all_pods: dict[str, list[ProcessPod]] = field(default_factory=dict)
    """Every pod by resource, where a resource has more than one."""
    notes: dict[str, Any] = field(default_factory=dict)
    """What the fixture saw on the way up (e.g. the list while the engines started)."""

    def decide(
        self, method: str, path: str, body: dict[str, Any] | bytes | None, key: str | None
    ) -> Decision:
        headers = {"host": "gateway.local"}
        if body is not None:
            headers["content-type"] = "application/json"
        if key is not None:
            headers[DEFAULT_ISOLATION_HEADER] = key
        raw = (
            None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
        )
        with self.bbr.client() as router:
            routed = router.pick(raw, headers=headers, path=path, method=method)
        if routed.immediate_status is not None:
            return Decision("", status=routed.immediate_status, body=routed.immediate_body.encode())
        headers.update(routed.set_headers)
        raw = routed.body or raw or b""
        rule = route(self.routes, method, path, headers)
        if rule is None:
            return Decision("", status=404)
        sent = {k: v for k, v in rule.headers.items() if not k.startswith(_PSEUDO)}
        if rule.backend == self.catalog_service:
            assert self.catalog is not None
            return Decision("catalog", f"127.0.0.1:{self.catalog.port}", raw, sent)
        (resource,) = [n for n, p in self.pools.items() if p.rendered.pool_name == rule.backend]
        with self.pools[resource].client() as picker:
            picked = picker.pick(raw, headers=sent, path=path)
        assert picked.immediate_status is None, picked
        assert picked.endpoint is not None, picked
        sent.update(picked.set_headers)
        sent = {k: v for k, v in sent.items() if not k.startswith(_PSEUDO)}
        return Decision(resource, picked.endpoint, picked.body or raw, sent)


async def send(
    http: aiohttp.ClientSession,
    gateway: Gateway,
    method: str,
    path: str,
    body: dict[str, Any] | bytes | None = None,
    key: str | None = None,
) -> tuple[str, Answer]:
    """One request through the Gateway: which backend answered, and the answer."""
    decision = await asyncio.to_thread(gateway.decide, method, path, body, key)
    if decision.status is not None:
        text = decision.body.decode(errors="replace")
        return "", Answer(decision.status, {}, raw=text)
    if decision.backend in gateway.pods:
        pods = gateway.all_pods.get(decision.backend) or [gateway.pods[decision.backend]]
        assert decision.endpoint in {f"{p.ip}:{p.ports['http']}" for p in pods}, decision
    async with http.request(
        method,
        f"http://{decision.endpoint}{path}",
        data=decision.body if body is not None else None,
        headers=decision.headers,
    ) as resp:
        text = await resp.text()
        answer = Answer(resp.status, {k.lower(): v for k, v in resp.headers.items()}, raw=text)
    answer.body = json.loads(text) if text else None
    return decision.backend, answer


async def through_gateway(
    http: aiohttp.ClientSession,
    gateway: Gateway,
    body: dict[str, Any],
    key: str | None = None,
    path: str = "/v1/completions",
) -> tuple[str, Answer]:
    """One POST through the Gateway: the resource whose pod answered, and the answer."""
    return await send(http, gateway, "POST", path, body, key)

"""Per-adapter status from the pods' `/v1/models` and from what a stopped vLLM said.

The two tails under `vllm_tails/` are what a real vLLM 0.33 CPU engine printed last when it
could not load an adapter at start (its log's last 80 lines, cut to 2048 bytes as the
kubelet cuts a `FallbackToLogsOnError` message): one adapter path holds nothing, one
adapter has rank 32 against `--max-lora-rank 8`. Both also had a good adapter loaded first.
The e2e proof on real engines and the real API server is
`e2e/engine/test_engine_adapters.py`.
"""

from __future__ import annotations

import copy
import json
import typing
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from harness.resources import BASE
from promptcache.api import parse_resource
from promptcache.api.spec import LoraAdapter
from promptcache.api.status import AdapterReason, AdapterReasonName, AdapterStatus
from promptcache.controller.adapters import (
    adapter_failures,
    adapter_status,
    failure_in,
    ready_pods,
    served_models,
    started_with,
)
from promptcache.controller.metrics import OperatorMetrics
from promptcache.controller.observation import Observation
from promptcache.controller.options import ReconcileSettings
from promptcache.controller.plan import Plan, plan
from promptcache.controller.pod_observer import PodObserver
from promptcache.controller.scope import Outcome, Scope
from promptcache.render import render
from promptcache.render.model_server import VLLM_CONTAINER

TAILS = Path(__file__).parent / "vllm_tails"
NOT_FOUND_TAIL = (TAILS / "adapter-not-found.txt").read_text()
RANK_TAIL = (TAILS / "rank-over-limit.txt").read_text()


def adapter(name: str, rank: int | None = None, path: str | None = None) -> LoraAdapter:
    return LoraAdapter.model_validate(
        {"name": name, "path": path or f"/adapters/{name}", **({"rank": rank} if rank else {})}
    )


def resource_with(adapters: list[LoraAdapter]) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["metadata"]["uid"] = "uid-1"
    doc["spec"]["model"]["adapters"] = [
        a.model_dump(mode="json", by_alias=True, exclude_none=True) for a in adapters
    ]
    doc["spec"]["model"]["modelCache"] = {}
    for a in doc["spec"]["model"]["adapters"]:
        a["path"] = "/model-cache" + a["path"]
    return doc


def pod_for(
    adapters: list[LoraAdapter], *, uid: str = "u1", ip: str = "10.0.0.1", ready: bool = True
) -> dict[str, Any]:
    """A model-server pod as the renderer would have made it for `adapters`."""
    doc = copy.deepcopy(BASE)
    doc["spec"]["model"]["adapters"] = [
        {"name": a.name, "path": "/model-cache/x"} for a in adapters
    ]
    (deployment,) = [m for m in render(parse_resource(doc)) if m["kind"] == "Deployment"][:1]
    containers = copy.deepcopy(deployment["spec"]["template"]["spec"]["containers"])
    vllm = next(c for c in containers if c["name"] == VLLM_CONTAINER)
    args = vllm["args"]
    start = args.index("--lora-modules") + 1
    end = start + len(adapters)
    args[start:end] = [
        json.dumps({"name": a.name, "path": a.source, "base_model_name": "m"}) for a in adapters
    ]
    return {
        "metadata": {"name": f"pod-{uid}", "uid": uid},
        "spec": {"containers": containers},
        "status": {
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": VLLM_CONTAINER, "restartCount": 0}],
        },
    }


def crashed(pod: dict[str, Any], message: str, *, last: bool = True) -> dict[str, Any]:
    terminated = {"terminated": {"exitCode": 1, "reason": "Error", "message": message}}
    pod["status"]["containerStatuses"] = [
        {"name": VLLM_CONTAINER, "restartCount": 1, **({"lastState": terminated} if last else {
            "state": terminated})},
        {"name": "front"},
    ]  # fmt: skip
    pod["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    return pod


def test_reason_names_match_the_constants() -> None:
    constants = {v for k, v in vars(AdapterReason).items() if k.isupper()}
    assert constants == set(typing.get_args(AdapterReasonName))


def test_the_real_not_found_message_blames_the_named_adapter_and_names_the_fix() -> None:
    blamed = failure_in(NOT_FOUND_TAIL, [adapter("good"), adapter("gone")])
    assert list(blamed) == ["gone"]
    assert blamed["gone"].reason == AdapterReason.NOT_FOUND
    said = blamed["gone"].message
    assert "Loading lora gone failed: No adapter found" in said
    assert "'/adapters/gone'" in said
    assert "model.adapters[].path" in said


def test_the_real_rank_message_blames_the_adapter_of_that_rank() -> None:
    blamed = failure_in(RANK_TAIL, [adapter("good", 8), adapter("big", 32)])
    assert list(blamed) == ["big"]
    assert blamed["big"].reason == AdapterReason.RANK_OVER_LIMIT
    assert "LoRA rank 32 is greater than max_lora_rank 8" in blamed["big"].message
    assert "engine.maxLoraRank to at least 32" in blamed["big"].message


def test_a_rank_failure_without_declared_ranks_names_every_suspect_and_says_so() -> None:
    blamed = failure_in(RANK_TAIL, [adapter("good"), adapter("big"), adapter("small", 8)])
    assert sorted(blamed) == ["big", "good"]
    assert all(f.reason == AdapterReason.RANK_OVER_LIMIT for f in blamed.values())
    assert "may be it" in blamed["good"].message


def test_a_rank_failure_whose_declared_ranks_all_lie_blames_every_adapter_not_loaded() -> None:
    blamed = failure_in(RANK_TAIL, [adapter("a", 8), adapter("b", 16)])
    assert sorted(blamed) == ["a", "b"]
    assert "declared ranks do not say which" in blamed["a"].message


def test_another_failure_while_loading_adapters_is_load_failed() -> None:
    tail = RANK_TAIL.replace(
        "Call to add_lora method failed: Worker failed with error 'LoRA rank 32 is greater "
        "than max_lora_rank 8.'",
        "Adapter bias is not supported.",
    )
    blamed = failure_in(tail, [adapter("a"), adapter("b")])
    assert sorted(blamed) == ["a", "b"]
    assert {f.reason for f in blamed.values()} == {AdapterReason.LOAD_FAILED}
    assert "Adapter bias is not supported." in blamed["a"].message


def test_a_crash_that_is_not_about_adapters_blames_none() -> None:
    oom = "Traceback (most recent call last):\n  ...\ntorch.OutOfMemoryError: CUDA out of memory"
    assert failure_in(oom, [adapter("a")]) == {}
    assert failure_in("", [adapter("a")]) == {}


def test_started_with_reads_the_rendered_lora_modules() -> None:
    adapters = [adapter("a"), adapter("b", path="/adapters/with=sign,comma")]
    assert started_with(pod_for(adapters)) == {a.name: a.source for a in adapters}
    hand_edited = pod_for([adapter("a")])
    vllm = hand_edited["spec"]["containers"][-1]
    args = vllm["args"]
    args[args.index("--lora-modules") + 1] = "a=/elsewhere"
    assert started_with(hand_edited) == {"a": "/elsewhere"}
    assert started_with({"spec": {"containers": [{"name": "vllm", "args": ["--x"]}]}}) == {}
    assert started_with({}) == {}


def test_failures_are_read_from_the_vllm_container_current_or_last_state() -> None:
    adapters = [adapter("good"), adapter("gone")]
    for last in (True, False):
        pod = crashed(pod_for(adapters), NOT_FOUND_TAIL, last=last)
        assert list(adapter_failures([pod], adapters)) == ["gone"]
    front_only = crashed(pod_for(adapters), NOT_FOUND_TAIL)
    front_only["status"]["containerStatuses"][0]["name"] = "front"
    assert adapter_failures([front_only], adapters) == {}


def test_a_failure_of_an_earlier_definition_says_nothing_of_the_current_one() -> None:
    """`gone` was fixed (another path): the pod that failed on the old path is stale."""
    old = [adapter("good"), adapter("gone", path="/adapters/typo")]
    pod = crashed(pod_for(old), NOT_FOUND_TAIL)
    assert list(adapter_failures([pod], old)) == ["gone"]
    assert adapter_failures([pod], [adapter("good"), adapter("gone")]) == {}


def test_status_per_adapter() -> None:
    adapters = [adapter("a"), adapter("b"), adapter("gone")]
    failures = adapter_failures([crashed(pod_for(adapters), NOT_FOUND_TAIL)], adapters)
    roots = {a.name: a.source for a in adapters}
    served = {
        "10.0.0.1": {"base": "/m", "a": roots["a"], "b": roots["b"]},
        "10.0.0.2": {"base": "/m", "a": roots["a"]},
    }
    out = {s.name: s for s in adapter_status(adapters, served, failures)}
    assert out["a"] == AdapterStatus(
        name="a", ready_replicas=2, reason="Served", message="served by 2 ready pod(s)"
    )
    assert (out["b"].ready_replicas, out["b"].reason) == (1, AdapterReason.NOT_ON_EVERY_POD)
    assert (out["gone"].ready_replicas, out["gone"].reason) == (0, AdapterReason.NOT_FOUND)


def test_a_replaced_adapter_is_served_by_name_but_not_as_the_spec_names_it() -> None:
    """During a rollout that changes an adapter's path, the old pods still serve the name
    (clients are answered), but it is not `Served` until every ready pod has the new one."""
    new = adapter("a", path="/adapters/v2")
    out = adapter_status([new], {"1": {"a": "/adapters/v1"}, "2": {"a": "/adapters/v2"}}, {})
    assert (out[0].ready_replicas, out[0].reason) == (2, AdapterReason.NOT_ON_EVERY_POD)
    assert "1 serve an older source" in out[0].message
    done = adapter_status([new], {"2": {"a": "/adapters/v2"}}, {})
    assert done[0].reason == AdapterReason.SERVED


def test_no_ready_pod_and_no_failure_is_pending() -> None:
    out = adapter_status([adapter("a")], {}, {})
    assert (out[0].reason, out[0].ready_replicas) == (AdapterReason.PENDING, 0)


@given(
    st.lists(st.sampled_from(["a", "b", "c", "base"]), max_size=4).map(frozenset),
    st.lists(st.sampled_from(["a", "b", "c", "base"]), max_size=4).map(frozenset),
)
def test_ready_replicas_count_the_pods_that_list_it(
    one: frozenset[str], two: frozenset[str]
) -> None:
    adapters = [adapter("a"), adapter("b"), adapter("c")]
    roots = {n: f"/adapters/{n}" for n in "abc"} | {"base": "/m"}
    served = {"1": {n: roots[n] for n in one}, "2": {n: roots[n] for n in two}}
    for entry in adapter_status(adapters, served, {}):
        assert entry.ready_replicas == (entry.name in one) + (entry.name in two)
        assert (entry.reason == AdapterReason.SERVED) == (entry.ready_replicas == 2)


def test_model_list_parsing() -> None:
    body = (
        b'{"object":"list","data":[{"id":"base","object":"model","root":"/m"},'
        b'{"id":"a","parent":"base","root":"/adapters/a"},{"id":"b"}]}'
    )
    assert served_models(body) == {"base": "/m", "a": "/adapters/a", "b": ""}
    for bad in (b"", b"not json", b"[]", b'{"data": 3}', b"\xff"):
        assert served_models(bad) is None


def test_ready_pods_skip_unready_terminating_and_ipless_pods() -> None:
    ok = pod_for([adapter("a")], uid="ok")
    unready = pod_for([adapter("a")], uid="unready", ready=False)
    going = pod_for([adapter("a")], uid="going")
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    no_ip = pod_for([adapter("a")], uid="no-ip")
    del no_ip["status"]["podIP"]
    (only,) = ready_pods([ok, unready, going, no_ip])
    assert (only.key, only.sources) == (("ok", 0), {"a": "/adapters/a"})


# --- the observe step over a real socket: one `/v1/models` per engine start ----------------


@pytest.fixture
async def models_server() -> AsyncIterator[tuple[str, int, list[str]]]:
    """A pod's front on a real socket, answering `/v1/models` with one adapter; it records
    each request so the test counts them. Its `root` is not the spec's path, as when the
    engine resolved the path it was given (the status goes by the pod's own
    `--lora-modules`)."""
    seen: list[str] = []

    async def models(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": "m", "root": "/m"}, {"id": "a", "root": "/resolved/elsewhere/a"}],
            }
        )

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield "127.0.0.1", port, seen
    await runner.cleanup()


async def test_each_engine_start_is_asked_once_and_a_restart_is_asked_again(
    models_server: tuple[str, int, list[str]],
) -> None:
    host, port, seen = models_server
    adapters = [adapter("a")]
    raw = resource_with(adapters)
    planned = plan(raw, ReconcileSettings().defaults)
    assert isinstance(planned, Plan)
    pod = pod_for(planned.pcd.spec.model.adapters, ip=host)
    async with aiohttp.ClientSession() as http:
        observer = PodObserver(
            http,
            caches=None,  # type: ignore[arg-type]  # adapters are observed on the pods given
            metrics=OperatorMetrics(),
            settings=ReconcileSettings(scrape_port=port),
        )

        async def observe() -> list[AdapterStatus]:
            scope = Scope(
                raw=raw, plan=planned, fresh=False, obs=Observation(generation=1), outcome=Outcome()
            )
            await observer.observe_adapters(scope, [pod])
            return scope.obs.adapters

        for _ in range(3):
            (status,) = await observe()
            assert (status.reason, status.ready_replicas) == (AdapterReason.SERVED, 1)
        assert seen == ["/v1/models"], "one request per engine start, not per reconcile"
        pod["status"]["containerStatuses"][0]["restartCount"] = 1
        await observe()
        assert len(seen) == 2, "a restarted engine is asked again"
        observer.forget("uid-1")
        assert len(observer.served) == 0

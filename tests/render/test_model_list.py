"""The aggregated `/v1/models` of a shared Gateway, computed from the resources."""

from __future__ import annotations

from typing import Any

from promptcache.api import PromptCacheDeployment, parse_resource
from promptcache.render.model_list import GatewayKey, model_lists, name_conflicts


def pcd(
    name: str, served: str, adapters: list[str], *, route_by_model: bool = True, **route: Any
) -> PromptCacheDeployment:
    return parse_resource(
        {
            "apiVersion": "serving.promptcache.io/v1alpha1",
            "kind": "PromptCacheDeployment",
            "metadata": {"name": name, "namespace": "team"},
            "spec": {
                "model": {
                    "name": f"org/{served}",
                    "servedModelName": served,
                    "adapters": [{"name": a, "path": f"/model-cache/{a}"} for a in adapters],
                },
                "gateway": {
                    "route": {
                        "parentRefs": [{"name": "shared", "namespace": "gw"}],
                        "routeByModel": route_by_model,
                        **route,
                    }
                },
            },
        }
    )


SHARED = GatewayKey("gw", "shared", "", "")


def test_one_list_per_gateway_with_every_model_and_adapter() -> None:
    lists = model_lists(
        [
            pcd("a", "base-a", ["a-sql", "a-chat"]),
            pcd("b", "base-b", []),
            pcd("c", "solo", [], route_by_model=False),
        ]
    )
    assert list(lists) == [SHARED]
    data = lists[SHARED]["data"]
    assert [e["id"] for e in data] == ["a-chat", "a-sql", "base-a", "base-b"]
    assert {e["id"]: e.get("parent") for e in data} == {
        "a-chat": "base-a",
        "a-sql": "base-a",
        "base-a": None,
        "base-b": None,
    }
    assert {e["owned_by"] for e in data} == {"team/a", "team/b"}
    assert lists[SHARED]["object"] == "list"


def test_hostnames_split_lists_and_routes_without_one_are_in_all() -> None:
    lists = model_lists(
        [pcd("a", "base-a", [], hostnames=["a.example"]), pcd("b", "base-b", ["b-x"])]
    )
    host_a = GatewayKey("gw", "shared", "", "a.example")
    assert [e["id"] for e in lists[host_a]["data"]] == ["b-x", "base-a", "base-b"]
    assert [e["id"] for e in lists[SHARED]["data"]] == ["b-x", "base-b"]


def test_a_name_two_resources_claim_is_reported() -> None:
    (conflict,) = name_conflicts(
        [pcd("a", "base-a", ["shared-lora"]), pcd("b", "base-b", ["shared-lora"])]
    )
    assert (conflict.gateway, conflict.name, conflict.resources) == (
        SHARED,
        "shared-lora",
        ("team/a", "team/b"),
    )
    assert name_conflicts([pcd("a", "base-a", ["x"]), pcd("b", "base-b", ["y"])]) == []

"""The `/v1/models` answer of a shared Gateway, computed from the resources."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from harness.resources import routed_resource
from promptcache.api import PromptCacheDeployment, parse_resource
from promptcache.render.model_list import (
    Arrival,
    hostname_matches,
    known_names,
    model_list,
    name_conflicts,
)

SHARED = Arrival("gw", "shared")


def pcd(name: str, served: str, adapters: list[str], **kw: Any) -> PromptCacheDeployment:
    return parse_resource(routed_resource(name, served, adapters, **kw))


def ids(listing: dict[str, Any]) -> list[str]:
    return [e["id"] for e in listing["data"]]


def test_one_list_with_every_model_and_adapter_of_the_gateway() -> None:
    listing = model_list(
        [
            pcd("a", "base-a", ["a-sql", "a-chat"]),
            pcd("b", "base-b", []),
            pcd("c", "solo", [], route_by_model=False),
            pcd("d", "elsewhere", [], parent={"name": "other", "namespace": "gw"}),
        ],
        SHARED,
        created={"team/a": 1700000000},
    )
    assert listing["object"] == "list"
    assert ids(listing) == ["a-chat", "a-sql", "base-a", "base-b"]
    assert {e["id"]: e.get("parent") for e in listing["data"]} == {
        "a-chat": "base-a",
        "a-sql": "base-a",
        "base-a": None,
        "base-b": None,
    }
    assert {e["owned_by"] for e in listing["data"]} == {"team/a", "team/b"}
    assert {e["id"]: e.get("created") for e in listing["data"]}["base-a"] == 1700000000
    assert "created" not in listing["data"][-1]


def test_served_means_ready() -> None:
    """Starting resources are absent; an adapter not yet on a ready pod is absent; the
    spec's view (`known_names`) still has them all."""
    pcds = [
        pcd("a", "base-a", ["a-sql", "a-chat"], ready_adapters=["a-sql"]),
        pcd("b", "base-b", ["b-x"], ready=0),
    ]
    assert ids(model_list(pcds, SHARED)) == ["a-sql", "base-a"]
    assert known_names(pcds, SHARED) == {"a-sql", "a-chat", "base-a", "base-b", "b-x"}
    no_status = pcd("c", "base-c", []).model_copy(update={"status": None})
    assert ids(model_list([no_status], SHARED)) == []


def test_hostnames_and_listeners_select_the_resources() -> None:
    pcds = [
        pcd("a", "base-a", [], hostnames=["a.example"]),
        pcd("w", "base-w", [], hostnames=["*.wild.example"]),
        pcd("b", "base-b", ["b-x"]),
        pcd(
            "s", "base-s", [], parent={"name": "shared", "namespace": "gw", "sectionName": "https"}
        ),
    ]
    assert ids(model_list(pcds, Arrival("gw", "shared", host="a.example"))) == [
        "b-x", "base-a", "base-b", "base-s",
    ]  # fmt: skip
    assert ids(model_list(pcds, Arrival("gw", "shared", host="x.y.wild.example"))) == [
        "b-x", "base-b", "base-s", "base-w",
    ]  # fmt: skip
    assert ids(model_list(pcds, Arrival("gw", "shared", "http"))) == ["b-x", "base-b"]
    assert ids(model_list(pcds, Arrival("gw", "shared", "https"))) == ["b-x", "base-b", "base-s"]
    assert ids(model_list(pcds, Arrival("gw", "other"))) == []


@given(st.from_regex(r"[a-z0-9]{1,8}(\.[a-z0-9]{1,8}){0,3}", fullmatch=True))
def test_a_wildcard_matches_one_or_more_labels_and_never_its_bare_suffix(host: str) -> None:
    assert hostname_matches("*.example.com", f"{host}.example.com")
    assert not hostname_matches("*.example.com", "example.com")
    assert not hostname_matches("*.example.com", f"{host}example.com")
    assert hostname_matches(host, host.upper())


def test_a_name_two_resources_declare_is_reported_whatever_their_gateways() -> None:
    (conflict,) = name_conflicts(
        [
            pcd("a", "base-a", ["shared-lora"]),
            pcd("b", "base-b", ["shared-lora"], parent={"name": "other", "namespace": "gw"}),
        ]
    )
    assert (conflict.name, conflict.resources) == ("shared-lora", ("team/a", "team/b"))
    assert name_conflicts([pcd("a", "base-a", ["x"]), pcd("b", "base-b", ["y"])]) == []

"""The model-list responder on the real API server, with exactly the chart's rights.

It lists and watches the PromptCacheDeployments of its namespace under a ServiceAccount
that may only get, list and watch them (the chart's `model-list-rules.yaml`), so it
cannot work by any other right. The operator is not running here: each resource's status
is written as the operator writes it (`readyReplicas`, `adapters[].readyReplicas`), which is
what "served means ready" reads; the real operator writing it from real engines is
`e2e/engine/test_engine_models.py`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from harness.catalog import CatalogProcess, least_privilege_kubeconfig
from harness.operator import install_crd, wait_for
from harness.pytest_cluster import Cluster
from harness.resources import routed_resource
from promptcache.contract.router import GATEWAY_HEADER, MODEL_HEADER

pytestmark = pytest.mark.cluster


def _set_status(cluster: Cluster, ns: str, name: str, ready: int, adapters: dict[str, int]) -> None:
    status: dict[str, Any] = {"readyReplicas": ready}
    if adapters:
        status["adapters"] = [{"name": a, "readyReplicas": n} for a, n in adapters.items()]
    cluster.kubectl(
        "-n", ns, "patch", "pcd", name, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip


@pytest.fixture(scope="module")
def world(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    install_crd(cluster.kubectl)
    ns = cluster.create_namespace("catalog")
    workdir = tmp_path_factory.mktemp("catalog")
    kubeconfig = least_privilege_kubeconfig(cluster, ns, workdir)
    with CatalogProcess(kubeconfig, [ns], workdir) as responder:
        yield {"ns": ns, "responder": responder}
    cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_served_means_ready_and_the_list_follows_the_watch(
    cluster: Cluster, world: dict[str, Any]
) -> None:
    ns, responder = world["ns"], world["responder"]
    gateway = f"{ns}/shared"
    shared = {"name": "shared"}
    docs = [
        routed_resource("alpha", "base-a", ["sql-lora", "chat-lora"], namespace=ns,
                        ready=None, parent=shared),
        routed_resource("beta", "base-b", [], namespace=ns, ready=None, parent=shared),
    ]  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    # Declared, not ready: absent from the list, and a request for it is told "not ready".
    wait_for(
        lambda: responder.request("POST", "/v1/completions",
                                  {GATEWAY_HEADER: gateway, MODEL_HEADER: "base-b"}, b"{}")[0]
        == 503,
        "the responder to see the new resources",
        timeout=30,
    )  # fmt: skip
    assert responder.models(gateway) == []

    _set_status(cluster, ns, "alpha", 1, {"sql-lora": 1, "chat-lora": 0})
    _set_status(cluster, ns, "beta", 1, {})
    want = [("base-a", None), ("base-b", None), ("sql-lora", "base-a")]
    wait_for(lambda: responder.models(gateway) == want, f"the list {want}", timeout=30)
    assert responder.models(f"{ns}/other") == []

    _set_status(cluster, ns, "alpha", 1, {"sql-lora": 1, "chat-lora": 1})
    want = [("base-a", None), ("base-b", None), ("chat-lora", "base-a"), ("sql-lora", "base-a")]
    wait_for(lambda: responder.models(gateway) == want, "chat-lora once it is served", timeout=30)

    cluster.kubectl("-n", ns, "delete", "pcd", "beta")
    want = [("base-a", None), ("chat-lora", "base-a"), ("sql-lora", "base-a")]
    wait_for(lambda: responder.models(gateway) == want, "beta gone from the list", timeout=30)


def test_unknown_models_get_vllms_not_found(world: dict[str, Any]) -> None:
    ns, responder = world["ns"], world["responder"]
    status, body = responder.request(
        "POST", "/v1/chat/completions",
        {GATEWAY_HEADER: f"{ns}/shared", MODEL_HEADER: "gpt-9", "Content-Type": "application/json"},
        b'{"model": "gpt-9", "messages": []}',
    )  # fmt: skip
    assert status == 404
    assert status == 404
    assert body["error"]["message"].startswith("The model `gpt-9` does not exist. Valid aliases: ")
    assert {k: v for k, v in body["error"].items() if k != "message"} == {
        "type": "NotFoundError", "param": "model", "code": 404,
    }  # fmt: skip


def test_it_holds_no_right_beyond_reading_the_resources(
    cluster: Cluster, world: dict[str, Any]
) -> None:
    """The ServiceAccount it runs as can read the resources and do nothing else: so the
    chart's rules are all it needs."""
    ns = world["ns"]

    def can(verb: str, what: str) -> str:
        proc = cluster.kubectl("auth", "can-i", verb, what, "-n", ns,
                               f"--as=system:serviceaccount:{ns}:models", check=False)  # fmt: skip
        return proc.stdout.strip()

    assert can("watch", "promptcachedeployments.serving.promptcache.io") == "yes"
    for verb, what in [("patch", "promptcachedeployments.serving.promptcache.io"),
                       ("get", "configmaps"), ("get", "secrets"), ("list", "pods")]:  # fmt: skip
        assert can(verb, what) == "no", (verb, what)

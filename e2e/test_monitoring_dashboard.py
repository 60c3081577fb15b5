"""The dashboard and the recording rules against the real thing.

The real Prometheus (pinned, `e2e/cluster build --only prometheus`) scrapes the real
cache fronts (each in front of a vLLM stand-in, on its pod's IP) and the real Endpoint
Picker (promptcache's, with isolation by key, so the hit-ratio ladder has data), with the
target labels the rendered PodMonitors give them (the PodMonitor's
relabelings applied to the pods' labels, as the Prometheus Operator would). Traffic goes
through the picker to the picked front: shared prefixes, prompt embeds by reference in
a cache small enough to evict, and refused requests. Then every query of every panel of
the chart's dashboard, with the template variables set to this namespace and resource,
must return a finite value, and every recording rule must evaluate: a panel that names a
metric nobody exports fails here.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from harness.epp.extproc import chat_body
from harness.epp.launch import Launcher, routing_patch
from harness.epp.pool import PoolOnCluster
from harness.epp.scenarios import prefixed, unique_text
from harness.extproc_gateway import envoy_applies
from harness.monitoring import (
    DASHBOARD,
    Prometheus,
    dashboard_queries,
    finite,
    recorded_names,
    target_labels,
)
from harness.pytest_cluster import Cluster
from harness.waiting import wait_until
from promptcache.contract import DEFAULT_ISOLATION_HEADER, PickerTarget

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus]


@pytest.fixture
def pool(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[PoolOnCluster]:
    # promptcache's picker, isolation by key: the picker signs its prediction for the pod,
    # so the ladder's counters (and their panel and rules) have data too
    launcher = Launcher(cluster, namespace, tmp_path, PickerTarget.PROMPTCACHE)
    try:
        spec = routing_patch(replicas=2, with_front=True)
        spec["isolation"] = {"mode": "PerKey"}
        # Prompt embeds on, in a cache of ~100 KiB per process: a few dozen payloads evict.
        spec["promptEmbeds"] = {"enabled": True, "cacheGiB": 0.0001}
        spec["monitoring"] = {"enabled": True}
        yield launcher(spec_patch=spec)
    finally:
        launcher.close()


async def traffic(pool: PoolOnCluster, each: int, within_s: float) -> dict[str, int]:
    """Requests through the picker: shared prefixes, embeds by reference, refusals, until
    `each` of every kind was answered as meant. A count, not a duration: on a busy machine
    20 s once held a single round (the rates then lacked the samples the panels need)."""
    import torch  # noqa: PLC0415 - only this test needs torch

    from promptcache.front.client import EmbedsPayload, PromptCacheClient  # noqa: PLC0415

    assert pool.epp is not None
    counts = {"ok": 0, "refused": 0, "embeds": 0}
    shared = unique_text(1600)
    payloads = [EmbedsPayload.from_object(torch.randn(24, 64)) for _ in range(40)]
    deadline = time.monotonic() + within_s
    async with aiohttp.ClientSession() as http:
        clients = {p.endpoint: PromptCacheClient(http, f"http://{p.endpoint}") for p in pool.pods}
        with pool.epp.client() as picker:
            i = 0
            while min(counts.values()) < each:
                assert time.monotonic() < deadline, f"{counts} after {within_s:.0f} s"
                body = chat_body(prefixed(shared, 200))
                pick = picker.pick(body, headers={DEFAULT_ISOLATION_HEADER: "tenant"})
                endpoint = pick.endpoint
                assert endpoint in clients, f"picked {endpoint!r}"
                sent = {  # what Envoy forwards: the picker's headers (its prediction) included
                    k: v
                    for k, v in envoy_applies(pick.sent_headers, pick.responses)
                    if not k.startswith(":") and k.lower() not in ("host", "content-length")
                }
                url = f"http://{endpoint}/v1/chat/completions"
                async with http.post(url, data=pick.body, headers=sent) as r:
                    counts["ok"] += r.status == 200
                # Reuse a few payloads often (hits), cycle through the rest (inserts, evictions).
                payload = payloads[i % 4] if i % 2 else payloads[4 + i % 36]
                res = await clients[endpoint].post(
                    "/v1/completions",
                    {"model": "test-model", "prompt_embeds": payload, "max_tokens": 2},
                )
                counts["embeds"] += res.status == 200
                async with http.post(f"http://{endpoint}/v1/chat/completions", data=b"{") as r:
                    counts["refused"] += r.status >= 400
                i += 1
                await asyncio.sleep(0.05)
    return counts


def test_every_dashboard_query_and_recording_rule_returns_data(
    cluster: Cluster, pool: PoolOnCluster, tmp_path: Path
) -> None:
    monitors = {
        m["metadata"]["labels"]["app.kubernetes.io/component"]: m
        for m in pool.rendered.of_kind("PodMonitor")
    }
    assert set(monitors) == {"model-server", "endpoint-picker"}
    ns = pool.rendered.namespace
    resource = pool.rendered.model_deployment["metadata"]["labels"]["app.kubernetes.io/instance"]
    relabel = monitors["model-server"]["spec"]["podMetricsEndpoints"][0]["relabelings"]
    pods = {p["metadata"]["name"]: p for p in pool.ready_pods()}
    model_targets = [
        {"targets": [h.endpoint], "labels": target_labels(pods[h.name], relabel)} for h in pool.pods
    ]
    # The EPP runs as a process here; its labels are those its (rendered) pod would carry.
    epp_pod = {
        "metadata": {
            "namespace": ns,
            "name": f"{resource}-epp-0",
            "labels": pool.rendered.epp_deployment["spec"]["template"]["metadata"]["labels"],
        }
    }
    epp_relabel = monitors["endpoint-picker"]["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert pool.epp is not None
    epp_targets = [
        {
            "targets": [f"127.0.0.1:{pool.epp.ports.metrics}"],
            "labels": target_labels(epp_pod, epp_relabel),
        }
    ]
    prometheus = Prometheus(
        tmp_path,
        [
            {"job_name": "model-server", "static_configs": model_targets},
            {"job_name": "endpoint-picker", "static_configs": epp_targets},
        ],
    )
    try:
        prometheus.wait_up()
        asyncio.run(traffic(pool, each=12, within_s=300))

        def empty_queries() -> list[str]:
            return [
                f"{title}: {q}"
                for title, expr in dashboard_queries()
                if not finite(
                    prometheus.query(
                        q := expr.replace("$namespace", ns).replace("$resource", resource)
                    )
                )
            ]

        def missing_rules() -> list[str]:
            selector = f'{{namespace="{ns}",promptcache_deployment="{resource}"}}'
            return [n for n in recorded_names() if not finite(prometheus.query(n + selector))]

        # the last scrapes and rule evaluations after the traffic, however late they come
        wait_until(empty_queries, "every dashboard query with data", within_s=90, until=_none)
        wait_until(missing_rules, "every recording rule with data", within_s=90, until=_none)
        # The variables' own queries list this namespace and resource.
        doc = json.loads(DASHBOARD.read_text())
        for var in doc["templating"]["list"]:
            if var["type"] != "query":
                continue
            match = re.fullmatch(r"label_values\((.*), (\w+)\)", var["definition"])
            assert match, var["definition"]
            series = match.group(1).replace("$namespace", ns)
            values = prometheus.api(f"label/{match.group(2)}/values", **{"match[]": series})
            assert (ns if var["name"] == "namespace" else resource) in values
        # A panel naming a metric nobody exports would have failed above: show it does.
        assert not finite(
            prometheus.query(
                f'sum(rate(promptcache_front_no_such_metric_total{{namespace="{ns}"}}[5m]))'
            )
        )
    finally:
        prometheus.stop()


def _none(left: list[str]) -> bool:
    return not left

"""The dashboard queries and recording rules that read vLLM's series, on a real engine.

The real Prometheus scrapes the session's rendered pod (its front's `/metrics`, which
carries the engine's own `vllm:*` series) with the target labels the rendered
PodMonitor gives it; after real traffic (hits and misses), every panel query and
recording rule that reads a `vllm:` series must return a finite value. The stand-in
dashboard test covers the rest of the dashboard; this one shows the engine's names,
labels and counters are the ones the queries expect.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from harness.engine.client import chat_body, long_text, post
from harness.engine.pods import engine_resource
from harness.monitoring import RULES, Prometheus, dashboard_queries, finite, target_labels
from harness.pod import ProcessPod
from promptcache.api import PromptCacheDeployment
from promptcache.render import render

pytestmark = pytest.mark.prometheus
NAMESPACE = "default"


def _monitor_relabelings(model: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    resource = engine_resource(model, name="perkey", monitoring={"enabled": True})
    manifests = render(PromptCacheDeployment.model_validate(resource))
    monitor = next(
        m
        for m in manifests
        if m["kind"] == "PodMonitor"
        and m["metadata"]["labels"]["app.kubernetes.io/component"] == "model-server"
    )
    deployment = next(m for m in manifests if m["kind"] == "Deployment" and "vllm" in str(m))
    pod = {
        "metadata": {
            "namespace": NAMESPACE,
            "name": "perkey-0",
            "labels": deployment["spec"]["template"]["metadata"]["labels"],
        }
    }
    return pod, monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]


def _vllm_rules() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [
        r["record"]
        for g in doc["groups"]
        for r in g["rules"]
        if "record" in r and "vllm:" in r["expr"]
    ]


async def test_vllm_queries_and_rules_return_data_from_a_real_engine(
    engine_pod: ProcessPod, engine_model: Path, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    pod, relabel = _monitor_relabelings(engine_model)
    labels = target_labels(pod, relabel)
    prometheus = Prometheus(
        tmp_path,
        [
            {
                "job_name": "model-server",
                "static_configs": [{"targets": [f"{engine_pod.ip}:8000"], "labels": labels}],
            }
        ],
    )
    try:
        prometheus.wait_up()
        prompt = long_text(90210)
        for i in range(12):
            key = f"mon-{i % 3}"
            answer = await post(
                http, engine_pod.url(), "/v1/chat/completions", chat_body(prompt), key=key
            )
            assert answer.status == 200, answer.raw[:300]
            await asyncio.sleep(0.5)
        await asyncio.sleep(4)  # a last scrape and rule evaluation after the traffic
        resource = labels["promptcache_deployment"]
        queries = [(t, q) for t, q in dashboard_queries() if "vllm:" in q]
        assert queries, "the dashboard reads no vllm: series"
        empty = []
        for title, expr in queries:
            q = expr.replace("$namespace", NAMESPACE).replace("$resource", resource)
            if not finite(prometheus.query(q)):
                empty.append(f"{title}: {q}")
        assert empty == [], "dashboard queries without data:\n" + "\n".join(empty)
        rules = _vllm_rules()
        assert rules, "no recording rule reads a vllm: series"
        missing = [
            name
            for name in rules
            if not finite(
                prometheus.query(
                    f'{name}{{namespace="{NAMESPACE}",promptcache_deployment="{resource}"}}'
                )
            )
        ]
        assert missing == [], f"recording rules without data: {missing}"
    finally:
        prometheus.stop()

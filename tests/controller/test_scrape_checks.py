"""Prometheus text parsing, pod readiness, GPU capacity and REST paths (pure parts)."""

from __future__ import annotations

from typing import Any

import pytest

from promptcache.controller import scrape
from promptcache.controller.checks import gpu_shortfall
from promptcache.controller.kube import RequestCounter, by_kind
from promptcache.controller.scrape import (
    ScrapedPrefixCache,
    aggregate,
    parse_metrics,
    ready_pod_ips,
    relevant_lines,
)

VLLM_TEXT = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="2048"} 1.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 1000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 500.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 250.0
"""


def test_parse_vllm_metrics() -> None:
    pod = parse_metrics(VLLM_TEXT)
    assert (pod.block_size, pod.num_gpu_blocks, pod.hits, pod.queries) == (16, 2048, 750, 2000)


def test_only_the_three_metrics_are_parsed_and_nothing_else_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real page has hundreds of histogram lines: they are skipped before parsing, and
    the result equals parsing the page whole."""
    noise = "".join(
        f'vllm:e2e_request_latency_seconds_bucket{{le="{i}",model_name="m"}} {i}.0\n'
        f"# HELP vllm:x_{i} noise\n# TYPE vllm:x_{i} gauge\nvllm:x_{i} {i}\n"
        for i in range(300)
    )
    page = noise + VLLM_TEXT + noise
    filtered = parse_metrics(page)
    assert relevant_lines(page).count("\n") == 5  # the five samples, no help or type line
    monkeypatch.setattr(scrape, "relevant_lines", lambda text: text)  # parse the page whole
    assert filtered == parse_metrics(page) == parse_metrics(VLLM_TEXT)


def test_aggregate_over_pods() -> None:
    a = parse_metrics(VLLM_TEXT)
    b = parse_metrics(VLLM_TEXT.replace('num_gpu_blocks="2048"', 'num_gpu_blocks="1024"'))
    out = aggregate([a, b])
    assert out == ScrapedPrefixCache(
        scraped_pods=2, block_size=16, num_gpu_blocks=1024, hit_ratio=0.375
    )


def test_no_queries_means_no_ratio() -> None:
    assert aggregate([parse_metrics("")]) == ScrapedPrefixCache(scraped_pods=1)
    assert aggregate([]) == ScrapedPrefixCache(scraped_pods=0)


def test_only_ready_running_pods_are_scraped() -> None:
    pods: list[dict[str, Any]] = [
        {"status": {"podIP": "127.0.0.5", "conditions": [{"type": "Ready", "status": "True"}]}},
        {"status": {"podIP": "127.0.0.6", "conditions": [{"type": "Ready", "status": "False"}]}},
        {
            "metadata": {"deletionTimestamp": "x"},
            "status": {"podIP": "127.0.0.7", "conditions": [{"type": "Ready", "status": "True"}]},
        },
    ]
    assert ready_pod_ips(pods) == ["127.0.0.5"]


def _node(gpus: int, **labels: str) -> dict[str, object]:
    return {
        "metadata": {"labels": labels},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}},
    }


def test_gpu_shortfall() -> None:
    nodes = [_node(8, pool="a"), _node(4, pool="b")]
    assert gpu_shortfall(nodes, 8, {}) is None
    assert gpu_shortfall(nodes, 0, {}) is None
    message = gpu_shortfall(nodes, 16, {})
    assert message is not None
    assert message.startswith("spec.model.resources.gpus=16 but the largest node in the cluster")
    assert gpu_shortfall(nodes, 8, {"pool": "b"}) is not None


def test_rest_paths_and_write_counting() -> None:
    assert by_kind("Deployment").path("ns", "x") == "/apis/apps/v1/namespaces/ns/deployments/x"
    assert by_kind("ConfigMap").path("ns") == "/api/v1/namespaces/ns/configmaps"
    assert by_kind("Node").path(None) == "/api/v1/nodes"
    counter = RequestCounter()
    counter.record("GET", "/api/v1/namespaces/ns/configmaps/x")
    counter.record("PATCH", "/apis/apps/v1/namespaces/ns/deployments/x")
    counter.record(
        "PATCH",
        "/apis/serving.promptcache.io/v1alpha1/namespaces/ns/promptcachedeployments/x/status",
    )
    assert counter.writes == 2
    assert counter.writes_by_resource == {"deployments": 1, "promptcachedeployments/status": 1}

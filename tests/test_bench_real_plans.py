"""The real-engine benches' plans build from their arguments (no engine, no cluster here):
what each run would measure, and that the routing bench's workload overflows one pod."""

from __future__ import annotations

import pytest

from bench import epp_routing_real, front_overhead
from harness.engine.pods import rendered_pod_spec
from promptcache.api import PromptCacheDeployment


def test_front_overhead_real_mode_measures_1_8_and_64_in_one_run() -> None:
    args = front_overhead.parse_args(["--engine", "real"])
    plan = front_overhead.real_plan(args)
    assert plan.concurrencies == (1, 8, 64)
    assert plan.streams == (False, True)
    assert plan.pairs > 0
    assert plan.rounds > 1
    assert plan.window_s > 0
    assert plan.relay
    # every connection a point uses is opened before it is measured
    assert all(plan.warm(c) >= c for c in plan.concurrencies)
    quick = front_overhead.real_plan(front_overhead.parse_args(["--engine", "real", "--quick"]))
    assert quick.streams == (False,)
    assert quick.pairs * quick.rounds * quick.window_s < plan.pairs * plan.rounds * plan.window_s
    bare = front_overhead.parse_args(["--engine", "real", "--no-relay"])
    assert not front_overhead.real_plan(bare).relay


def test_front_overhead_standin_mode_keeps_its_defaults() -> None:
    args = front_overhead.parse_args([])
    assert (args.engine, args.requests, args.rounds) == ("standin", 1200, 6)
    quick = front_overhead.parse_args(["--quick"])
    assert (quick.requests, quick.rounds) == (200, 2)


def test_the_routing_workload_does_not_fit_in_one_pod() -> None:
    plan = epp_routing_real.parse(["--real"])
    assert 2 <= plan.pods <= 3
    assert plan.routers == ("random", "load-only", "prefix-aware", "prefix+sessions")
    # the system prompts alone nearly fill one pod; with the chats they overflow it ...
    assert plan.system_prompt_tokens > 0.8 * plan.cache_tokens_per_pod
    # ... while one pod's share of the tenants fits, with room for their chats
    assert plan.system_prompt_tokens / plan.pods < 0.5 * plan.cache_tokens_per_pod
    assert plan.max_model_len <= plan.cache_tokens_per_pod
    resource = plan.resource(epp_routing_real.ROOT, "bench-x")
    assert resource["spec"]["model"]["replicas"] == plan.pods
    assert "picker" not in resource["spec"].get("gateway", {})  # the default: promptcache's
    with_sessions = plan.resource(epp_routing_real.ROOT, "bench-x", sessions=True)
    assert with_sessions["spec"]["sessionAffinity"] == {"enabled": True}
    assert PromptCacheDeployment.model_validate(with_sessions).spec.session_affinity.enabled
    # the API and the renderer take it (the rendered engine args carry the length)
    args = next(c for c in rendered_pod_spec(resource)["containers"] if c["name"] == "vllm")
    assert str(plan.max_model_len) in args["args"]


def test_routing_real_mode_refuses_more_pods_than_engines() -> None:
    with pytest.raises(SystemExit):
        epp_routing_real.parse(["--real", "--pods", "4"])


def test_prefix_cache_counters_are_read_from_vllms_exposition() -> None:
    text = (
        "# HELP vllm:prefix_cache_hits_total hits\n"
        'vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 96.0\n'
        'vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 160.0\n'
        'vllm:prefix_cache_hits_created{engine="0"} 1.7e9\n'
    )
    assert epp_routing_real.counters(text) == {
        epp_routing_real.HITS: 96.0,
        epp_routing_real.QUERIES: 160.0,
    }

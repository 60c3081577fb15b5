"""The multi-model benches' plans build from their arguments (no engine, no cluster): the
workload mixes every name and tenant, and the router bench compares both arms per level."""

from __future__ import annotations

import json
from collections import Counter

from bench import bbr_overhead, multi_model_cache
from harness.engine.gateway import SERVED


def test_the_cache_workload_mixes_every_name_and_tenant_and_overflows_the_caches() -> None:
    plan = multi_model_cache.parse_args([])
    sessions = multi_model_cache.workload(plan)
    assert sessions == multi_model_cache.workload(plan)  # seeded: both arms, every run
    names = Counter(s.name for s in sessions)
    assert set(names) == set(SERVED) == set(multi_model_cache.POPULARITY)
    assert {s.tenant for s in sessions} == set(multi_model_cache.TENANTS)
    # Distinct system prompts per (tenant, name): isolation and adapters cannot share them.
    assert len({s.system for s in sessions}) == len({(s.tenant, s.name) for s in sessions})
    # What both arms write, at one token per word at least (the tiny tokenizer splits more
    # finely), outgrows the three engines' caches (1 KiB of KV per token), so they evict.
    systems = {s.system for s in sessions}
    words = sum(len(t.split()) for t in systems) + sum(
        len(q.split()) for s in sessions for q in s.questions
    )
    assert 2 * words > 3 * (plan.kv_mib << 20) // 1024


def test_the_router_bench_alternates_both_arms_over_two_body_sizes() -> None:
    plan = bbr_overhead.parse_args([])
    assert plan.concurrency == (1, 8)
    assert plan.body_kib == (1, 64)
    assert plan.requests // plan.rounds > 0
    for kib in plan.body_kib:
        body = bbr_overhead.body_of(kib, 4)
        assert abs(len(body) - kib * 1024) < 1024
        assert json.loads(body)["model"] in bbr_overhead.NAMES
    assert bbr_overhead.parse_args(["--quick"]).requests < plan.requests

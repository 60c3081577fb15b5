"""The Endpoint Picker pod sized from `spec.gateway.sizing`: CPU requests for the picker and
the policy step, the step's worker processes and the memory they hold.

The per-request costs are bench/gateway_hop.py's figures (`render.epp_sizing`); these tests
check what follows from them, whatever they are: more traffic never gets less, the step
gets a worker per core it is given, every worker's body share fits the largest body, and
the step's own parser accepts what is rendered."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.resources import (
    env_of,
    epp_containers,
    epp_deployment,
    gateway_policy_settings,
    rendered,
)
from promptcache.contract import GatewayPolicyEnv
from promptcache.contract.gateway_policy import MAX_GATEWAY_POLICY_WORKERS
from promptcache.render.epp import GATEWAY_POLICY_RUNTIME_BYTES, GATEWAY_POLICY_TMP_VOLUME
from promptcache.render.epp_sizing import (
    MIN_PICKER_MILLICORES,
    MIN_STEP_MILLICORES,
    PICKER_COST,
    STEP_COST,
    UTILIZATION,
)

MIB = 1024**2


def pod(rate: int, kib: int = 8, **spec: Any) -> list[dict[str, Any]]:
    """The pod with the step in it: the step fronts `llm-d-router` (not the default)."""
    sizing = {"requestsPerSecond": rate, "requestKiB": kib}
    return rendered(
        isolation={"mode": "PerKey"},
        gateway={"picker": "llm-d-router", "sizing": sizing},
        **spec,
    )


def millicores(container: dict[str, Any]) -> int:
    cpu = container["resources"]["requests"]["cpu"]
    assert cpu.endswith("m"), cpu
    return int(cpu[:-1])


def mib(quantity: str) -> int:
    assert quantity.endswith("Mi"), quantity
    return int(quantity[:-2])


def test_the_default_sizing_is_one_worker_and_the_pickers_floor() -> None:
    pods = epp_containers(pod(100))
    assert millicores(pods["epp"]) == MIN_PICKER_MILLICORES
    assert env_of(pods["gateway-policy"])[GatewayPolicyEnv.WORKERS] == "1"
    assert "volumeMounts" not in pods["gateway-policy"] or all(
        m["mountPath"] != "/tmp" for m in pods["gateway-policy"]["volumeMounts"]
    )


@given(st.integers(1, 100_000), st.integers(1, 100_000), st.integers(1, 4096), st.integers(1, 4096))
def test_more_traffic_never_gets_less(r1: int, r2: int, k1: int, k2: int) -> None:
    low, high = pod(min(r1, r2), min(k1, k2)), pod(max(r1, r2), max(k1, k2))
    for name in ("epp", "gateway-policy"):
        assert millicores(epp_containers(high)[name]) >= millicores(epp_containers(low)[name])
    assert int(env_of(epp_containers(high)["gateway-policy"])[GatewayPolicyEnv.WORKERS]) >= int(
        env_of(epp_containers(low)["gateway-policy"])[GatewayPolicyEnv.WORKERS]
    )


@pytest.mark.parametrize(("rate", "kib"), [(100, 8), (1000, 8), (3000, 2), (20_000, 64)])
def test_requests_cover_the_measured_cost_with_headroom(rate: int, kib: int) -> None:
    pods = epp_containers(pod(rate, kib))
    picker = PICKER_COST.cores(rate, kib) / UTILIZATION
    step = STEP_COST.cores(rate, kib) / UTILIZATION
    assert millicores(pods["epp"]) >= max(MIN_PICKER_MILLICORES, 1000 * picker)
    expected_step = min(max(MIN_STEP_MILLICORES, 1000 * step), 1000 * MAX_GATEWAY_POLICY_WORKERS)
    assert millicores(pods["gateway-policy"]) >= expected_step
    assert millicores(pods["gateway-policy"]) < expected_step + 50  # 50m steps, no more


@pytest.mark.parametrize(("rate", "kib"), [(1000, 8), (3000, 2), (20_000, 64), (100_000, 4096)])
def test_a_worker_per_core_each_with_a_body_share_and_its_runtime(rate: int, kib: int) -> None:
    manifests = pod(rate, kib, front={"maxRequestBytes": 512 * MIB})
    step = epp_containers(manifests)["gateway-policy"]
    settings = gateway_policy_settings(step)  # the step's own parser accepts it
    workers = settings.workers
    assert workers == min(MAX_GATEWAY_POLICY_WORKERS, math.ceil(millicores(step) / 1000))
    assert workers > 1
    assert settings.worker_budget >= settings.max_body_bytes == 512 * MIB
    limits = step["resources"]["limits"]
    assert mib(limits["memory"]) * MIB >= (
        2 * settings.max_buffered_bytes + workers * GATEWAY_POLICY_RUNTIME_BYTES
    )
    assert mib(step["resources"]["requests"]["memory"]) * MIB == (
        workers * GATEWAY_POLICY_RUNTIME_BYTES
    )
    # the workers' summed counters live in a memory-backed /tmp (the root is read-only)
    mounts = {m["mountPath"]: m["name"] for m in step["volumeMounts"]}
    assert mounts["/tmp"] == GATEWAY_POLICY_TMP_VOLUME
    volumes = {
        v["name"]: v for v in epp_deployment(manifests)["spec"]["template"]["spec"]["volumes"]
    }
    assert volumes[GATEWAY_POLICY_TMP_VOLUME]["emptyDir"]["medium"] == "Memory"

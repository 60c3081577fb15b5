"""The Endpoint Picker pod's CPU, from the request rate it routes (`spec.gateway.sizing`).

Every request costs the picker and the policy step CPU that grows with its body (the picker
hashes the prompt; the step parses and re-encodes it) and with its messages (the step relays
each ext_proc message both ways). `bench/gateway_hop.py` measures both, per request, on the
real GIE v1.5.0 picker; the figures below are its streamed-mode cells at concurrency 64
(16 answer events per request), the dearer of the two modes, fitted as a fixed cost plus a
cost per KiB. docs/endpoint-picker.md ('Sizing') quotes the run and says how to size.

Pure: the same sizing always renders the same requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from promptcache.api import PromptCacheDeployment
from promptcache.contract.gateway_policy import MAX_GATEWAY_POLICY_WORKERS


@dataclass(frozen=True)
class RequestCost:
    """CPU milliseconds one request costs a process: fixed, plus per KiB of body."""

    fixed_ms: float
    per_kib_ms: float

    def cores(self, requests_per_second: int, request_kib: int) -> float:
        """Cores busy at that rate."""
        return requests_per_second * (self.fixed_ms + self.per_kib_ms * request_kib) / 1000


PICKER_COST: Final[RequestCost] = RequestCost(fixed_ms=0.95, per_kib_ms=0.036)
"""The GIE v1.5.0 picker alone, with 4 pods to scrape (bench/gateway_hop.py, 2026-12-04,
streamed, c=64: 0.54 / 2.53 / 37.45 ms at 1 / 32 / 1024 KiB)."""
STEP_COST: Final[RequestCost] = RequestCost(fixed_ms=3.7, per_kib_ms=0.028)
"""The policy step (bench/gateway_hop.py, 2026-12-04, streamed, c=64: 3.93 / 4.39 / 31.76
ms at 1 / 32 / 1024 KiB; buffered answers cost it 1.50 / 2.05 / 26.16)."""
UTILIZATION: Final[float] = 0.6
"""Requests are sized to keep each container's cores at most this busy: bursts, the
picker's own scrapes and garbage collection need the rest."""
MIN_PICKER_MILLICORES: Final[int] = 500
MIN_STEP_MILLICORES: Final[int] = 100


def _millicores(cores: float, floor: int) -> int:
    return max(floor, math.ceil(cores / UTILIZATION * 1000 / 50) * 50)  # 50m steps


def picker_millicores(pcd: PromptCacheDeployment) -> int:
    sizing = pcd.spec.gateway.sizing
    cores = PICKER_COST.cores(sizing.requests_per_second, sizing.request_kib)
    return _millicores(cores, MIN_PICKER_MILLICORES)


def step_millicores(pcd: PromptCacheDeployment) -> int:
    """At most `MAX_GATEWAY_POLICY_WORKERS` cores: one process per core."""
    sizing = pcd.spec.gateway.sizing
    cores = STEP_COST.cores(sizing.requests_per_second, sizing.request_kib)
    return min(_millicores(cores, MIN_STEP_MILLICORES), 1000 * MAX_GATEWAY_POLICY_WORKERS)


def step_workers(pcd: PromptCacheDeployment) -> int:
    """One worker process per core the step is given (a process uses about one)."""
    return max(1, math.ceil(step_millicores(pcd) / 1000))

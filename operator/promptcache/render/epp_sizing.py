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

PICKER_IDLE_BYTES: Final[int] = 512 * 1024**2
"""The picker's memory besides the bodies it holds: runtime, pod metrics, the prefix index
(the memory request of every picker)."""
PICKER_RSS_PER_BODY_BYTE: Final[int] = 8
"""Resident bytes per byte of request body the picker holds (GIE keeps the body, its
parse, its re-encoding and the forwarded copy; the Go heap grows to twice its live data
before collecting): bench/gateway_hop.py, 2026-12-06, 1 MiB bodies at concurrency 256 held
6.6 (GIE alone: 1761 MiB peak) and 7.2 (promptcache's picker: 1904 MiB) bytes per byte in
flight above about 70 MiB idle; 8 leaves the rest of a byte for what a sample missed."""
PICKER_SIZED_BODIES: Final[int] = 256
"""Typical bodies (`gateway.sizing.requestKiB`) the promptcache picker's limit holds at
once besides its index, the concurrency of the bench's memory cell."""
GO_MEMORY_LIMIT_PERCENT: Final[int] = 90
"""`GOMEMLIMIT` as a share of the container's limit: the Go collector works harder as the
heap nears it, instead of the kernel killing the picker at the limit."""
GO_GC_PERCENT: Final[int] = 400
"""`GOGC` of promptcache's picker: the heap may grow to 5x its live data between
collections (Go's default, 100, is 2x), since `GOMEMLIMIT` bounds it anyway. At 1 KiB bodies
the picker's live heap is a few tens of MiB, so at 100 it collects every few hundred
requests; in one run promptcache's picker did 0.73x the exchanges per CPU second of GIE's
at 100 and 1.09x at 400, where GIE's own at 400 did 1.09x too (bench/gateway_hop.py,
docs/endpoint-picker.md, "The 1 KiB gap was the collector", 2026-12-06)."""
MIN_STEP_MILLICORES: Final[int] = 100


def _millicores(cores: float, floor: int) -> int:
    return max(floor, math.ceil(cores / UTILIZATION * 1000 / 50) * 50)  # 50m steps


def picker_millicores(pcd: PromptCacheDeployment) -> int:
    sizing = pcd.spec.gateway.sizing
    cores = PICKER_COST.cores(sizing.requests_per_second, sizing.request_kib)
    return _millicores(cores, MIN_PICKER_MILLICORES)


def promptcache_picker_memory(pcd: PromptCacheDeployment) -> tuple[int, int]:
    """(request, limit) bytes of promptcache's picker, which reads bodies itself (no step in
    front) and holds each up to `front.maxRequestBytes` for up to `front.bodyTimeoutSeconds`
    (picker/boundary). The limit holds the idle picker plus the larger of one maximal body
    or `PICKER_SIZED_BODIES` typical ones, at `PICKER_RSS_PER_BODY_BYTE`; never below the
    2 GiB every picker gets."""
    front, sizing = pcd.spec.front, pcd.spec.gateway.sizing
    bodies = max(front.max_request_bytes, PICKER_SIZED_BODIES * sizing.request_kib * 1024)
    limit = max(2 * 1024**3, PICKER_IDLE_BYTES + PICKER_RSS_PER_BODY_BYTE * bodies)
    return PICKER_IDLE_BYTES, -(-limit // 1024**2) * 1024**2  # whole MiB


def go_memory_limit(limit_bytes: int) -> str:
    """`GOMEMLIMIT` for a container limit (Go reads the `MiB` suffix)."""
    return f"{limit_bytes * GO_MEMORY_LIMIT_PERCENT // 100 // 1024**2}MiB"


def step_millicores(pcd: PromptCacheDeployment) -> int:
    """At most `MAX_GATEWAY_POLICY_WORKERS` cores: one process per core."""
    sizing = pcd.spec.gateway.sizing
    cores = STEP_COST.cores(sizing.requests_per_second, sizing.request_kib)
    return min(_millicores(cores, MIN_STEP_MILLICORES), 1000 * MAX_GATEWAY_POLICY_WORKERS)


def step_workers(pcd: PromptCacheDeployment) -> int:
    """One worker process per core the step is given (a process uses about one)."""
    return max(1, math.ceil(step_millicores(pcd) / 1000))

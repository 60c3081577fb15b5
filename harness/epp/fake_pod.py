"""Stand-in model-server pods for the Endpoint Picker tests: the one stand-in of the project.

The picker scrapes `http://<podIP>:<port>/metrics` every 50 ms and routes by what
it reads, so tests steer it through those numbers (`pod.set(waiting=50)` pins a
value; unpinned values follow the stand-in's real queue and KV cache). The
stand-in lives in `harness.standin` so the cache front's tests, these
tests, the routing benchmark and the demo all use the same model of vLLM.
"""

from __future__ import annotations

from harness.standin import (
    EngineConfig,
    FakePod,
    ServedRequest,
    VllmMetrics,
    render_metrics,
)

__all__ = ["EngineConfig", "FakePod", "ServedRequest", "VllmMetrics", "render_metrics"]

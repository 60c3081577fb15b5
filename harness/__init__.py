"""The test harness: what tests, benches and the demo run beside the product.

Nothing here ships in the images, and the product never imports it (an import contract in
pyproject.toml says so).

- `harness.vllm`: the real engine: vLLM's CPU build installed by `scripts/engine`, tiny
  models made locally, and `vllm serve` as a process;
- `harness.pod`: a rendered model-server pod run as processes, with its probes;
- `harness.standin`: the stand-in engine, only where many engines must run at once (the
  8-pod routing bench, scale, chaos); `e2e/engine/test_standin_conformance.py` holds it to
  the real engine.
"""

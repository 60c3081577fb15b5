"""The test harness: what tests, benches and the demo run beside the product.

Nothing here ships in the images, and the product never imports it (an import contract in
pyproject.toml says so). This `__init__` imports nothing: `harness.localcluster` runs on the
bare system `python3` before any venv exists.

- `harness.localcluster`: the local Kubernetes control plane behind `e2e/cluster` (build,
  PKI, process supervision, state), Python stdlib only;
- `harness.vllm`: the real engine: vLLM's CPU build installed by `scripts/engine`, tiny
  models made locally, and `vllm serve` as a process;
- `harness.pod`: a rendered model-server pod run as processes, with its probes;
- `harness.engine`: those pods on the local control plane (`cluster_pods`), and the
  client the real-engine tests read usage with;
- `harness.epp`: the real Endpoint Pickers, the body-based router, the gateway policy step
  and an Envoy-like ext_proc client, with stand-in pods where many must run;
- `harness.operator`, `harness.pytest_cluster`, `harness.monitoring`: the operator as a
  process, the shared cluster fixtures, the real Prometheus;
- `harness.resources`, `harness.resource_strategies`, `harness.schemas`: resource builders
  and the schemas they are checked against; `harness.net.free_port`;
- `harness.standin`: the stand-in engine, only where many engines must run at once (the
  8-pod routing bench, scale, chaos); `e2e/engine/test_standin_conformance.py` holds it to
  the real engine.
"""

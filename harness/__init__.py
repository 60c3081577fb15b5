"""The test harness: what tests, benches and the demo run beside the product.

Nothing here ships in the images, and the product never imports it (an import contract in
pyproject.toml says so). `harness.vllm` is the real engine: vLLM's CPU build installed by
`scripts/engine`, tiny models made locally, and `vllm serve` as a process.
"""

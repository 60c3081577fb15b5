"""Tests of the data plane on the real engine: vLLM's CPU build behind the real cache front.

Each test runs a rendered model-server pod as processes (`harness.pod.ProcessPod`): the
cache front and `vllm serve` with the container args and env the renderer wrote, probes
included, on a tiny model made locally (`harness.vllm.models`). Greedy decoding
(`temperature: 0`) makes outputs comparable; cached-token counts are the engine's own.
"""

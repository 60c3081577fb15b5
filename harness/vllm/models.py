"""Tiny models made on this machine, cached by their parameters (`tiny_model.py` makes them)."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.vllm.layer import engine_python

HERE = Path(__file__).resolve().parent
MODEL_LAYOUT = 1
"""Bump when tiny_model.py changes what it writes: every cached model is then rebuilt."""


@dataclass(frozen=True)
class TinyModel:
    """The parameters of one tiny model; the same parameters always give the same files.

    Defaults: a Qwen2 with hidden 128, 2 layers, 4 heads and 2 KV heads in float32 (fast
    on CPUs without AVX512-BF16): about 1 KiB of KV cache per token, so a 64 MiB KV cache
    holds 64k tokens."""

    seed: int = 0
    architecture: str = "qwen2"
    vocab_size: int = 2048
    vocab_headroom: int = 64
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 8192
    dtype: str = "float32"

    @property
    def key(self) -> str:
        material = {"params": dataclasses.asdict(self), "layout": MODEL_LAYOUT}
        return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer, every KV head, at the model's dtype."""
        width = 2 if self.dtype in ("bfloat16", "float16") else 4
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * width


def cache_dir() -> Path:
    return Path(os.environ.get("PROMPTCACHE_CACHE_DIR") or Path.home() / ".cache" / "promptcache")


def tiny_model(params: TinyModel | None = None) -> Path:
    """The model folder for `params`, made once per machine (seconds) under the cache."""
    params = params or TinyModel()
    target = cache_dir() / "models" / f"tiny-{params.architecture}-{params.key}"
    return built_once(
        target,
        lambda scratch: [
            str(engine_python()),
            str(HERE / "tiny_model.py"),
            "--out",
            str(scratch),
            "--params",
            json.dumps(dataclasses.asdict(params)),
        ],
    )


def built_once(target: Path, command: Callable[[Path], list[str]]) -> Path:
    """`target`, made by running `command(scratch)` once per machine: two test processes
    never build the same folder, and a build cut short is never taken for a finished one."""
    if (target / ".complete").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / f".{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").is_file():
            return target
        scratch = target.with_name(target.name + ".partial")
        shutil.rmtree(scratch, ignore_errors=True)
        subprocess.run(command(scratch), check=True)
        shutil.rmtree(target, ignore_errors=True)
        scratch.rename(target)
        (target / ".complete").touch()
    return target

"""Random LoRA adapters of the tiny models, made locally and cached by their parameters
(`tiny_adapter.py` makes them with peft)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from harness.vllm.layer import engine_python
from harness.vllm.models import HERE, built_once, cache_dir

ADAPTER_LAYOUT = 1
"""Bump when tiny_adapter.py changes what it writes: every cached adapter is then rebuilt."""


@dataclass(frozen=True)
class TinyAdapter:
    """The parameters of one adapter; with the same base model, the same files.

    `alpha` well above `rank` makes the adapter's delta large next to the random base
    weights, so greedy outputs of the adapter and of its base differ from the first token."""

    seed: int = 0
    rank: int = 8
    alpha: int = 64
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

    def key(self, base: Path) -> str:
        material = {
            "params": dataclasses.asdict(self),
            "base": base.name,
            "layout": ADAPTER_LAYOUT,
        }
        return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]


def tiny_adapter(base: Path, params: TinyAdapter | None = None) -> Path:
    """The adapter folder of `base` for `params`, made once per machine under the cache.

    `base` is a folder `tiny_model` made: its name is its parameters' hash, so it keys
    the adapter too."""
    params = params or TinyAdapter()
    target = cache_dir() / "adapters" / f"lora-{params.key(base)}"
    return built_once(
        target,
        lambda scratch: [
            str(engine_python()),
            str(HERE / "tiny_adapter.py"),
            "--base",
            str(base),
            "--out",
            str(scratch),
            "--params",
            json.dumps(dataclasses.asdict(params)),
        ],
    )

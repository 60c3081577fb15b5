"""Make a deterministic random LoRA adapter of a tiny model: no hub, seconds to build.

`peft` wraps the base model with a `LoraConfig` whose weights are random on both sides
(`init_lora_weights=False`: peft's default makes B zero, an adapter that changes nothing
and so cannot be told from its base by its outputs) and writes the adapter folder
(`adapter_config.json`, `adapter_model.safetensors`) that `vllm serve --lora-modules`
loads. The same parameters give the same bytes; `harness.vllm.adapters` caches each
folder under the parameters' hash.

Runs inside the engine's virtualenv (it needs torch, transformers, peft):

    ENGINE/bin/python harness/vllm/tiny_adapter.py --base MODEL --out DIR --params '{...}'
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def build_adapter(base: Path, params: dict[str, Any], out: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(params["seed"])
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(
        r=params["rank"],
        lora_alpha=params["alpha"],
        target_modules=list(params["target_modules"]),
        lora_dropout=0.0,
        bias="none",
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    wrapped = get_peft_model(model, config)
    wrapped.save_pretrained(out, safe_serialization=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--params", required=True, help="JSON: see harness.vllm.adapters")
    args = parser.parse_args()
    params = json.loads(args.params)
    args.out.mkdir(parents=True, exist_ok=True)
    build_adapter(args.base, params, args.out)
    (args.out / "promptcache-adapter.json").write_text(json.dumps(params, indent=2) + "\n")


if __name__ == "__main__":
    main()

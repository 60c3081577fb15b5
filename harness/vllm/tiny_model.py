"""Make a deterministic tiny chat model on disk: no hub, no download, seconds to build.

A random-weight Qwen2 (or Llama) causal LM and a byte-level BPE tokenizer trained here
on a seeded synthetic corpus, wrapped as a `PreTrainedTokenizerFast` with a ChatML chat
template, written as a Hugging Face model folder that `vllm serve PATH` loads. The same
parameters give the same bytes (fixed seeds, sorted corpus), and `harness.vllm.models`
caches each folder under the parameters' hash, so a machine makes each model once.

Runs inside the engine's virtualenv (it needs torch, transformers, tokenizers); the
harness calls it as a script:

    ENGINE/bin/python harness/vllm/tiny_model.py --out DIR --params '{"seed": 0, ...}'

The weights are random, so greedy outputs are gibberish but deterministic: enough to
compare two paths to the same engine (inline vs referenced embeddings, two tenants) and to
tell two models or an adapter from its base apart by their outputs.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "nu",
    "pe",
    "ra",
    "si",
    "to",
    "ve",
    "zu",
    "an",
    "el",
    "in",
    "or",
    "us",
    "the",
    "and",
    "cache",
    "prompt",
    "token",
    "model",
    "tenant",
    "block",
    "prefix",
    "chat",
]


def corpus(seed: int, lines: int = 4000) -> list[str]:
    """A synthetic, seeded text corpus: words of syllables, digits and punctuation."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [
            "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3)))
            for _ in range(rng.randint(4, 16))
        ]
        out.append(" ".join(words) + rng.choice([".", "?", "!", ",", " 42.", ": yes."]))
    return out


def build_tokenizer(seed: int, vocab_size: int, out: Path) -> int:
    """Train the BPE tokenizer, save it with its chat template; return its real size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return int(tokenizer.get_vocab_size())


def build_model(params: dict[str, Any], tokenizer_size: int, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(params["seed"])
    # Headroom in the embedding table: vLLM adds a <prompt_embeds> token of its own.
    vocab = tokenizer_size + params["vocab_headroom"]
    config = AutoConfig.for_model(
        params["architecture"],
        vocab_size=vocab,
        hidden_size=params["hidden_size"],
        intermediate_size=params["intermediate_size"],
        num_hidden_layers=params["num_layers"],
        num_attention_heads=params["num_heads"],
        num_key_value_heads=params["num_kv_heads"],
        max_position_embeddings=params["max_position_embeddings"],
        tie_word_embeddings=False,
        torch_dtype=params["dtype"],
        eos_token_id=2,
        pad_token_id=0,
        bos_token_id=None,
    )
    model = AutoModelForCausalLM.from_config(config)
    model = model.to(getattr(torch, params["dtype"]))
    model.save_pretrained(out, safe_serialization=True)
    generation = {"eos_token_id": 2, "pad_token_id": 0, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--params", required=True, help="JSON: see harness.vllm.models")
    args = parser.parse_args()
    params = json.loads(args.params)
    args.out.mkdir(parents=True, exist_ok=True)
    size = build_tokenizer(params["seed"], params["vocab_size"], args.out)
    build_model(params, size, args.out)
    (args.out / "promptcache-model.json").write_text(json.dumps(params, indent=2) + "\n")


if __name__ == "__main__":
    main()

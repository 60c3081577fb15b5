"""`vllm serve` flags the operator writes or relies on, and how vLLM's parser spells them.

The renderer writes these names; the API refuses `engine.extraArgs` that would override one
(CEL at the API server, the same pattern in the CLI's validator), so the list lives here once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

VLLM_DEFAULT_BLOCK_SIZE: Final = 16
"""Tokens per KV-cache block when `--block-size` is not given (vLLM 0.33, CUDA)."""
VLLM_DEFAULT_MAX_NUM_SEQS: Final[int] = 256
"""Sequences vLLM runs at once when `--max-num-seqs` is not given; more wait in its queue."""


class VllmFlag:
    """Flags of `vllm serve` (vLLM 0.33 spellings) the renderer writes or the pod relies on."""

    MODEL: Final[str] = "--model"
    CONFIG: Final[str] = "--config"
    SERVED_MODEL_NAME: Final[str] = "--served-model-name"
    HOST: Final[str] = "--host"
    PORT: Final[str] = "--port"
    UDS: Final[str] = "--uds"
    GRPC: Final[str] = "--grpc"
    HEADLESS: Final[str] = "--headless"
    SSL_KEYFILE: Final[str] = "--ssl-keyfile"
    SSL_CERTFILE: Final[str] = "--ssl-certfile"
    ENABLE_PREFIX_CACHING: Final[str] = "--enable-prefix-caching"
    ENABLE_PROMPT_TOKENS_DETAILS: Final[str] = "--enable-prompt-tokens-details"
    API_SERVER_COUNT: Final[str] = "--api-server-count"
    BLOCK_SIZE: Final[str] = "--block-size"
    GPU_MEMORY_UTILIZATION: Final[str] = "--gpu-memory-utilization"
    MAX_MODEL_LEN: Final[str] = "--max-model-len"
    MAX_NUM_SEQS: Final[str] = "--max-num-seqs"
    ENABLE_PROMPT_EMBEDS: Final[str] = "--enable-prompt-embeds"
    TENSOR_PARALLEL_SIZE: Final[str] = "--tensor-parallel-size"
    DISABLE_LOG_STATS: Final[str] = "--disable-log-stats"
    ENABLE_LORA: Final[str] = "--enable-lora"
    LORA_MODULES: Final[str] = "--lora-modules"
    MAX_LORAS: Final[str] = "--max-loras"
    MAX_LORA_RANK: Final[str] = "--max-lora-rank"
    MAX_CPU_LORAS: Final[str] = "--max-cpu-loras"


VLLM_LORA_RANKS: Final[tuple[int, ...]] = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values `--max-lora-rank` accepts (vLLM 0.33 `config/lora.py`, `MaxLoRARanks`)."""
VLLM_DEFAULT_MAX_LORA_RANK: Final[int] = 16
"""`--max-lora-rank` when not given (vLLM 0.33 `LoRAConfig.max_lora_rank`)."""


@dataclass(frozen=True)
class OwnedEngineFlags:
    """Flags `engine.extraArgs` may not carry, in any spelling vLLM's parser accepts."""

    flags: tuple[str, ...]
    """Long spellings, e.g. `--port`."""
    why: str
    """What to do instead; ends the message a user sees."""
    aliases: tuple[str, ...] = ()
    """Single-dash aliases vLLM also registers, e.g. `-tp`."""


OWNED_ENGINE_FLAGS: Final[tuple[OwnedEngineFlags, ...]] = (
    OwnedEngineFlags((VllmFlag.MODEL,), "the operator passes model.name as the model"),
    OwnedEngineFlags(
        (VllmFlag.CONFIG,),
        "a config file could set any flag past these checks; put the flags in extraArgs",
    ),
    OwnedEngineFlags(
        (VllmFlag.SERVED_MODEL_NAME,), "the operator sets it from model.servedModelName"
    ),
    OwnedEngineFlags(
        (
            VllmFlag.HOST,
            VllmFlag.PORT,
            VllmFlag.UDS,
            VllmFlag.GRPC,
            VllmFlag.HEADLESS,
            VllmFlag.SSL_KEYFILE,
            VllmFlag.SSL_CERTFILE,
        ),
        "the operator owns vLLM's listening address: the cache front, the probes and the "
        "InferencePool reach it over plain HTTP",
    ),
    OwnedEngineFlags(
        (VllmFlag.ENABLE_PREFIX_CACHING,),
        "prefix caching is always on: it is what this resource deploys",
    ),
    OwnedEngineFlags(
        (VllmFlag.ENABLE_PROMPT_TOKENS_DETAILS,),
        "always on: the usage headers and the cache hit ratio need the cached-token counts",
    ),
    OwnedEngineFlags(
        (VllmFlag.DISABLE_LOG_STATS,),
        "the Endpoint Picker, the status and the autoscaler read vLLM's metrics",
    ),
    OwnedEngineFlags(
        (VllmFlag.API_SERVER_COUNT,),
        "the operator sets it from engine.apiServerCount",
        aliases=("-asc",),
    ),
    OwnedEngineFlags((VllmFlag.BLOCK_SIZE,), "the operator sets it from engine.blockSize"),
    OwnedEngineFlags(
        (VllmFlag.GPU_MEMORY_UTILIZATION,), "the operator sets it from engine.gpuMemoryUtilization"
    ),
    OwnedEngineFlags((VllmFlag.MAX_MODEL_LEN,), "the operator sets it from engine.maxModelLen"),
    OwnedEngineFlags(
        (VllmFlag.MAX_NUM_SEQS,),
        "the operator sets it from engine.maxNumSeqs (the cache front's concurrency cap "
        "follows it)",
    ),
    OwnedEngineFlags(
        (VllmFlag.ENABLE_PROMPT_EMBEDS,), "the operator sets it from promptEmbeds.enabled"
    ),
    OwnedEngineFlags(
        (VllmFlag.TENSOR_PARALLEL_SIZE,),
        "the operator sets it from model.resources.gpus",
        aliases=("-tp",),
    ),
    OwnedEngineFlags(
        (VllmFlag.ENABLE_LORA, VllmFlag.LORA_MODULES),
        "list the adapters in model.adapters (the Endpoint Picker's LoRA affinity and the "
        "body-based router's mapping are generated from that list)",
    ),
    OwnedEngineFlags(
        (VllmFlag.MAX_LORAS, VllmFlag.MAX_LORA_RANK, VllmFlag.MAX_CPU_LORAS),
        "the operator sets them from engine.maxLoras, engine.maxLoraRank and engine.maxCpuLoras",
    ),
)
"""Every flag the operator writes or relies on, grouped by what to do instead. The API rules
(CEL and the CLI's validator) are generated from this list; the renderer writes the same
`VllmFlag` names."""


def _abbreviations(name: str) -> str:
    """`port` -> `p(o(r(t)?)?)?`: every non-empty prefix, `-` also written `_`."""
    chars = ["[-_]" if c == "-" else c for c in name]
    out = ""
    for c in reversed(chars[1:]):
        out = f"({c}{out})?"
    return chars[0] + out


def owned_flag_pattern(group: OwnedEngineFlags) -> str:
    """One argv item that vLLM would read as one of `group`'s flags (RE2 and Python `re`).

    vLLM 0.33's FlexibleArgumentParser turns `_` into `-` in a `--name` before the first
    `.`, splits `--name=value`, reads `--name.key value` as JSON for `--name`, and is an
    argparse parser with abbreviations on: any unambiguous prefix of a long flag, and of the
    `--no-` form of a boolean, is that flag. An ambiguous prefix makes vLLM exit, so refusing
    every prefix refuses nothing that would have worked.
    """
    longs = "|".join(_abbreviations(f.removeprefix("--")) for f in group.flags)
    forms = [f"--(no[-_])?({longs})([=.].*)?"]
    if group.aliases:
        shorts = "|".join(_abbreviations(a.removeprefix("-")) for a in group.aliases)
        forms.append(f"-({shorts})(=.*)?")
    return "(?s)^(" + "|".join(forms) + ")$"


FLAG_WITH_SPACE_PATTERN: Final[str] = "(?s)^--?[A-Za-z][^= ]* .*$"
"""An argv item like `--max-num-batched-tokens 8192`: argparse reads it as one unknown
argument."""

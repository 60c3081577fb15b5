"""Regenerate tests/embeds/vectors/prompt_embeds_id_v1.json (run only when the
encoding version changes; the point of the file is that ids never drift).

    python -m tests.embeds.make_vectors   # from the checkout root
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.embeds_objects import object_from_vector
from promptcache.embeds import compute_prompt_embeds_id

OUT = Path(__file__).parent / "vectors" / "prompt_embeds_id_v1.json"


def _tq_fields(rows: int, dim: int, bits: int, seed: str, qjl: bool) -> dict[str, Any]:
    elements = rows * dim
    fields: dict[str, Any] = {
        "format": "promptcache-turboquant",
        "version": 1,
        "bits": bits,
        "seed": 12345,
        "shape": [rows, dim],
        "dtype": "bfloat16",
        "norms": {"dtype": "float32", "shape": [rows], "ramp": [0.5, 1.0]},
        "codes": {"dtype": "uint8", "shape": [-(-elements * bits // 8)], "xof": seed + "/codes"},
    }
    if qjl:
        fields["qjl_signs"] = {"dtype": "uint8", "shape": [-(-elements // 8)], "xof": seed + "/qjl"}
        fields["qjl_norms"] = {"dtype": "float32", "shape": [rows], "ramp": [0.125, 0.25]}
    return fields


def vectors() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {
            "name": "float32 2x3 spelled out",
            "kind": "tensor",
            "tensor": {"dtype": "float32", "shape": [2, 3], "ramp": [1.0, 0.0]},
        },
        {
            "name": "bfloat16 1x4x8 ramp",
            "kind": "tensor",
            "tensor": {"dtype": "bfloat16", "shape": [1, 4, 8], "ramp": [0.25, -2.0]},
        },
        {
            "name": "float16 5x16 xof",
            "kind": "tensor",
            "tensor": {"dtype": "float16", "shape": [5, 16], "xof": "v1/float16"},
        },
        {
            "name": "bfloat16 64x4096 xof",
            "kind": "tensor",
            "tensor": {"dtype": "bfloat16", "shape": [64, 4096], "xof": "v1/bf16-large"},
        },
        {
            "name": "bfloat16 512x4096 xof (multithreaded path)",
            "kind": "tensor",
            "tensor": {"dtype": "bfloat16", "shape": [512, 4096], "xof": "v1/bf16-4MiB"},
        },
        {
            "name": "float32 zero-size 0x8",
            "kind": "tensor",
            "tensor": {"dtype": "float32", "shape": [0, 8], "hex": ""},
        },
        {
            "name": "float64 scalar",
            "kind": "tensor",
            "tensor": {"dtype": "float64", "shape": [], "hex": "000000000000f03f"},
        },
        {
            "name": "turboquant 4 bits 3x8",
            "kind": "turboquant",
            "fields": _tq_fields(3, 8, 4, "v1/tq4", qjl=False),
        },
        {
            "name": "turboquant 3 bits + qjl 5x64",
            "kind": "turboquant",
            "fields": _tq_fields(5, 64, 3, "v1/tq3q", qjl=True),
        },
    ]
    for vector in out:
        vector["id"] = compute_prompt_embeds_id(object_from_vector(vector))  # type: ignore[arg-type]
    return out


if __name__ == "__main__":
    OUT.write_text(
        json.dumps({"encoding": "promptcache/prompt-embeds-id/v1", "vectors": vectors()}, indent=1)
        + "\n"
    )
    print(f"wrote {OUT}")

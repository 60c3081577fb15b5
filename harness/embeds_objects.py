"""The torch objects prompt-embeds tests send: seeded random tensors, and the objects the
checked-in identifier test vectors (tests/embeds/vectors) describe.

A vector describes its object without pickles or torch's RNG (neither is stable
across versions or languages): element bytes come from a blake3 XOF of a seed
string, or from a small formula, so a client in another language can rebuild
the same object and check it gets the same id. A seeded tensor needs no such
stability: it only has to be the same within one run.
"""

from __future__ import annotations

from typing import Any

import blake3
import torch

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "uint8": torch.uint8,
}


def seeded_tensor(seed: int, rows: int = 6, dim: int = 32) -> torch.Tensor:
    """A float32 `rows` x `dim` tensor of normal values, the same for the same seed."""
    return torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed))


def xof_bytes(seed: str, length: int) -> bytes:
    """blake3(seed utf-8) extended to `length` bytes."""
    return blake3.blake3(seed.encode("utf-8")).digest(length=length)


def tensor_from_spec(spec: dict[str, Any]) -> torch.Tensor:
    """A tensor whose little-endian row-major element bytes are given by the spec.

    `{"dtype", "shape", "xof": seed}`: bytes = blake3 XOF of the seed string.
    `{"dtype", "shape", "hex": "..."}`: bytes spelled out.
    `{"dtype", "shape", "ramp": [scale, offset]}`: element k = k * scale + offset.
    """
    dtype = _DTYPES[spec["dtype"]]
    shape = tuple(spec["shape"])
    numel = 1
    for d in shape:
        numel *= d
    itemsize = torch.empty((), dtype=dtype).element_size()
    if "ramp" in spec:
        scale, offset = (float(x) for x in spec["ramp"])
        return (torch.arange(numel, dtype=torch.float64) * scale + offset).to(dtype).reshape(shape)
    raw = bytes.fromhex(spec["hex"]) if "hex" in spec else xof_bytes(spec["xof"], numel * itemsize)
    assert len(raw) == numel * itemsize
    flat = (
        torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        if raw
        else torch.empty(0, dtype=torch.uint8)
    )
    return flat.view(dtype).reshape(shape)


def object_from_vector(vector: dict[str, Any]) -> object:
    """The payload a vector describes: a tensor, or a TurboQuant mapping of specs."""
    if vector["kind"] == "tensor":
        return tensor_from_spec(vector["tensor"])
    mapping: dict[str, object] = {}
    for name, value in vector["fields"].items():
        mapping[name] = tensor_from_spec(value) if isinstance(value, dict) else value
    return mapping

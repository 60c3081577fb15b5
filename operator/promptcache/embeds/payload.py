"""What a prompt-embeds payload is once `torch.load` has handed it back.

Two forms travel on the wire (spec/001): a dense tensor, or a
`TurboQuantPayload` mapping. No public definition of the latter exists, so
this module is the definition: field names, types, sizes, and the one
validator every consumer (identifier, decoder) goes through, so that "well
formed" means the same thing everywhere. The format is documented, versioned,
in docs/prompt-embeds.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, NotRequired, TypeAlias, TypedDict

import torch
from torch import Tensor

TURBOQUANT_FORMAT: Final[str] = "promptcache-turboquant"
"""Value of the `format` field: says which mapping this is."""

TURBOQUANT_VERSION: Final[int] = 1
"""Value of the `version` field this code writes and reads."""

TURBOQUANT_MIN_BITS: Final[int] = 1
TURBOQUANT_MAX_BITS: Final[int] = 4
"""Lloyd-Max code widths the codec has tables for (the paper's range)."""

TURBOQUANT_MAX_SEED: Final[int] = 2**63 - 1
"""Seeds are kept within a signed 64-bit integer so every client language can hold one."""

TURBOQUANT_DTYPES: Final[Mapping[str, torch.dtype]] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}
"""Original dtypes a TurboQuant payload may name (prompt embeddings are floating point)."""

_MAX_NDIM: Final[int] = 8


class TurboQuantPayload(TypedDict):
    """A TurboQuant-compressed prompt-embeds tensor, as `torch.save` writes it.

    Field order below is the order the identifier hashes them in.
    """

    format: str
    """Always `TURBOQUANT_FORMAT`."""
    version: int
    """Always `TURBOQUANT_VERSION` for this code."""
    bits: int
    """Bits per coordinate of the Lloyd-Max codes (1..4); the QJL sketch adds one."""
    seed: int
    """Seed of the random rotation (and of the QJL projection), 0..2**63-1."""
    shape: list[int]
    """Original tensor shape; rows = product of all but the last, dim = the last."""
    dtype: str
    """Original dtype name, one of `TURBOQUANT_DTYPES`."""
    norms: Tensor
    """float32 `(rows,)`: each row's L2 norm, kept apart from the unit-vector codes."""
    codes: Tensor
    """uint8 `(ceil(rows*dim*bits/8),)`: codes packed LSB-first, row-major."""
    qjl_signs: NotRequired[Tensor]
    """uint8 `(ceil(rows*dim/8),)`: 1-bit QJL sketch of the residual, LSB-first."""
    qjl_norms: NotRequired[Tensor]
    """float32 `(rows,)`: L2 norm of each row's residual (what the sketch scales by)."""


PromptEmbedsPayload: TypeAlias = Tensor | TurboQuantPayload
"""Every form a prompt_embeds payload can currently take on the wire."""

REQUIRED_FIELDS: Final[tuple[str, ...]] = (
    "format",
    "version",
    "bits",
    "seed",
    "shape",
    "dtype",
    "norms",
    "codes",
)
OPTIONAL_FIELDS: Final[tuple[str, ...]] = ("qjl_signs", "qjl_norms")
TENSOR_FIELDS: Final[frozenset[str]] = frozenset({"norms", "codes", "qjl_signs", "qjl_norms"})


@dataclass(frozen=True, slots=True)
class TurboQuantFields:
    """A validated TurboQuant mapping, fields typed and sizes cross-checked."""

    format: str
    version: int
    bits: int
    seed: int
    shape: tuple[int, ...]
    dtype: str
    norms: Tensor
    codes: Tensor
    qjl_signs: Tensor | None
    qjl_norms: Tensor | None

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1])

    @property
    def dim(self) -> int:
        return self.shape[-1]


def check_dense(tensor: Tensor, what: str) -> None:
    """Refuse tensors whose bytes are not a plain strided buffer we can hash or decode.

    Raises:
        ValueError: for sparse, nested, meta, mkldnn or quantized tensors.
    """
    if tensor.is_nested:
        raise ValueError(f"{what} is a nested tensor; only dense strided tensors are accepted")
    if tensor.layout != torch.strided:
        raise ValueError(
            f"{what} has layout {tensor.layout}; only dense strided tensors are accepted"
        )
    if tensor.is_meta:
        raise ValueError(f"{what} is a meta tensor and has no data")
    if tensor.is_quantized:
        raise ValueError(f"{what} is a quantized tensor; only dense strided tensors are accepted")


def _shown(value: object) -> str:
    """A client-supplied value quoted for an error message, never unboundedly long."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _int_field(payload: Mapping[str, object], name: str, lo: int, hi: int) -> int:
    value = payload[name]
    # bool is an int subclass; a True where a number belongs is a malformed payload.
    if type(value) is not int:
        raise ValueError(f"TurboQuant field {name!r} must be an int, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValueError(f"TurboQuant field {name!r} must be in {lo}..{hi}, got {value}")
    return value


def _tensor_field(
    payload: Mapping[str, object], name: str, dtype: torch.dtype, numel: int
) -> Tensor:
    value = payload[name]
    if not isinstance(value, Tensor):
        raise TypeError(
            f"TurboQuant field {name!r} must be a torch.Tensor, got {type(value).__name__}"
        )
    check_dense(value, f"TurboQuant field {name!r}")
    if value.dtype != dtype:
        raise ValueError(f"TurboQuant field {name!r} must have dtype {dtype}, got {value.dtype}")
    if tuple(value.shape) != (numel,):
        raise ValueError(
            f"TurboQuant field {name!r} must have shape ({numel},), got {tuple(value.shape)}"
        )
    return value


def validate_turboquant(payload: Mapping[str, object]) -> TurboQuantFields:
    """Check a mapping is a well-formed TurboQuant payload and return its fields typed.

    Raises:
        TypeError: if a field that must be a tensor is not one (spec/001).
        ValueError: for anything else that makes the mapping malformed: missing or
            unknown keys, wrong types of scalar fields, unsupported version,
            inconsistent sizes.
    """
    keys = set(payload.keys())
    missing = [name for name in REQUIRED_FIELDS if name not in keys]
    if missing:
        raise ValueError(f"not a TurboQuant payload: missing field(s) {', '.join(missing)}")
    unknown = keys - set(REQUIRED_FIELDS) - set(OPTIONAL_FIELDS)
    if unknown:
        shown = ", ".join(sorted(repr(k) for k in unknown))
        raise ValueError(f"not a TurboQuant payload: unknown field(s) {shown}")
    has_qjl = [name in keys for name in OPTIONAL_FIELDS]
    if any(has_qjl) and not all(has_qjl):
        raise ValueError(
            "TurboQuant fields 'qjl_signs' and 'qjl_norms' come together or not at all"
        )

    if payload["format"] != TURBOQUANT_FORMAT:
        raise ValueError(
            f"TurboQuant field 'format' must be {TURBOQUANT_FORMAT!r}, "
            f"got {_shown(payload['format'])}"
        )
    version = _int_field(payload, "version", 0, TURBOQUANT_MAX_SEED)
    if version != TURBOQUANT_VERSION:
        raise ValueError(
            f"unsupported TurboQuant payload version {version}; "
            f"this code reads {TURBOQUANT_VERSION}"
        )
    bits = _int_field(payload, "bits", TURBOQUANT_MIN_BITS, TURBOQUANT_MAX_BITS)
    seed = _int_field(payload, "seed", 0, TURBOQUANT_MAX_SEED)

    raw_shape = payload["shape"]
    if not isinstance(raw_shape, list | tuple):
        raise ValueError(
            f"TurboQuant field 'shape' must be a list of ints, got {type(raw_shape).__name__}"
        )
    if not 1 <= len(raw_shape) <= _MAX_NDIM:
        raise ValueError(f"TurboQuant field 'shape' must have 1..{_MAX_NDIM} dimensions")
    if any(type(d) is not int or d < 1 for d in raw_shape):
        raise ValueError("TurboQuant field 'shape' must hold positive ints")
    shape = tuple(int(d) for d in raw_shape)

    dtype = payload["dtype"]
    if not isinstance(dtype, str) or dtype not in TURBOQUANT_DTYPES:
        raise ValueError(
            f"TurboQuant field 'dtype' must be one of {', '.join(TURBOQUANT_DTYPES)}, "
            f"got {_shown(dtype)}"
        )

    rows = math.prod(shape[:-1])
    elements = rows * shape[-1]
    norms = _tensor_field(payload, "norms", torch.float32, rows)
    codes = _tensor_field(payload, "codes", torch.uint8, -(-elements * bits // 8))
    qjl_signs = qjl_norms = None
    if all(has_qjl):
        qjl_signs = _tensor_field(payload, "qjl_signs", torch.uint8, -(-elements // 8))
        qjl_norms = _tensor_field(payload, "qjl_norms", torch.float32, rows)
    return TurboQuantFields(
        format=TURBOQUANT_FORMAT,
        version=version,
        bits=bits,
        seed=seed,
        shape=shape,
        dtype=dtype,
        norms=norms,
        codes=codes,
        qjl_signs=qjl_signs,
        qjl_norms=qjl_norms,
    )

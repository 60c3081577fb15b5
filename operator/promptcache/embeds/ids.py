"""Content-addressed identifiers of prompt-embeds payloads (spec/001).

The identifier names the *object* (what `torch.save` was given, what
`torch.load` returns), never its wire bytes: two pickles of the same tensor
differ in zip metadata, and a tensor's memory layout (strides, views, device)
is not part of its content. So we hash a canonical encoding of the object,
version 1, specified byte for byte in docs/prompt-embeds.md:

    MAGIC      = b"promptcache/prompt-embeds-id/v1\\x00"
    tensor     = b"T" u8(len(dtype)) dtype u8(ndim) u64le(dim)*ndim u64le(nbytes) bytes
    turboquant = b"Q" u8(nfields) { u8(len(name)) name value }*   (fixed field order)
    value      = b"i" i64le | b"s" u32le(len) utf8 | b"l" u32le(n) i64le*n | tensor
    id         = "blake3:" + hex(blake3(MAGIC || record))

Element bytes are little-endian, row-major. A contiguous CPU tensor is hashed
straight from its buffer (no copy); large buffers use blake3's threads.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Mapping
from typing import Final

import blake3
import numpy as np
import torch
from torch import Tensor

from promptcache.embeds.idsyntax import PROMPT_EMBEDS_ID_PREFIX
from promptcache.embeds.payload import (
    PromptEmbedsPayload,
    TurboQuantFields,
    check_dense,
    validate_turboquant,
)

ID_ENCODING_MAGIC: Final[bytes] = b"promptcache/prompt-embeds-id/v1\x00"
"""Domain separation and version of the canonical encoding; a new encoding gets a new magic."""

MULTITHREAD_MIN_BYTES: Final[int] = 1 << 20
"""Below this, thread start-up costs more than it saves; above, blake3 uses every core."""

_U64: Final = struct.Struct("<Q")
_I64: Final = struct.Struct("<q")
_U32: Final = struct.Struct("<I")


def _hasher(nbytes: int) -> blake3.blake3:
    if nbytes >= MULTITHREAD_MIN_BYTES:
        return blake3.blake3(max_threads=blake3.blake3.AUTO)
    return blake3.blake3()


def _dtype_name(dtype: torch.dtype) -> bytes:
    return str(dtype).removeprefix("torch.").encode("ascii")


def _element_bytes(tensor: Tensor) -> memoryview:
    """A uint8 view of the tensor's elements, row-major and little-endian.

    Copies only when it must: another device, a non-contiguous layout, a lazy
    conjugate/negation bit, or a big-endian host.
    """
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg().contiguous()
    flat = t.reshape(-1)
    if sys.byteorder != "little" and t.element_size() > 1:  # pragma: no cover - LE hosts
        width = {2: np.int16, 4: np.int32, 8: np.int64}[t.element_size()]
        ints = flat.view(torch.uint8).numpy().view(width)
        return memoryview(ints.byteswap().view(np.uint8))  # type: ignore[arg-type]
    return memoryview(flat.view(torch.uint8).numpy())  # type: ignore[arg-type]


def _tensor_header(tensor: Tensor, nbytes: int) -> bytes:
    name = _dtype_name(tensor.dtype)
    dims = b"".join(_U64.pack(d) for d in tensor.shape)
    return b"T" + bytes((len(name),)) + name + bytes((tensor.dim(),)) + dims + _U64.pack(nbytes)


def _field_name(name: str) -> bytes:
    raw = name.encode("ascii")
    return bytes((len(raw),)) + raw


def _int_value(value: int) -> bytes:
    return b"i" + _I64.pack(value)


def _update_turboquant(hasher: blake3.blake3, fields: TurboQuantFields) -> None:
    tensors: list[tuple[str, Tensor]] = [("norms", fields.norms), ("codes", fields.codes)]
    if fields.qjl_signs is not None and fields.qjl_norms is not None:
        tensors += [("qjl_signs", fields.qjl_signs), ("qjl_norms", fields.qjl_norms)]
    fmt = fields.format.encode("utf-8")
    head = [
        b"Q",
        bytes((6 + len(tensors),)),
        _field_name("format"),
        b"s" + _U32.pack(len(fmt)) + fmt,
        _field_name("version"),
        _int_value(fields.version),
        _field_name("bits"),
        _int_value(fields.bits),
        _field_name("seed"),
        _int_value(fields.seed),
        _field_name("shape"),
        b"l" + _U32.pack(len(fields.shape)) + b"".join(_I64.pack(d) for d in fields.shape),
    ]
    dtype = fields.dtype.encode("utf-8")
    head += [_field_name("dtype"), b"s" + _U32.pack(len(dtype)) + dtype]
    hasher.update(b"".join(head))
    for name, tensor in tensors:
        data = _element_bytes(tensor)
        hasher.update(_field_name(name) + _tensor_header(tensor, data.nbytes))
        hasher.update(data)


def compute_prompt_embeds_id(payload: PromptEmbedsPayload) -> str:
    """Compute the content-addressed identifier of a deserialized prompt_embeds payload.

    Both ends of the wire call this on the same object: the client on what it is
    about to `torch.save`, the server on what `torch.load` handed back, before
    anything is decoded, reshaped or cast.

    Raises:
        TypeError: if `payload` is neither a tensor nor a mapping (`bytes` and `str`
            included: identifiers are defined over the object, never its wire
            bytes), or a TurboQuant field that must be a tensor is not one.
        ValueError: if a mapping is not a well-formed TurboQuant payload, or a tensor
            is not dense and strided (sparse, nested, meta, quantized).
    """
    if isinstance(payload, Tensor):
        check_dense(payload, "prompt_embeds tensor")
        data = _element_bytes(payload)
        hasher = _hasher(data.nbytes)
        hasher.update(ID_ENCODING_MAGIC + _tensor_header(payload, data.nbytes))
        hasher.update(data)
    elif isinstance(payload, Mapping):
        fields = validate_turboquant(payload)  # TypedDict or any loaded dict
        total = sum(
            t.numel() * t.element_size()
            for t in (fields.norms, fields.codes, fields.qjl_signs)
            if t is not None
        )
        hasher = _hasher(total)
        hasher.update(ID_ENCODING_MAGIC)
        _update_turboquant(hasher, fields)
    elif isinstance(payload, bytes | bytearray | memoryview | str):
        raise TypeError(
            f"prompt_embeds identifiers are computed over the deserialized payload, not "
            f"its serialized form; got {type(payload).__name__}: torch.load it first"
        )
    else:
        raise TypeError(
            "prompt_embeds payload must be a torch.Tensor or a TurboQuant mapping, "
            f"got {type(payload).__name__}"
        )
    return PROMPT_EMBEDS_ID_PREFIX + hasher.hexdigest()

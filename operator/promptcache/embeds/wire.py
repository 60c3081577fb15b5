"""Untrusted base64 payloads to objects and back: the only place we `torch.load`.

What clients send is base64 of `torch.save` bytes (vLLM's wire format). Decoding
it is the dangerous step, so it happens here once, the way vLLM itself does it
(strict base64, `weights_only=True`, CPU), under a byte cap, and every failure
becomes a `PayloadDecodeError` with a message fit to show the client.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Callable, Iterator, Mapping

import torch
from torch import Tensor

from promptcache.embeds.archive import check_archive
from promptcache.embeds.errors import (
    PayloadDecodeError,
    PayloadEncodingError,
    PayloadFormatError,
    PayloadTooLargeError,
)
from promptcache.embeds.ids import compute_prompt_embeds_id
from promptcache.embeds.payload import PromptEmbedsPayload

__all__ = [
    "PayloadDecodeError",
    "PayloadEncodingError",
    "PayloadFormatError",
    "PayloadTooLargeError",
    "decode_payload",
    "encode_payload",
    "identify_payload",
    "max_encoded_length",
]


def max_encoded_length(max_bytes: int) -> int:
    """Longest base64 text (with padding) that can decode to at most `max_bytes`."""
    return 4 * -(-max_bytes // 3)


def _tensors(obj: object) -> Iterator[Tensor]:
    if isinstance(obj, Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for value in obj.values():
            if isinstance(value, Tensor):
                yield value


def decode_payload(
    b64: str, *, max_bytes: int, reserve: Callable[[int], None] | None = None
) -> PromptEmbedsPayload:
    """Decode an untrusted base64 `torch.save` payload into a tensor or mapping.

    Checks, in order: the text is a str no longer than base64 of `max_bytes`;
    strict base64 (`validate=True`: no whitespace, no foreign characters, correct
    padding); decoded length within `max_bytes`; the archive is what `torch.save`
    writes (`embeds.archive.check_archive`: stored records, a bounded pickle), and what
    loading it will materialise is passed to `reserve` (which raises to refuse) before
    anything is loaded; `torch.load(weights_only=True,
    map_location="cpu")` succeeds; the result is a tensor or a mapping; no tensor
    in it claims more element bytes than the payload carried (expanded, stride-0
    views would otherwise balloon when made contiguous).

    The structure of a mapping is not checked here: `compute_prompt_embeds_id` (or
    `identify_payload`) does that.

    Raises:
        TypeError: if `b64` is not a str (a programming error, not client input).
        PayloadTooLargeError, PayloadEncodingError, PayloadFormatError: all
            `PayloadDecodeError`, hence `ValueError`.
    """
    if not isinstance(b64, str):
        raise TypeError(f"decode_payload expects the base64 text as str, got {type(b64).__name__}")
    if max_bytes < 0:
        raise ValueError("max_bytes must be non-negative")
    if len(b64) > max_encoded_length(max_bytes):
        raise PayloadTooLargeError(
            f"prompt_embeds payload is {len(b64)} base64 characters; the limit is "
            f"{max_encoded_length(max_bytes)} ({max_bytes} decoded bytes)"
        )
    if not b64:
        raise PayloadEncodingError("prompt_embeds payload is empty")
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise PayloadEncodingError(
            "prompt_embeds payload is not valid base64 (standard alphabet, padded, no whitespace)"
        ) from None
    if len(raw) > max_bytes:
        raise PayloadTooLargeError(
            f"prompt_embeds payload decodes to {len(raw)} bytes; the limit is {max_bytes}"
        )
    materialised = check_archive(raw)
    if reserve is not None:
        reserve(materialised)
    try:
        obj: object = torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
    except Exception as exc:  # any failure of an untrusted load is the client's
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise PayloadFormatError(
            f"prompt_embeds payload is not a loadable torch.save of a tensor: {reason}"
        ) from None
    if not isinstance(obj, Tensor | Mapping):
        raise PayloadFormatError(
            "prompt_embeds payload must be a torch.save of a tensor or a TurboQuant "
            f"mapping, got {type(obj).__name__}"
        )
    for tensor in _tensors(obj):
        if tensor.numel() * tensor.element_size() > len(raw):
            raise PayloadFormatError(
                "prompt_embeds payload holds a tensor view larger than the data it carries"
            )
    return obj  # type: ignore[return-value]  # a Mapping; its fields are checked by the id


def identify_payload(
    b64: str, *, max_bytes: int, reserve: Callable[[int], None] | None = None
) -> tuple[PromptEmbedsPayload, str]:
    """Decode an untrusted payload and compute its identifier, failing only with
    `PayloadDecodeError`.

    The one call a server needs before filing a payload in the cache: a malformed
    TurboQuant mapping or a sparse tensor (the identifier's TypeError/ValueError)
    becomes a `PayloadFormatError` like every other client mistake.
    """
    payload = decode_payload(b64, max_bytes=max_bytes, reserve=reserve)
    try:
        return payload, compute_prompt_embeds_id(payload)
    except (TypeError, ValueError) as exc:
        raise PayloadFormatError(f"invalid prompt_embeds payload: {exc}") from None


def encode_payload(payload: PromptEmbedsPayload) -> str:
    """Serialize a payload the way clients send it: base64 of `torch.save` bytes."""
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return base64.b64encode(buffer.getvalue()).decode("ascii")

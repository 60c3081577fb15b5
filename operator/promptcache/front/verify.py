"""Checking one uploaded prompt-embeds payload before anything trusts it.

Nothing reaches the cache unverified (spec/000 leaves that to the caller):
strict base64 under a size cap, `torch.load(weights_only=True)`, the
identifier recomputed from the loaded object (spec/001), and the shape vLLM
will accept. TurboQuant payloads are decoded here to the dense tensor vLLM
understands. This is CPU work; the front runs it in a thread pool, never on
the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import torch

from promptcache.embeds.payload import TURBOQUANT_DTYPES, validate_turboquant
from promptcache.embeds.turboquant import decode as turboquant_decode
from promptcache.embeds.wire import encode_payload, identify_payload

DENSIFY_FACTOR: Final = 6
"""Densifying a TurboQuant payload holds, at its peak, the dense tensor, its
`torch.save` bytes (twice: buffer and copy) and its base64 (bytes, then str):
about 1 + 2 + 4/3 + 4/3 times the dense size; rounded up."""


VLLM_MAX_EMBED_DECODE_BYTES: Final = 2 * 1024**3
"""vLLM's `VLLM_MAX_EMBED_DECODE_BYTES` default: it refuses larger dense embeds anyway."""


class PayloadError(ValueError):
    """A payload the front refuses; the message says what is wrong with it."""


@dataclass(frozen=True, slots=True)
class Verified:
    """A payload that loaded, hashed and passed the shape checks."""

    identifier: str
    turboquant: bool
    forward: str
    """What vLLM receives: the payload as sent, or for TurboQuant its dense re-encoding."""


def _check_dense(tensor: torch.Tensor) -> None:
    shape = tuple(tensor.shape)
    ok_rank = len(shape) == 2 or (len(shape) == 3 and shape[0] == 1)
    if not ok_rank or tensor.numel() == 0 or not tensor.is_floating_point():
        raise PayloadError(
            "prompt_embeds payload must be a non-empty floating-point tensor of shape "
            "(num_tokens, hidden_size) or (1, num_tokens, hidden_size), got "
            f"{str(tensor.dtype).removeprefix('torch.')} {list(shape)}"
        )


def verify_payload(
    b64: str,
    *,
    max_bytes: int,
    dense_dtype: str,
    reserve: Callable[[int], None] | None = None,
) -> Verified:
    """Load, identify and (for TurboQuant) densify one base64 payload.

    `reserve(n)` is called before loading with the bytes loading will materialise
    (from the archive's records and pickle, `embeds.archive`), and before densifying
    with the bytes the dense form will take (computed from the payload's header, not
    by decoding); it raises to refuse. The dense tensor is also capped at
    `max_bytes * 3` (its base64 must fit the forwarded body) and at vLLM's own 2 GiB
    densify cap.

    Raises:
        PayloadError: or the library's `PayloadDecodeError` (both `ValueError`),
            with a message fit for the client.
    """
    obj, identifier = identify_payload(b64, max_bytes=max_bytes, reserve=reserve)
    if isinstance(obj, torch.Tensor):
        _check_dense(obj)
        return Verified(identifier=identifier, turboquant=False, forward=b64)
    try:
        dtype = None if dense_dtype == "auto" else TURBOQUANT_DTYPES[dense_dtype]
        fields = validate_turboquant(obj)
        target = TURBOQUANT_DTYPES[fields.dtype] if dtype is None else dtype
        dense_bytes = fields.rows * fields.dim * target.itemsize
        limit = min(max_bytes * 3, VLLM_MAX_EMBED_DECODE_BYTES)
        if dense_bytes > limit:
            raise PayloadError(
                f"prompt_embeds TurboQuant payload decodes to {dense_bytes} bytes "
                f"({fields.rows} x {fields.dim} {str(target).removeprefix('torch.')}); "
                f"the limit is {limit}"
            )
        if reserve is not None:
            reserve(DENSIFY_FACTOR * dense_bytes)
        dense = turboquant_decode(obj, dtype, max_dense_bytes=limit)
    except (TypeError, ValueError) as exc:
        raise PayloadError(
            f"prompt_embeds payload could not be decoded from TurboQuant: {exc}"
        ) from None
    _check_dense(dense)
    return Verified(identifier=identifier, turboquant=True, forward=encode_payload(dense))

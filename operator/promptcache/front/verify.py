"""Checking one uploaded prompt-embeds payload before anything trusts it.

Nothing reaches the cache unverified (spec/000 leaves that to the caller):
strict base64 under a size cap, `torch.load(weights_only=True)`, the
identifier recomputed from the loaded object (spec/001), and the shape vLLM
will accept. TurboQuant payloads are decoded here to the dense tensor vLLM
understands. This is CPU work; the front runs it in a thread pool, never on
the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from promptcache.embeds.payload import TURBOQUANT_DTYPES
from promptcache.embeds.turboquant import decode as turboquant_decode
from promptcache.embeds.wire import encode_payload, identify_payload


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


def verify_payload(b64: str, *, max_bytes: int, dense_dtype: str) -> Verified:
    """Load, identify and (for TurboQuant) densify one base64 payload.

    Raises:
        PayloadError: or the library's `PayloadDecodeError` (both `ValueError`),
            with a message fit for the client.
    """
    obj, identifier = identify_payload(b64, max_bytes=max_bytes)
    if isinstance(obj, torch.Tensor):
        _check_dense(obj)
        return Verified(identifier=identifier, turboquant=False, forward=b64)
    try:
        dtype = None if dense_dtype == "auto" else TURBOQUANT_DTYPES[dense_dtype]
        dense = turboquant_decode(obj, dtype)
    except (TypeError, ValueError) as exc:
        raise PayloadError(
            f"prompt_embeds payload could not be decoded from TurboQuant: {exc}"
        ) from None
    _check_dense(dense)
    return Verified(identifier=identifier, turboquant=True, forward=encode_payload(dense))

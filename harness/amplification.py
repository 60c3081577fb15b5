"""Small requests that ask the front to materialise far more memory than they carry.

Shared by the memory test (`test_front_memory.py`, RSS of a real front process)
and `bench/front_overhead.py` (peak RSS under these requests). Each attack is
a few MB on the wire; in the front before its memory budget each one grew the
process by hundreds of MB to GBs before any 413.
"""

from __future__ import annotations

import base64
import io
import json
import zlib
from dataclasses import dataclass, field

import torch

from promptcache.embeds.payload import TURBOQUANT_FORMAT, TURBOQUANT_VERSION
from promptcache.embeds.wire import identify_payload

JSON = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class Attack:
    """One request (after its set-up requests) and the statuses that mean "refused in time"."""

    name: str
    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=lambda: dict(JSON))
    setup: tuple[bytes, ...] = ()
    """Bodies POSTed to /v1/completions first (uploads the attack then references)."""
    refused: frozenset[int] = frozenset({400, 413, 415})


def dense_payload(tokens: int, hidden: int) -> str:
    buffer = io.BytesIO()
    torch.save(torch.ones(tokens, hidden, dtype=torch.float16), buffer)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def turboquant_bomb(rows: int, dim: int, bits: int = 1) -> str:
    """A well-formed 1-bit TurboQuant payload: decodes to 32x its size in float32."""
    payload = {
        "format": TURBOQUANT_FORMAT,
        "version": TURBOQUANT_VERSION,
        "bits": bits,
        "seed": 0,
        "shape": [rows, dim],
        "dtype": "float32",
        "norms": torch.ones(rows, dtype=torch.float32),
        "codes": torch.zeros(-(-rows * dim * bits // 8), dtype=torch.uint8),
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _completion(embeds: object) -> bytes:
    return json.dumps({"model": "m", "prompt_embeds": embeds, "max_tokens": 1}).encode()


def _gzip_prompt(size: int) -> bytes:
    """A gzip body that inflates to a JSON request of about `size` bytes."""
    z = zlib.compressobj(1, zlib.DEFLATED, 31)  # 31: gzip framing
    chunk = b"0" * (1 << 20)
    parts = [z.compress(b'{"model":"m","prompt":"')]
    parts += [z.compress(chunk) for _ in range(size >> 20)]
    parts += [z.compress(b'"}'), z.flush()]
    return b"".join(parts)


def attacks(max_body_bytes: int) -> list[Attack]:
    """The amplification classes of issue 11, sized for a front accepting `max_body_bytes`."""
    payload = dense_payload(1024, 1024)  # 2 MiB fp16, ~2.8 MB base64
    _, identifier = identify_payload(payload, max_bytes=1 << 30)
    rows = max(1, (max_body_bytes // 2) * 8 // 1024)  # codes fill about half the body
    bomb = turboquant_bomb(rows, 1024)
    expansion = b'{"model":"m","prompt":[' + b",".join([b"{}"] * (max_body_bytes // 4)) + b"]}"
    inflated = 8 * max_body_bytes
    return [
        Attack(
            "one cached payload referenced 1000 times",
            "/v1/completions",
            _completion([identifier] * 1000),
            setup=(_completion(payload),),
        ),
        Attack("TurboQuant 1-bit payload, 32x when decoded", "/v1/completions", _completion(bomb)),
        Attack(
            f"gzip body, {inflated // max_body_bytes}x the body limit when inflated",
            "/v1/completions",
            _gzip_prompt(inflated),
            headers={**JSON, "Content-Encoding": "gzip"},
        ),
        Attack("JSON of empty objects (~25x when parsed)", "/v1/completions", expansion),
    ]

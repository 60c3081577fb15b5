"""Decoders inside payloads: what `torch.load` would materialise is known, and charged,
before it runs; anything `torch.save` of a tensor or TurboQuant mapping does not write is
refused with the payload's own error (the front answers it with `invalid_prompt_embeds`).
"""

from __future__ import annotations

import base64
import io
import pickle
import re
import time
import zipfile

import pytest
import torch

from promptcache.embeds import encode_payload
from promptcache.embeds.archive import (
    MAX_PICKLE_OPCODES,
    OBJECT_BYTES_PER_OPCODE,
    check_archive,
)
from promptcache.embeds.errors import PayloadFormatError
from promptcache.embeds.turboquant import encode as turboquant_encode
from promptcache.embeds.wire import decode_payload

CAP = 64 * 1024 * 1024
NARROW = "is not what torch.save of a tensor or a TurboQuant mapping writes"


def saved(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def rezip(
    raw: bytes,
    *,
    compress: int = zipfile.ZIP_STORED,
    extra: dict[str, bytes] | None = None,
    drop: str | None = None,
) -> bytes:
    """The same records, written again by Python's zipfile (compressed if asked)."""
    source = zipfile.ZipFile(io.BytesIO(raw))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=compress) as target:
        for info in source.infolist():
            if drop and info.filename.endswith(drop):
                continue
            target.writestr(info.filename, source.read(info))
        for name, data in (extra or {}).items():
            target.writestr(name, data)
    return out.getvalue()


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def test_what_torch_save_writes_is_accepted_and_costed() -> None:
    dense = torch.randn(16, 32)
    cost = check_archive(saved(dense))
    assert (
        dense.numel() * 4
        <= cost
        <= dense.numel() * 4 + MAX_PICKLE_OPCODES * OBJECT_BYTES_PER_OPCODE
    )
    mapping = turboquant_encode(torch.randn(8, 64), bits=2, seed=3)
    assert check_archive(saved(mapping)) > 0


def test_the_charge_is_made_before_loading_and_can_refuse() -> None:
    reserved: list[int] = []

    def refuse(n: int) -> None:
        reserved.append(n)
        raise MemoryError("budget")

    with pytest.raises(MemoryError):
        decode_payload(encode_payload(torch.ones(64, 64)), max_bytes=CAP, reserve=refuse)
    assert reserved
    assert reserved[0] >= 64 * 64 * 4


def test_a_deflated_bomb_is_refused_before_it_expands() -> None:
    """1000:1: 64 MiB of zeros deflate to about 64 KiB; refused on its bytes."""
    bomb = rezip(saved(torch.zeros(4096, 4096)), compress=zipfile.ZIP_DEFLATED)
    assert len(bomb) < 200_000
    started = time.perf_counter()
    with pytest.raises(PayloadFormatError, match=re.escape(NARROW) + ".*compressed"):
        decode_payload(b64(bomb), max_bytes=CAP)
    assert time.perf_counter() - started < 1.0


def test_a_local_header_claiming_deflate_is_refused() -> None:
    raw = bytearray(saved(torch.ones(4, 4)))
    info = zipfile.ZipFile(io.BytesIO(bytes(raw))).infolist()[0]
    raw[info.header_offset + 8 : info.header_offset + 10] = (8).to_bytes(2, "little")
    with pytest.raises(PayloadFormatError, match="local header"):
        check_archive(bytes(raw))


def test_a_pickle_of_many_tiny_objects_is_refused_unloaded() -> None:
    """Allowed by weights_only, costly to load: refused by its opcode count."""
    bomb = saved([[i] for i in range(200_000)])
    started = time.perf_counter()
    with pytest.raises(PayloadFormatError, match=re.escape(NARROW)):
        decode_payload(b64(bomb), max_bytes=CAP)
    assert time.perf_counter() - started < 1.0


def test_an_opcode_dense_small_pickle_is_refused() -> None:
    many = saved({"k": [0] * (MAX_PICKLE_OPCODES * 2)})
    with pytest.raises(PayloadFormatError, match=r"opcodes|data\.pkl has"):
        check_archive(many)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"PK\x05\x06" + b"\x00" * 18, "one folder"),
        (pickle.dumps([1, 2, 3]), "not a zip archive"),
        (rezip(saved(torch.ones(2)), extra={"archive/extra.bin": b"x"}), "unexpected record"),
        (rezip(saved(torch.ones(2)), drop="data.pkl"), "no data.pkl"),
        (rezip(saved(torch.ones(2)), extra={"other/data.pkl": b"x"}), "one folder"),
        (saved([torch.ones(1) for _ in range(9)]), "storages"),
    ],
    ids=["empty-zip", "legacy-pickle", "extra-record", "no-pickle", "two-folders", "storages"],
)
def test_archives_torch_save_does_not_write_are_refused(raw: bytes, why: str) -> None:
    with pytest.raises(PayloadFormatError, match=why):
        check_archive(raw)

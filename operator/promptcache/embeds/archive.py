"""What a `torch.save` archive will cost to load, decided before `torch.load` runs.

`torch.load(weights_only=True)` refuses code, but not cost: a zip record stored
deflate-compressed expands about 1000:1, and a pickle of millions of tiny objects (lists,
ints, strings are all allowed) takes hundreds of MB and seconds of CPU. So the payload
format is narrowed to what `torch.save` of a dense tensor or of a TurboQuant mapping
writes, and checked on its bytes alone:

- a zip archive, every record *stored* (not compressed: `torch.save` never compresses),
  in the central directory and in its local header alike, no name twice, all under one
  folder, with only the record names `torch.save` writes (`data.pkl`, `data/<n>`,
  `byteorder`, `version`, `.format_version`, `.storage_alignment`,
  `.data/serialization_id`, `.data/version`);
- a `data.pkl` of at most `MAX_PICKLE_BYTES` bytes and `MAX_PICKLE_OPCODES` opcodes
  (counted by `pickletools.genops`, which only reads), at most `MAX_STORAGES` storages.

`check_archive` returns what loading will materialise: every storage record's bytes (each
is read whole into one storage) plus a fixed allowance per pickle opcode for the objects
it may build. Callers charge that to their memory budget before loading. Torch-free.
"""

from __future__ import annotations

import io
import pickletools
import re
import struct
import zipfile
from typing import Final

from promptcache.embeds.errors import PayloadFormatError

MAX_PICKLE_BYTES: Final[int] = 64 * 1024
"""A dense tensor's `data.pkl` is about 150 bytes, a TurboQuant mapping's about 400."""
MAX_PICKLE_OPCODES: Final[int] = 4096
"""A dense tensor's pickle has about 40 opcodes, a TurboQuant mapping's about 100."""
MAX_STORAGES: Final[int] = 8
"""A dense tensor has one storage, a TurboQuant mapping at most four."""
MAX_METADATA_RECORD_BYTES: Final[int] = 256
OBJECT_BYTES_PER_OPCODE: Final[int] = 256
"""Memory one pickle opcode may build at most (a small object and its memo entry),
rounded up."""

_METADATA: Final = frozenset(
    {
        "byteorder",
        "version",
        ".format_version",
        ".storage_alignment",
        ".data/serialization_id",
        ".data/version",
    }
)
_STORAGE: Final = re.compile(r"data/[0-9]{1,9}")
_LOCAL_HEADER: Final = struct.Struct("<4sHHH")
_LOCAL_MAGIC: Final = b"PK\x03\x04"


def _refuse(why: str) -> PayloadFormatError:
    return PayloadFormatError(
        f"prompt_embeds payload is not what torch.save of a tensor or a TurboQuant mapping "
        f"writes: {why}"
    )


def check_archive(raw: bytes) -> int:
    """The bytes loading `raw` with `torch.load` will materialise, or PayloadFormatError."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(raw))
        infos = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError):
        raise _refuse("not a zip archive (the legacy format is not accepted)") from None
    names = [info.filename for info in infos]
    if len(set(names)) != len(names):
        raise _refuse("a record name appears twice")
    prefixes = {name.split("/", 1)[0] for name in names}
    if len(prefixes) != 1 or any("/" not in name for name in names):
        raise _refuse("records are not all in one folder")
    (prefix,) = prefixes
    storages = 0
    storage_bytes = 0
    pickle_info: zipfile.ZipInfo | None = None
    for info in infos:
        _check_stored(raw, info)
        name = info.filename[len(prefix) + 1 :]
        if name == "data.pkl":
            pickle_info = info
        elif _STORAGE.fullmatch(name):
            storages += 1
            storage_bytes += info.file_size
        elif name in _METADATA:
            if info.file_size > MAX_METADATA_RECORD_BYTES:
                raise _refuse(f"record {name!r} has {info.file_size} bytes")
        else:
            raise _refuse(f"unexpected record {name[:60]!r}")
    if pickle_info is None:
        raise _refuse("no data.pkl record")
    if storages > MAX_STORAGES:
        raise _refuse(f"{storages} storages (at most {MAX_STORAGES})")
    if pickle_info.file_size > MAX_PICKLE_BYTES:
        raise _refuse(f"data.pkl has {pickle_info.file_size} bytes (at most {MAX_PICKLE_BYTES})")
    opcodes = _count_opcodes(archive.read(pickle_info))
    return storage_bytes + opcodes * OBJECT_BYTES_PER_OPCODE


def _check_stored(raw: bytes, info: zipfile.ZipInfo) -> None:
    if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
        raise _refuse(f"record {info.filename[:60]!r} is compressed (torch.save stores records)")
    if info.flag_bits & 0x1:
        raise _refuse("an encrypted record")
    # The local header is what a second zip reader (torch's) may believe: same method.
    header = raw[info.header_offset : info.header_offset + _LOCAL_HEADER.size]
    if len(header) != _LOCAL_HEADER.size:
        raise _refuse("a record's local header is missing")
    magic, _version, _flags, method = _LOCAL_HEADER.unpack(header)
    if magic != _LOCAL_MAGIC or method != zipfile.ZIP_STORED:
        raise _refuse(f"record {info.filename[:60]!r} is compressed in its local header")


def _count_opcodes(data: bytes) -> int:
    count = 0
    try:
        for _ in pickletools.genops(data):
            count += 1
            if count > MAX_PICKLE_OPCODES:
                raise _refuse(f"data.pkl has more than {MAX_PICKLE_OPCODES} pickle opcodes")
    except PayloadFormatError:
        raise
    except Exception:  # genops on hostile bytes: any failure is a malformed pickle
        raise _refuse("data.pkl is not a well-formed pickle") from None
    return count

"""HMAC-SHA256 under one key, keyed once: for a signature checked on every request.

`hmac.digest(key, message, "sha256")` keys a fresh HMAC on each call: it hashes the padded
key twice (two SHA-256 compressions) before the message, and builds an OpenSSL context to
do it, about 2 µs a call here. A process that checks one key's signatures on every request
(the cache front, the picker's prediction: `tenancy.prediction`) can absorb the padded keys,
and a fixed domain prefix, once (RFC 2104's inner and outer states) and copy the two states
per message: the same digest in under half the time. The picker's Go side does the same
(`picker/tenancy.MAC`).

    mac = KeyedMac(key, prefix=b"domain\\0")
    assert mac.digest(b"text") == hmac.digest(key, b"domain\\0" + b"text", "sha256")

The states are only copied after construction, never updated, so one `KeyedMac` may be
shared by threads (a hash object's `copy` takes its own lock).
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable
from typing import Final, Protocol

_BLOCK: Final[int] = 64
"""SHA-256's block: HMAC pads (or first hashes) the key to it."""
_IPAD: Final[bytes] = bytes(b ^ 0x36 for b in range(256))
_OPAD: Final[bytes] = bytes(b ^ 0x5C for b in range(256))


class _Hash(Protocol):
    def copy(self) -> _Hash: ...
    def update(self, data: bytes, /) -> None: ...
    def digest(self) -> bytes: ...


def _builtin_sha256() -> Callable[[bytes], _Hash]:
    """CPython's own SHA-256 (`_sha2` from 3.12, `_sha256` before), else hashlib's.

    Not OpenSSL's: copying an OpenSSL hash duplicates an EVP context (an allocation and a
    provider call) and its code is far from the interpreter's; in the front, among a
    request's other work, that was most of the MAC's cost. The built-in copies a small
    struct. The same digest either way (the tests hold it equal to `hmac.digest`)."""
    for name in ("_sha2", "_sha256"):
        try:
            constructor: Callable[[bytes], _Hash] = importlib.import_module(name).sha256
        except (ImportError, AttributeError):
            continue
        return constructor
    return hashlib.sha256


_SHA256: Final[Callable[[bytes], _Hash]] = _builtin_sha256()


class KeyedMac:
    """HMAC-SHA256 under `key` of `prefix` + each message."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes, prefix: bytes = b"") -> None:
        if len(key) > _BLOCK:
            key = hashlib.sha256(key).digest()
        padded = key.ljust(_BLOCK, b"\x00")
        self._inner = _SHA256(padded.translate(_IPAD))
        self._inner.update(prefix)
        self._outer = _SHA256(padded.translate(_OPAD))

    def digest(self, message: bytes) -> bytes:
        """HMAC-SHA256(key, prefix + message)."""
        inner = self._inner.copy()
        inner.update(message)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()

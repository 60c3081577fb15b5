"""One reading of a request's headers and JSON body, shared by the cache front and the
gateway's policy step, in the form the next parser reads the same way.

Both processes decide on what they parse here, and the policy step forwards the body
`encode_body` writes: UTF-8, every object member named once, no spelling of a field the
policy acts on other than its own. That matters because the Endpoint Picker decodes the
body with Go's `encoding/json`, which reads differently from Python's `json`:

- keys match struct fields case-insensitively, with Unicode simple folding
  (`"CACHE_SALT"`, `"cache_\\u017falt"` (long s) and `"\\u212a"` for `k` all reach
  `cache_salt`), and a later member wins, even one that only folds to the name;
- invalid UTF-8 becomes U+FFFD and a lone surrogate escape becomes U+FFFD, where Python
  refuses the first and keeps the second;
- a BOM or a UTF-16 body does not parse at all (Python's `json.loads` accepts both);
- `NaN`, `Infinity` are not JSON (Python accepts them, and writes them back).

So the body is refused (HTTP 400, a stable code) unless it is strict UTF-8 without a BOM,
names each member of every object once, has no two top-level members whose names fold
together (nor one folding to a field the policy reads without being it), and holds only
finite numbers Python can hold. Headers are read the way aiohttp reads them (bytes as
UTF-8 with surrogate escapes) and checked by `check_headers`, so both processes refuse the
same header sets with the same errors.

    >>> body = parse_body(b'{"model":"m","cache_salt":"x"}', acted_on=POLICY_FIELDS)
    >>> encode_body(body)
    b'{"model":"m","cache_salt":"x"}'
"""

from __future__ import annotations

import contextlib
import functools
import json
import json.decoder
import json.scanner
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from multidict import CIMultiDict, MultiMapping

from promptcache.contract import (
    CACHE_SALT_FIELD,
    PROMPT_CACHE_KEY_FIELD,
    PROMPT_CACHE_MAX_LEN_FIELD,
    SESSION_USER_FIELD,
)
from promptcache.contract.front import (
    VLLM_ENGINE_STATE_FIELDS,
    VLLM_PRIORITY_FIELD,
    VLLM_REQUEST_ID_FIELD,
)
from promptcache.tenancy import errors
from promptcache.tenancy.errors import FrontError
from promptcache.tenancy.policy import has_lone_surrogate

GO_FOLDS_TO_ASCII: Final[dict[str, str]] = {"\u017f": "S", "\u212a": "K"}
"""Every non-ASCII rune whose Go fold (`encoding/json`'s `foldRune`: the smallest rune of
its `unicode.SimpleFold` orbit) is ASCII; found by enumerating all runes with Go (a test
re-checks this with the Go toolchain)."""

POLICY_FIELDS: Final[frozenset[str]] = frozenset(
    {
        CACHE_SALT_FIELD,
        PROMPT_CACHE_KEY_FIELD,
        PROMPT_CACHE_MAX_LEN_FIELD,
        SESSION_USER_FIELD,
        VLLM_PRIORITY_FIELD,
        VLLM_REQUEST_ID_FIELD,
        "stream",
        "stream_options",
        # what the Endpoint Picker reads to route (its request structs' fields)
        "model",
        "messages",
        "prompt",
        "input",
        "items",
        "prompt_embeds",
        *VLLM_ENGINE_STATE_FIELDS,
    }
)
"""Top-level fields either process acts on, or the picker reads; with the isolation field
(a setting) they may appear in no other spelling."""

ONE_HEADER: Final[tuple[str, ...]] = (
    "Content-Type",
    "Content-Encoding",
    "Content-Length",
    "Transfer-Encoding",
)


def go_fold(name: str) -> str:
    """`name` as Go's `encoding/json` folds a key to match it against a field name.

    Exact for every name that folds to ASCII (the only ones that can match this project's
    field names); other non-ASCII runes are kept as they are."""
    if name.isascii():
        return name.upper()
    return "".join(GO_FOLDS_TO_ASCII.get(c, c.upper() if c.isascii() else c) for c in name)


def header_multidict(entries: Iterable[tuple[str, bytes]]) -> CIMultiDict[str]:
    """Header entries as aiohttp presents them: every entry kept, bytes read as UTF-8 with
    surrogate escapes (so bytes that are not UTF-8 are seen, and refused, as the front
    refuses them)."""
    return CIMultiDict((k, v.decode("utf-8", "surrogateescape")) for k, v in entries)


def check_headers(headers: MultiMapping[str]) -> None:
    """Refuse header sets vLLM or the front would read differently from what was checked."""
    for name, value in headers.items():
        if not value.isascii() and has_lone_surrogate(value):
            raise FrontError(
                400,
                errors.INVALID_HEADER,
                f"the {name} header is not valid UTF-8; send header values as ASCII",
                param=name,
            )
    for name in ONE_HEADER:
        if len(headers.getall(name, ())) > 1:
            raise FrontError(
                400, errors.DUPLICATE_HEADER, f"send one {name} header, not several", param=name
            )
    encoding = headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise FrontError(
            415,
            errors.UNSUPPORTED_CONTENT_ENCODING,
            f"Content-Encoding {encoding!r} is not accepted: send the body uncompressed "
            "(vLLM does not decode request bodies either)",
            param="Content-Encoding",
        )


def check_json_media_type(headers: MultiMapping[str]) -> None:
    # vLLM: lower-case, cut at ';', must be application/json (validate_json_request)
    shown = headers.get("Content-Type")
    media = (shown or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise FrontError(
            415,
            errors.UNSUPPORTED_MEDIA_TYPE,
            f"this endpoint takes a JSON body: send Content-Type: application/json (got {shown!r})"
            if shown
            else "this endpoint takes a JSON body: send Content-Type: application/json",
            param="Content-Type",
        )


class JsonScan:
    """Counts of a JSON body's structural bytes, taken piece by piece as the body arrives.

    What parsing will cost (`charge`) and where it should run (`work`) come from them.
    Counted at once, a 32 MiB body held the event loop 145 ms (seven `bytes.count`
    passes); counted per piece as it is read, no single step holds it long.
    """

    __slots__ = ("braces", "brackets", "colons", "commas", "quotes", "size")

    def __init__(self) -> None:
        self.size = self.quotes = self.commas = self.braces = self.brackets = self.colons = 0

    @classmethod
    def of(cls, raw: bytes | bytearray) -> JsonScan:
        scan = cls()
        scan.add(raw)
        return scan

    def add(self, piece: bytes | bytearray) -> None:
        self.size += len(piece)
        self.quotes += piece.count(b'"')
        self.commas += piece.count(b",")
        self.braces += piece.count(b"{")
        self.brackets += piece.count(b"[")
        self.colons += piece.count(b":")

    @property
    def charge(self) -> int:
        """Bytes `json.loads` of the body may take.

        Parsed JSON is far larger than its text where the text is dense with small
        values (`[{},{},...]` is about 25x, measured): the charge adds, per structural
        character, the size of the object it can open. Measured (tracemalloc, CPython
        3.11) to stay above the real peak for lists of ints, floats, strings, objects,
        arrays, large objects and plain text.
        """
        return (
            2 * self.size
            + 40 * self.quotes
            + 48 * self.commas
            + 160 * self.braces
            + 64 * self.brackets
            + 24 * self.colons
        )

    @property
    def tokens(self) -> int:
        """Separators: what parsing costs per value."""
        return self.commas + self.colons

    def work(self) -> JsonWork:
        """Where parsing the body (and encoding what it holds) should run."""
        off_loop = self.size >= OFFLOAD_BYTES or self.tokens > LOOP_TOKENS
        return JsonWork(off_loop=off_loop, interruptible=off_loop and self.tokens > DENSE_TOKENS)


def json_charge(raw: bytes | bytearray) -> int:
    """Bytes `json.loads(raw)` may take (`JsonScan.charge`)."""
    return JsonScan.of(raw).charge


class _DuplicateError(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise _DuplicateError(name)
            seen.add(name)
    return out


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {text[:40]} is too large for a 64-bit float")
    return value


def _shown(name: str) -> str:
    return repr(name[:64])


DENSE_TOKENS: Final[int] = 50_000
"""Bodies worked on off the event loop *in a thread* with more JSON separators than this are
parsed and encoded by the pure-Python scanner and encoder: slower, but they release the GIL
every few milliseconds, so the thread never stalls the event loop (the C parser holds the
GIL for a whole body: about 2 s for 15 MiB of small objects, measured). Below it the C
parser takes a few milliseconds at most."""

LOOP_TOKENS: Final[int] = 10_000
"""Bodies with at most this many separators (and under `OFFLOAD_BYTES`) are parsed and
encoded on the event loop by the C parser, in about a millisecond. Bytes alone do not bound
the work: 255 KiB of `[1,1,...]` took 200 ms to parse and 70 ms to encode by the pure-Python
scanner on the loop (measured), which any tenant could repeat."""

OFFLOAD_BYTES: Final[int] = 256 * 1024
"""Bodies this large are worked on off the event loop whatever their density."""


@dataclass(frozen=True, slots=True)
class JsonWork:
    """Where a body's parse and re-encoding run: on the event loop only when they are
    cheap; off it (a thread of the front's decode pool, a worker process of the step's)
    otherwise, and in a thread by the interruptible pure-Python scanner when dense."""

    off_loop: bool
    interruptible: bool


def json_work(raw: bytes | bytearray) -> JsonWork:
    """Where parsing `raw` (and encoding what it holds) should run (`JsonWork`)."""
    return JsonScan.of(raw).work()


_JOIN_BATCH: Final[int] = 4096


def json_tokens(raw: bytes | bytearray) -> int:
    """Separators in `raw` (a linear scan in C): what parsing it costs per value."""
    return JsonScan.of(raw).tokens


def _int(text: str) -> int:
    return int(text)


def _decoder(interruptible: bool) -> json.JSONDecoder:
    """A decoder for one body. The C one is built once and shared (building it is about a
    fifth of parsing a small body): like `json.loads`'s default decoder, it keeps no state
    between calls that another thread could see. The pure-Python scanner's memo is
    per-scan state, so each interruptible parse gets its own."""
    if not interruptible:
        return _C_DECODER
    decoder = _new_decoder(interruptible=True)
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    return decoder


def _new_decoder(*, interruptible: bool) -> json.JSONDecoder:
    return json.JSONDecoder(
        object_pairs_hook=_pairs,
        parse_constant=_constant,
        parse_float=_float,
        parse_int=_int if interruptible else None,
    )


_C_DECODER: Final = _new_decoder(interruptible=False)


def parse_body(
    raw: bytes | bytearray, *, acted_on: Iterable[str], interruptible: bool = False
) -> dict[str, Any]:
    """The JSON object in `raw`, or the `FrontError` (400) that refuses it.

    `acted_on`: the top-level fields read by this process or the next parser; a member
    whose name folds (Go's way) to one of them without being it is refused, as are two
    top-level members whose names fold together, and any object naming a member twice.
    `interruptible`: parse with the pure-Python scanner (same result; for a thread that
    must not hold the GIL long, `json_work`)."""
    if raw[:3] == b"\xef\xbb\xbf" or raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise FrontError(
            400,
            errors.INVALID_JSON,
            "the request body starts with a byte-order mark; send UTF-8 JSON without one",
        )
    try:
        text = bytes(raw).decode("utf-8") if isinstance(raw, bytearray) else raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FrontError(
            400,
            errors.INVALID_JSON,
            f"the request body is not valid UTF-8 (byte {exc.start}); send UTF-8 JSON",
        ) from None
    try:
        body = _decoder(interruptible).decode(text)
    except _DuplicateError as exc:
        raise FrontError(
            400,
            errors.DUPLICATE_FIELD,
            f"an object in the request body names the member {_shown(exc.name)} more than "
            "once; name each member once",
            param=exc.name[:64],
        ) from None
    except RecursionError:
        raise FrontError(
            400, errors.JSON_TOO_DEEP, "the request body nests JSON too deeply"
        ) from None
    except ValueError as exc:
        raise FrontError(
            400, errors.INVALID_JSON, f"the request body is not valid JSON: {exc}"
        ) from None
    if not isinstance(body, dict):
        raise FrontError(
            400,
            errors.BODY_NOT_OBJECT,
            f"the request body must be a JSON object, got a JSON {type(body).__name__}",
        )
    _check_spellings(body, acted_on)
    return body


@functools.lru_cache(maxsize=32)
def _folded_fields(acted_on: tuple[str, ...] | frozenset[str]) -> Mapping[str, str]:
    """Go's fold of each field name, to the name: computed once per field set, not once per
    request (a process asks with the same few sets every time)."""
    return MappingProxyType({go_fold(name): name for name in acted_on if name})


def _check_spellings(body: dict[str, Any], acted_on: Iterable[str]) -> None:
    known = (
        _folded_fields(acted_on)
        if isinstance(acted_on, (tuple, frozenset))
        else {go_fold(name): name for name in acted_on if name}
    )
    folded: dict[str, str] = {}
    for name in body:
        fold = go_fold(name)
        field = known.get(fold)
        other = folded.get(fold)
        if (field is not None and field != name) or other is not None:
            meant = field if field is not None else other
            raise FrontError(
                400,
                errors.AMBIGUOUS_FIELD,
                f"the request body's member {_shown(name)} is another spelling of "
                f"{_shown(str(meant))} (the Endpoint Picker matches names regardless of "
                "case); spell each field once, exactly",
                param=name[:64],
            )
        folded[fold] = name


def dumps(body: Any, *, interruptible: bool = False) -> str:
    """`json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)`;
    with `interruptible`, by the pure-Python encoder (same text; it lets other threads
    run while it works, the C encoder does not)."""
    encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    if not interruptible:
        return encoder.encode(body)
    # joined in batches: one list of every fragment would cost ~50 bytes per JSON value
    chunks: list[str] = []
    batch: list[str] = []
    for piece in encoder.iterencode(body):
        batch.append(piece)
        if len(batch) >= _JOIN_BATCH:
            chunks.append("".join(batch))
            batch.clear()
    chunks.append("".join(batch))
    return "".join(chunks)


@contextlib.contextmanager
def refusing_unencodable() -> Iterator[None]:
    """Encoding failures a client's body can cause, as the client's 400s (one mapping for
    every place the front encodes a body)."""
    try:
        yield
    except UnicodeEncodeError:
        raise FrontError(
            400,
            errors.INVALID_UNICODE,
            "the request body holds a string that is not valid Unicode (a lone surrogate "
            "such as \\ud800)",
        ) from None
    except RecursionError:
        raise FrontError(
            400, errors.JSON_TOO_DEEP, "the request body nests JSON too deeply"
        ) from None


def encode_body(body: Any, *, interruptible: bool = False) -> bytes:
    """The canonical encoding: UTF-8, compact, finite numbers only."""
    with refusing_unencodable():
        return dumps(body, interruptible=interruptible).encode("utf-8")

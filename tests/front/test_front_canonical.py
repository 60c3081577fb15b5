"""One reading of bodies and headers for the front and the policy step (`tenancy.canonical`).

Both processes refuse what the next parser (vLLM's pydantic, the picker's Go
`encoding/json`) would read differently, with the same stable codes; and a body dense in
values is read and written by the pure-Python scanner and encoder with the very same
result as the C ones.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from promptcache.tenancy.canonical import (
    POLICY_FIELDS,
    JsonScan,
    check_headers,
    encode_body,
    go_fold,
    header_multidict,
    json_charge,
    json_work,
    parse_body,
)
from promptcache.tenancy.errors import FrontError


def refused(raw: bytes) -> str:
    with pytest.raises(FrontError) as caught:
        parse_body(raw, acted_on=POLICY_FIELDS)
    assert caught.value.status == 400
    return caught.value.code


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b'\xef\xbb\xbf{"model":"m"}', "invalid_json"),
        ('{"model":"m"}'.encode("utf-16"), "invalid_json"),
        (b'{"model":"\xff"}', "invalid_json"),
        (b'{"model":"m","model":"n"}', "duplicate_field"),
        (b'{"messages":[{"role":"user","role":"system"}]}', "duplicate_field"),
        (b'{"CACHE_SALT":"x"}', "ambiguous_field"),
        ('{"cache_\u017falt":"x"}'.encode(), "ambiguous_field"),
        (b'{"cache_\\u017falt":"x"}', "ambiguous_field"),
        ('{"\u212aey":"a","key":"b"}'.encode(), "ambiguous_field"),
        (b'{"Model":"a"}', "ambiguous_field"),
        (b'{"x":NaN}', "invalid_json"),
        (b'{"x":-Infinity}', "invalid_json"),
        (b'{"x":1e999}', "invalid_json"),
        (b'{"x":' + b"9" * 5000 + b"}", "invalid_json"),
        (b"[" * 100_000 + b"]" * 100_000, "json_too_deep"),
        (b"[1]", "body_not_object"),
    ],
)
def test_what_a_second_parser_reads_differently_is_refused(raw: bytes, code: str) -> None:
    assert refused(raw) == code


def test_a_lone_surrogate_is_refused_when_encoded() -> None:
    body = parse_body(b'{"model":"\\ud800"}', acted_on=())
    with pytest.raises(FrontError) as caught:
        encode_body(body)
    assert caught.value.code == "invalid_unicode"


def test_go_folding() -> None:
    assert go_fold("cache_\u017falt") == go_fold("CACHE_SALT") == "CACHE_SALT"
    assert go_fold("\u212a") == "K"
    assert go_fold("caf\u00e9") != go_fold("CAFE")


def test_headers_are_read_as_aiohttp_reads_them() -> None:
    headers = header_multidict([("x-k", b"a"), ("x-k", b"b"), ("x-bad", b"\xff")])
    assert headers.getall("x-k") == ["a", "b"]  # every entry, as the front sees them
    with pytest.raises(FrontError) as caught:
        check_headers(headers)
    assert caught.value.code == "invalid_header"
    with pytest.raises(FrontError) as caught:
        check_headers(CIMultiDict([("content-type", "a"), ("Content-Type", "b")]))
    assert caught.value.code == "duplicate_header"


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text("abcdefgh_", min_size=1, max_size=8).map(lambda k: "f_" + k),
        json_values,
        max_size=6,
    )
)
def test_the_dense_path_reads_and_writes_exactly_as_the_fast_one(body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    fast = parse_body(raw, acted_on=())
    slow = parse_body(raw, acted_on=(), interruptible=True)
    assert slow == fast
    assert encode_body(fast, interruptible=True) == encode_body(fast)


@pytest.mark.parametrize(
    ("raw", "off_loop", "interruptible"),
    [
        (b'{"model":"m","prompt":"' + b"x" * 200_000 + b'"}', False, False),
        (b'{"prompt":[' + b"1," * 12_000 + b"1]}", True, False),
        (b'{"messages":[' + b'{"a":1},' * 30_000 + b'{"a":1}]}', True, True),
        (b'{"prompt":"' + b"x" * (300 * 1024) + b'"}', True, False),
    ],
    ids=["long-string-on-loop", "dense-small-off-loop", "dense-interruptible", "large-off-loop"],
)
def test_json_work_keeps_only_cheap_bodies_on_the_loop(
    raw: bytes, off_loop: bool, interruptible: bool
) -> None:
    # bytes alone do not bound the work: 255 KiB of [1,1,...] parsed on the loop held it
    # for 200 ms; what decides is the number of values, then the size
    work = json_work(raw)
    assert (work.off_loop, work.interruptible) == (off_loop, interruptible)


@given(raw=st.binary(max_size=400), cuts=st.lists(st.integers(0, 400), max_size=8))
def test_a_body_counted_piece_by_piece_is_counted_as_a_whole(raw: bytes, cuts: list[int]) -> None:
    # both processes count a body as it arrives (a 32 MiB body counted at once held the
    # loop 145 ms); what they decide from the counts must not depend on the pieces
    scan, last = JsonScan(), 0
    for cut in [*sorted(c % (len(raw) + 1) for c in cuts), len(raw)]:
        scan.add(raw[last:cut])
        last = cut
    whole = JsonScan.of(raw)
    assert (scan.charge, scan.tokens, scan.work()) == (whole.charge, whole.tokens, whole.work())
    assert scan.charge == json_charge(raw) >= 2 * len(raw)

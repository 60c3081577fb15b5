"""`tenancy.keyed.KeyedMac`: HMAC-SHA256 keyed once is the same HMAC as keyed each call."""

from __future__ import annotations

import hmac

from hypothesis import given, settings
from hypothesis import strategies as st

from promptcache.tenancy.keyed import KeyedMac


@settings(max_examples=300, deadline=None)
@given(
    # keys shorter than, equal to and longer than SHA-256's 64-byte block (hashed first)
    key=st.binary(min_size=0, max_size=130),
    prefix=st.binary(max_size=40),
    messages=st.lists(st.binary(max_size=200), min_size=1, max_size=4),
)
def test_the_same_digest_as_hmac_for_every_message(
    key: bytes, prefix: bytes, messages: list[bytes]
) -> None:
    mac = KeyedMac(key, prefix)
    for message in messages:  # one object, many messages: its states are never consumed
        assert mac.digest(message) == hmac.digest(key, prefix + message, "sha256")


def test_the_prefix_and_the_key_both_count() -> None:
    key = b"k" * 32
    assert KeyedMac(key, b"a").digest(b"x") != KeyedMac(key, b"b").digest(b"x")
    assert KeyedMac(key).digest(b"x") != KeyedMac(b"j" * 32).digest(b"x")

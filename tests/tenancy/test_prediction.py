"""The predicted-match header (`tenancy.prediction`): what the front believes of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from promptcache.contract import IsolationMode
from promptcache.tenancy.attestation import Outcome, ReplayGuard
from promptcache.tenancy.prediction import (
    MAX_FIGURE,
    Prediction,
    PredictionReader,
    check,
    prediction_key,
    sign,
)
from promptcache.tenancy.settings import (
    PolicySettings,
    SettingsError,
    read_mounted_salt_key,
    read_salt_key,
)

SECRET = b"0123456789abcdef0123456789abcdef"
KEY = prediction_key(SECRET)
NOW = 1_800_000_000


def _check(values: list[str], now: int = NOW) -> Outcome:
    return check(KEY, values, now=now, guard=ReplayGuard()).outcome


def test_round_trip_and_tokens() -> None:
    p = Prediction(3, 8, 16)
    verdict = check(KEY, [sign(KEY, p, now=NOW)], now=NOW, guard=ReplayGuard())
    assert verdict.outcome is Outcome.VALID
    assert verdict.prediction == p
    # a share of the prompt vLLM counted (3 of 8 blocks), whatever the tokenizer
    assert p.tokens(100) == 38
    assert p.tokens(800) == 300
    assert p.tokens(-1) == 0
    assert Prediction(0, 0, 16).tokens(100) == 0  # nothing hashed: nothing predicted


def test_each_way_it_is_not_believed() -> None:
    value = sign(KEY, Prediction(3, 8, 16), now=NOW)
    assert _check([]) is Outcome.ABSENT
    assert _check(["", " "]) is Outcome.ABSENT  # the picker blanks a client's copy
    assert _check([value, value]) is Outcome.AMBIGUOUS
    assert _check([value.replace(".3.8.", ".8.8.")]) is Outcome.FORGED  # figures are signed
    assert _check([sign(prediction_key(b"x" * 32), Prediction(3, 8, 16), now=NOW)]) is (
        Outcome.FORGED
    )
    assert _check([value], now=NOW - 31) is Outcome.FUTURE
    assert _check([value], now=NOW + 61) is Outcome.EXPIRED
    assert _check([sign(KEY, Prediction(9, 8, 16), now=NOW)]) is Outcome.MALFORMED
    assert _check([sign(KEY, Prediction(0, MAX_FIGURE + 1, 16), now=NOW)]) is Outcome.MALFORMED
    assert _check([sign(KEY, Prediction(0, 1, 0), now=NOW)]) is Outcome.MALFORMED
    assert _check(["v1." + "9" * 400]) is Outcome.MALFORMED


def test_only_the_canonical_text_of_the_mac_verifies() -> None:
    """The MAC is compared as text: its last base64 character carries two spare bits, and a
    header whose last character differs only there (the same MAC bytes, decoded) is forged,
    not a second copy the replay guard, keyed by that text, would admit again."""
    value = sign(KEY, Prediction(3, 8, 16), now=NOW)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    last = alphabet.index(value[-1])
    twins = [alphabet[(last & ~3) | low] for low in range(4) if (last & ~3) | low != last]
    for twin in twins:
        assert _check([value[:-1] + twin]) is Outcome.FORGED
    reader = PredictionReader(SECRET, clock=lambda: NOW)
    assert reader.read([value]).outcome is Outcome.VALID
    assert [reader.read([value[:-1] + t]).outcome for t in twins] == [Outcome.FORGED] * 3


def test_the_reader_and_check_agree_on_every_outcome() -> None:
    """The reader checks with its key keyed once (`KeyedMac`); `check` with the key's bytes
    keys it per call: the same verdicts, for each way a header can fail and for one that
    passes."""
    values = [
        [],
        [" "],
        [sign(KEY, Prediction(3, 8, 16, 8, 5), now=NOW)],
        [sign(KEY, Prediction(3, 8, 16), now=NOW)] * 2,
        [sign(prediction_key(b"y" * 32), Prediction(3, 8, 16), now=NOW)],
        [sign(KEY, Prediction(3, 8, 16), now=NOW - 120)],
        [sign(KEY, Prediction(3, 8, 16), now=NOW + 120)],
        [sign(KEY, Prediction(3, 8, 16, 9, 5), now=NOW)],
        ["v1.garbage"],
        ["", sign(KEY, Prediction(1, 1, 16), now=NOW), "\t"],  # blanks beside one value
    ]
    reader = PredictionReader(SECRET, clock=lambda: NOW)
    for value in values:
        assert reader.read(value) == check(KEY, value, now=NOW, guard=ReplayGuard()), value


def test_the_ladder_is_the_three_token_figures() -> None:
    """`ladder` skips the clamps only where the shares are within [0, 1]."""
    made_here = Prediction(9, 8, 16, 12, -1)  # never verified: only a caller makes it
    cases = (Prediction(3, 8, 16, 8, 5), Prediction(3, 8, 16), Prediction(0, 0, 16, 0, 0))
    for p in (*cases, made_here):
        for prompt in (-1, 0, 1, 7, 100, 801):
            assert p.ladder(prompt) == (
                p.tokens(prompt),
                p.workload_tokens(prompt),
                p.capacity_tokens(prompt),
            )


def test_the_identity_key_does_not_sign_predictions() -> None:
    """Its own key label: an identity attestation key cannot make a prediction verify."""
    from promptcache.tenancy.attestation import attestation_key

    other = sign(attestation_key(SECRET), Prediction(1, 2, 16), now=NOW)
    assert _check([other]) is Outcome.FORGED


def test_reader_admits_each_header_once() -> None:
    reader = PredictionReader(SECRET, clock=lambda: NOW)
    value = sign(KEY, Prediction(1, 2, 16), now=NOW)
    assert reader.read([value]).outcome is Outcome.VALID
    assert reader.read([value]).outcome is Outcome.REPLAYED


def test_workload_and_capacity_figures_are_signed_too() -> None:
    p = Prediction(3, 8, 16, 8, 5)
    value = sign(KEY, p, now=NOW)
    assert value.split(".")[3:8] == ["3", "8", "16", "8", "5"]
    verdict = check(KEY, [value], now=NOW, guard=ReplayGuard())
    assert verdict.prediction == p
    assert p.workload_tokens(100) == 100  # 8 of 8 blocks
    assert p.capacity_tokens(100) == 62  # 5 of 8
    assert _check([value.replace(".8.5.", ".8.8.")]) is Outcome.FORGED
    assert _check([sign(KEY, Prediction(3, 8, 16, 9, 5), now=NOW)]) is Outcome.MALFORMED
    without = Prediction(3, 8, 16)
    assert not without.estimated
    assert without.workload_tokens(100) == 0


def test_mode_shared_reads_the_key_only_where_it_is_mounted(tmp_path: Path) -> None:
    key = tmp_path / "salt-key"
    shared = PolicySettings(isolation_mode=IsolationMode.SHARED, salt_key_file=str(key))
    assert read_mounted_salt_key(shared) is None  # nothing mounted: nothing believed
    key.write_bytes(b"  0123456789abcdef0123\n")
    assert read_mounted_salt_key(shared) == b"0123456789abcdef0123"
    assert read_salt_key(shared) is None  # the salt itself still needs none in Shared
    key.write_bytes(b"short")
    with pytest.raises(SettingsError, match="at least 16"):
        read_mounted_salt_key(shared)

"""The TurboQuant codec: error per bit width, shapes, determinism, malformed payloads."""

from __future__ import annotations

import math
import re
import struct
from typing import Any

import blake3
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from promptcache.embeds import compute_prompt_embeds_id, decode_payload, encode_payload
from promptcache.embeds.turboquant import (
    LLOYD_MAX_MSE,
    _pack,
    _unpack,
    decode,
    decode_namespace,
    encode,
    rotate,
    unrotate,
)

pytestmark = pytest.mark.torch


def nmse(x: torch.Tensor, y: torch.Tensor) -> float:
    x64, y64 = x.double(), y.double()
    return float(((x64 - y64) ** 2).sum() / (x64**2).sum())


def paper_bound(bits: int) -> float:
    """TurboQuant-mse's upper bound on normalised MSE: sqrt(3)*pi/2 * 4^-b."""
    return math.sqrt(3) * math.pi / 2 * 4.0**-bits


def embeddings(rows: int, dim: int, seed: int) -> torch.Tensor:
    """Embedding-like rows: anisotropic scales, a few outlier channels, varied norms."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, dim, generator=g) * torch.rand(dim, generator=g).mul(2).add(0.1)
    x[:, torch.randint(0, dim, (4,), generator=g)] *= 30.0
    return x * torch.rand(rows, 1, generator=g).add(0.5)


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("dim", [4096, 5120, 896])
def test_round_trip_error_within_the_paper_bound(bits: int, dim: int) -> None:
    x = embeddings(256, dim, seed=bits * dim)
    y = decode(encode(x, bits), torch.float32)
    err = nmse(x, y)
    assert err <= paper_bound(bits), (err, paper_bound(bits))
    # and close to the Lloyd-Max distortion the rotation is meant to achieve
    assert err == pytest.approx(LLOYD_MAX_MSE[bits], rel=0.1)


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_adversarial_one_hot_rows_stay_within_the_bound(bits: int) -> None:
    x = torch.zeros(128, 4096)
    x[torch.arange(128), torch.arange(128) * 31] = 1.0
    assert nmse(x, decode(encode(x, bits), torch.float32)) <= paper_bound(bits)


def test_more_bits_less_error_and_qjl_helps_at_equal_code_bits() -> None:
    x = embeddings(128, 1024, seed=3)
    errors = [nmse(x, decode(encode(x, b))) for b in (1, 2, 3, 4)]
    assert errors == sorted(errors, reverse=True)
    with_sketch = nmse(x, decode(encode(x, 3, qjl=True)))  # 2 code bits + 1 sketch bit
    assert with_sketch < errors[1]  # better than the 2 code bits alone...
    assert with_sketch == pytest.approx(errors[1] * (math.pi / 2 - 1), rel=0.15)


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ((1, 7, 64), torch.bfloat16),
        ((9, 128), torch.float16),
        ((3, 96), torch.float32),
        ((2, 40), torch.float64),
    ],
)
def test_shape_and_dtype_survive(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = torch.randn(shape).to(dtype)
    payload = encode(x, 4)
    assert payload["shape"] == list(shape)
    assert payload["dtype"] == str(dtype).removeprefix("torch.")
    y = decode(payload)
    assert y.shape == x.shape
    assert y.dtype == dtype
    assert decode(payload, torch.float32).dtype == torch.float32
    assert decode(payload, torch.bfloat16).dtype == torch.bfloat16


def test_bytes_per_element_at_four_bits_is_a_quarter_of_bf16() -> None:
    x = torch.randn(512, 4096).to(torch.bfloat16)
    dense = len(encode_payload(x))
    packed = len(encode_payload(encode(x, 4)))  # type: ignore[arg-type]
    assert 3.8 <= dense / packed <= 4.0


def test_zero_rows_decode_to_zero() -> None:
    x = torch.zeros(4, 64)
    x[1] = torch.randn(64)
    y = decode(encode(x, 3))
    assert torch.equal(y[0], torch.zeros(64))
    assert torch.equal(y[2:], torch.zeros(2, 64))


def test_encode_is_deterministic_and_seed_matters() -> None:
    x = embeddings(16, 512, seed=9)
    a, b = encode(x, 3), encode(x, 3)
    assert compute_prompt_embeds_id(a) == compute_prompt_embeds_id(b)
    c = encode(x, 3, seed=1)
    assert compute_prompt_embeds_id(c) != compute_prompt_embeds_id(a)
    assert not torch.equal(a["codes"], c["codes"])
    assert nmse(x, decode(c)) <= paper_bound(3)


def test_id_of_a_payload_survives_the_wire() -> None:
    payload = encode(embeddings(8, 256, seed=1), 4, qjl=True)
    loaded = decode_payload(encode_payload(payload), max_bytes=1 << 20)
    assert isinstance(loaded, dict)
    assert compute_prompt_embeds_id(loaded) == compute_prompt_embeds_id(payload)
    assert torch.equal(decode(loaded), decode(payload))


def test_decode_namespace_names_every_setting() -> None:
    assert decode_namespace(torch.bfloat16) == "promptcache-turboquant/v1/bfloat16"
    assert decode_namespace(torch.float32) != decode_namespace(torch.bfloat16)


@settings(max_examples=40, deadline=None)
@given(dim=st.integers(1, 300), rows=st.integers(1, 5), seed=st.integers(0, 2**63 - 1))
def test_rotation_is_orthogonal(dim: int, rows: int, seed: int) -> None:
    x = torch.randn(rows, dim, dtype=torch.float32)
    y = rotate(x, seed)
    assert torch.allclose(y.norm(dim=1), x.norm(dim=1), rtol=1e-4, atol=1e-5)
    assert torch.allclose(unrotate(y, seed), x, rtol=1e-4, atol=1e-4)


@settings(max_examples=60, deadline=None)
@given(bits=st.integers(1, 4), codes=st.lists(st.integers(0, 15), max_size=70))
def test_packing_round_trips_and_is_lsb_first(bits: int, codes: list[int]) -> None:
    c = torch.tensor([v % (1 << bits) for v in codes], dtype=torch.uint8)
    packed = _pack(c, bits)
    assert packed.numel() == -(-len(codes) * bits // 8)
    assert torch.equal(_unpack(packed, bits, len(codes)), c)
    stream = int.from_bytes(bytes(packed.tolist()), "little")
    assert [(stream >> (k * bits)) & ((1 << bits) - 1) for k in range(len(codes))] == c.tolist()


# --- malformed payloads ---------------------------------------------------------------


def good() -> dict[str, Any]:
    return dict(encode(torch.randn(2, 16), 2, qjl=True))


def without(name: str) -> dict[str, Any]:
    p = good()
    del p[name]
    return p


def with_(**changes: Any) -> dict[str, Any]:
    p = good()
    p.update(changes)
    return p


MALFORMED: list[tuple[str, dict[str, Any], str]] = [
    ("missing codes", without("codes"), "not a TurboQuant payload: missing field(s) codes"),
    (
        "empty mapping",
        {},
        "missing field(s) format, version, bits, seed, shape, dtype, norms, codes",
    ),
    ("unknown field", with_(extra=1), "not a TurboQuant payload: unknown field(s) 'extra'"),
    (
        "half the sketch",
        without("qjl_norms"),
        "'qjl_signs' and 'qjl_norms' come together or not at all",
    ),
    (
        "other format",
        with_(format="other"),
        "field 'format' must be 'promptcache-turboquant', got 'other'",
    ),
    (
        "future version",
        with_(version=2),
        "unsupported TurboQuant payload version 2; this code reads 1",
    ),
    ("bool version", with_(version=True), "field 'version' must be an int, got bool"),
    ("bits too wide", with_(bits=5), "field 'bits' must be in 1..4, got 5"),
    ("bits as text", with_(bits="2"), "field 'bits' must be an int, got str"),
    ("negative seed", with_(seed=-1), "field 'seed' must be in 0..9223372036854775807, got -1"),
    ("huge seed", with_(seed=2**64), "field 'seed' must be in 0..9223372036854775807"),
    ("shape as text", with_(shape="2,16"), "field 'shape' must be a list of ints, got str"),
    ("empty shape", with_(shape=[]), "field 'shape' must have 1..8 dimensions"),
    ("zero dim", with_(shape=[0, 16]), "field 'shape' must hold positive ints"),
    ("float dim", with_(shape=[2.0, 16]), "field 'shape' must hold positive ints"),
    ("shape vs codes", with_(shape=[3, 16]), "field 'norms' must have shape (3,), got (2,)"),
    (
        "int dtype",
        with_(dtype="int8"),
        "field 'dtype' must be one of float32, float16, bfloat16, float64, got 'int8'",
    ),
    (
        "norms float64",
        with_(norms=torch.ones(2, dtype=torch.float64)),
        "field 'norms' must have dtype torch.float32, got torch.float64",
    ),
    # 2 rows x 16 x 1 code bit (2 bits with the sketch) = 4 bytes
    (
        "codes short",
        with_(codes=torch.zeros(3, dtype=torch.uint8)),
        "field 'codes' must have shape (4,), got (3,)",
    ),
    (
        "codes 2-D",
        with_(codes=torch.zeros(2, 2, dtype=torch.uint8)),
        "field 'codes' must have shape (4,), got (2, 2)",
    ),
    (
        "codes int8",
        with_(codes=torch.zeros(4, dtype=torch.int8)),
        "field 'codes' must have dtype torch.uint8, got torch.int8",
    ),
    (
        "signs short",
        with_(qjl_signs=torch.zeros(3, dtype=torch.uint8)),
        "field 'qjl_signs' must have shape (4,), got (3,)",
    ),
    (
        "sparse codes",
        with_(codes=torch.zeros(8, dtype=torch.uint8).to_sparse()),
        "field 'codes' has layout torch.sparse_coo",
    ),
    ("meta norms", with_(norms=torch.empty(2, device="meta")), "field 'norms' is a meta tensor"),
]


@pytest.mark.parametrize(("case", "payload", "message"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_mappings_are_value_errors(
    case: str, payload: dict[str, Any], message: str
) -> None:
    for consumer in (compute_prompt_embeds_id, decode):
        with pytest.raises(ValueError, match=re.escape(message)):
            consumer(payload)  # type: ignore[operator]


@pytest.mark.parametrize("field", ["norms", "codes", "qjl_signs", "qjl_norms"])
@pytest.mark.parametrize("value", [[1.0, 2.0], b"\x00\x01", None, 3])
def test_non_tensor_tensor_fields_are_type_errors(field: str, value: object) -> None:
    payload = with_(**{field: value})
    for consumer in (compute_prompt_embeds_id, decode):
        with pytest.raises(
            TypeError,
            match=f"TurboQuant field '{field}' must be a torch.Tensor, got {type(value).__name__}",
        ):
            consumer(payload)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"tensor": "x", "bits": 4}, TypeError, "encode expects a torch.Tensor, got str"),
        ({"tensor": torch.ones(2, 4, dtype=torch.int32), "bits": 4}, ValueError, "not int32"),
        ({"tensor": torch.ones(2, 4), "bits": 5}, ValueError, "bits must be an int in 1..4, got 5"),
        (
            {"tensor": torch.ones(2, 4), "bits": 1, "qjl": True},
            ValueError,
            "bits must be an int in 2..5, got 1",
        ),
        (
            {"tensor": torch.ones(2, 4), "bits": 2, "seed": -3},
            ValueError,
            "seed must be an int in 0..",
        ),
        (
            {"tensor": torch.ones(0, 4), "bits": 2},
            ValueError,
            "cannot encode an empty tensor of shape (0, 4)",
        ),
        ({"tensor": torch.tensor([[1.0, float("nan")]]), "bits": 2}, ValueError, "NaN or infinity"),
    ],
)
def test_encode_rejects(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error) as info:
        encode(**kwargs)
    assert message in str(info.value)


def test_decode_refuses_integer_dtypes() -> None:
    with pytest.raises(
        ValueError, match=r"decode produces floating-point tensors, not torch\.int8"
    ):
        decode(good(), torch.int8)


def test_decode_respects_a_dense_size_cap() -> None:
    payload = encode(torch.randn(4, 64), 1)  # 256 elements
    assert decode(payload, torch.bfloat16, max_dense_bytes=512).shape == (4, 64)
    with pytest.raises(
        ValueError, match="decoded TurboQuant tensor would be 1024 bytes; the limit is 1023"
    ):
        decode(payload, torch.float32, max_dense_bytes=1023)


def _doc_xof(purpose: str, seed: int, n: int, length: int) -> bytes:
    key = b"promptcache-turboquant/v1/" + purpose.encode() + struct.pack("<QQ", seed, n)
    return blake3.blake3(key).digest(length=length)


def _doc_rotation_matrix(purpose: str, seed: int, d: int) -> np.ndarray:
    """R = K S2 P K S1 built with numpy straight from docs/prompt-embeds.md."""
    k = (d & -d).bit_length() - 1
    m = d >> k
    h = np.array([[1.0]])
    while h.shape[0] < 1 << k:
        h = np.block([[h, h], [h, -h]])
    h /= math.sqrt(1 << k)
    if m > 1:
        count = m * m + (m * m) % 2
        words = np.frombuffer(_doc_xof("odd-orthogonal", seed, m, 8 * count), dtype="<u8")
        u = ((words >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53
        r = np.sqrt(-2 * np.log(u[0::2]))
        normals = np.stack([r * np.cos(2 * np.pi * u[1::2]), r * np.sin(2 * np.pi * u[1::2])], 1)
        q, rr = np.linalg.qr(normals.reshape(-1)[: m * m].reshape(m, m))
        q = q * np.sign(np.diag(rr))
    else:
        q = np.eye(1)
    kron = np.kron(h, q)

    def signs(name: str) -> np.ndarray:
        raw = np.frombuffer(_doc_xof(f"{purpose}/{name}", seed, d, -(-d // 8)), dtype=np.uint8)
        bits = np.unpackbits(raw, bitorder="little")[:d]
        return np.diag(1.0 - 2.0 * bits)

    words = np.frombuffer(_doc_xof(f"{purpose}/p", seed, d, 8 * max(d - 1, 1)), dtype="<u8")
    order = list(range(d))
    for step, i in enumerate(range(d - 1, 0, -1)):
        j = int(words[step] % np.uint64(i + 1))
        order[i], order[j] = order[j], order[i]
    perm = np.zeros((d, d))
    perm[np.arange(d), order] = 1.0
    return kron @ signs("s2") @ perm @ kron @ signs("s1")


@pytest.mark.parametrize("d", [1, 6, 64, 96, 640])
def test_rotation_matches_the_documented_construction(d: int) -> None:
    x = torch.randn(5, d, dtype=torch.float32)
    expected = x.double().numpy() @ _doc_rotation_matrix("rotation", 11, d).T
    assert np.allclose(rotate(x, 11).double().numpy(), expected, atol=1e-5)


def test_decode_matches_the_documented_formula() -> None:
    """Rebuild a 3-bit payload's rows from the doc: x = norm * R^T (c[code] / sqrt(d))."""
    d, rows = 96, 3
    payload = encode(torch.randn(rows, d), 3, seed=5)
    half = [0.245094179, 0.756005281, 1.34390928, 2.1519457]
    book = np.array([-v for v in reversed(half)] + half)
    stream = int.from_bytes(bytes(payload["codes"].tolist()), "little")
    codes = np.array([(stream >> (3 * k)) & 7 for k in range(rows * d)]).reshape(rows, d)
    unit = book[codes] / math.sqrt(d)
    rot = _doc_rotation_matrix("rotation", 5, d)
    expected = payload["norms"].double().numpy()[:, None] * (unit @ rot)
    assert np.allclose(decode(payload, torch.float64).numpy(), expected, atol=1e-5)

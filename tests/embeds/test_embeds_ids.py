"""Identifiers (spec/001): syntax, canonical encoding, layout independence, errors, vectors."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import blake3
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.embeds_objects import object_from_vector
from promptcache.embeds import (
    PROMPT_EMBEDS_ID_ALGORITHM,
    PROMPT_EMBEDS_ID_PATTERN,
    PROMPT_EMBEDS_ID_PREFIX,
    compute_prompt_embeds_id,
    is_prompt_embeds_id,
    turboquant,
)

pytestmark = pytest.mark.torch

VECTORS = json.loads((Path(__file__).parent / "vectors" / "prompt_embeds_id_v1.json").read_text())

GOOD_ID = "blake3:" + "0123456789abcdef" * 4


# --- syntax --------------------------------------------------------------------


def test_constants_are_the_spec_values() -> None:
    assert PROMPT_EMBEDS_ID_ALGORITHM == "blake3"
    assert PROMPT_EMBEDS_ID_PREFIX == "blake3:"
    assert PROMPT_EMBEDS_ID_PATTERN.pattern == "^blake3:[0-9a-f]{64}$"


@pytest.mark.parametrize(
    "value",
    [
        GOOD_ID.upper(),
        "BLAKE3:" + "0" * 64,
        "blake3:" + "A" * 64,
        "blake3:" + "0" * 63,
        "blake3:" + "0" * 65,
        "sha256:" + "0" * 64,
        "blake3" + "0" * 64,
        " " + GOOD_ID,
        GOOD_ID + " ",
        GOOD_ID + "\n",
        "\n" + GOOD_ID,
        "blake3:" + "g" * 64,
        "",
        None,
        42,
        GOOD_ID.encode(),
        [GOOD_ID],
    ],
)
def test_is_prompt_embeds_id_rejects(value: object) -> None:
    assert not is_prompt_embeds_id(value)


def test_is_prompt_embeds_id_accepts_computed_ids() -> None:
    assert is_prompt_embeds_id(GOOD_ID)
    assert is_prompt_embeds_id(compute_prompt_embeds_id(torch.ones(2, 3)))


# --- the canonical encoding, re-implemented from docs/prompt-embeds.md ------------


def _tensor_record(t: torch.Tensor) -> bytes:
    name = str(t.dtype).removeprefix("torch.").encode()
    data = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return (
        b"T"
        + bytes([len(name)])
        + name
        + bytes([t.dim()])
        + b"".join(struct.pack("<Q", d) for d in t.shape)
        + struct.pack("<Q", len(data))
        + data
    )


def _doc_id_of_tensor(t: torch.Tensor) -> str:
    return (
        "blake3:"
        + blake3.blake3(b"promptcache/prompt-embeds-id/v1\x00" + _tensor_record(t)).hexdigest()
    )


def _doc_id_of_turboquant(p: dict[str, object]) -> str:
    def name(n: str) -> bytes:
        return bytes([len(n)]) + n.encode()

    order = ["format", "version", "bits", "seed", "shape", "dtype", "norms", "codes"]
    if "qjl_signs" in p:
        order += ["qjl_signs", "qjl_norms"]
    out = b"Q" + bytes([len(order)])
    for n in order:
        v = p[n]
        out += name(n)
        if isinstance(v, torch.Tensor):
            out += _tensor_record(v)
        elif isinstance(v, str):
            out += b"s" + struct.pack("<I", len(v.encode())) + v.encode()
        elif isinstance(v, int):
            out += b"i" + struct.pack("<q", v)
        else:
            assert isinstance(v, list)
            out += b"l" + struct.pack("<I", len(v)) + b"".join(struct.pack("<q", d) for d in v)
    return "blake3:" + blake3.blake3(b"promptcache/prompt-embeds-id/v1\x00" + out).hexdigest()


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(6, dtype=torch.float32).reshape(2, 3),
        torch.linspace(-1, 1, 40).to(torch.bfloat16).reshape(1, 5, 8),
        torch.tensor(3.5, dtype=torch.float64),
        torch.zeros(0, 4, dtype=torch.float16),
        torch.tensor([True, False]),
    ],
    ids=["f32", "bf16-3d", "scalar", "empty", "bool"],
)
def test_tensor_id_matches_the_documented_encoding(tensor: torch.Tensor) -> None:
    assert compute_prompt_embeds_id(tensor) == _doc_id_of_tensor(tensor)


@pytest.mark.parametrize("qjl", [False, True])
def test_turboquant_id_matches_the_documented_encoding(qjl: bool) -> None:
    payload = dict(turboquant.encode(torch.randn(3, 64), 3, seed=7, qjl=qjl))
    assert compute_prompt_embeds_id(payload) == _doc_id_of_turboquant(payload)  # type: ignore[arg-type]


@pytest.mark.parametrize("vector", VECTORS["vectors"], ids=lambda v: v["name"])
def test_checked_in_vectors(vector: dict[str, object]) -> None:
    obj = object_from_vector(vector)  # type: ignore[arg-type]
    assert compute_prompt_embeds_id(obj) == vector["id"]  # type: ignore[arg-type]


@pytest.mark.slow  # a fresh interpreter importing torch, ~9 s
def test_vectors_are_stable_in_a_fresh_process() -> None:
    """Same id in another interpreter (fresh hash seeds, fresh thread pools)."""
    code = (
        "import json,sys;"
        "from harness.embeds_objects import object_from_vector;"
        "from promptcache.embeds import compute_prompt_embeds_id as f;"
        "v=json.load(open(sys.argv[2]))['vectors'];"
        "print('\\n'.join(f(object_from_vector(x)) for x in v))"
    )
    here = Path(__file__).parent
    out = subprocess.run(
        [sys.executable, "-c", code, "-", str(here / "vectors" / "prompt_embeds_id_v1.json")],
        cwd=here.parents[1],  # `python -c` imports from its working directory: the checkout
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout.split()
    assert out == [v["id"] for v in VECTORS["vectors"]]


# --- layout independence and sensitivity ----------------------------------------------


def test_equal_tensors_have_equal_ids_whatever_their_layout() -> None:
    base = torch.randn(6, 10, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    expected = compute_prompt_embeds_id(base)
    big = torch.zeros(20, 30, dtype=torch.bfloat16)
    big[3:9, 5:15] = base
    layouts = {
        "clone": base.clone(),
        "transposed back": base.t().contiguous().t(),
        "strided slice": big[3:9, 5:15],
        "every other column": torch.stack([base, base], -1)[..., 0],
        "offset view": torch.cat([torch.zeros(1, 10, dtype=torch.bfloat16), base])[1:],
        "requires_grad": base.float().requires_grad_().to(torch.bfloat16),
        "meta-free channels_last-like": base.reshape(1, 6, 10, 1)
        .contiguous(memory_format=torch.channels_last)
        .reshape(6, 10),
    }
    for name, tensor in layouts.items():
        assert torch.equal(tensor, base), name
        assert compute_prompt_embeds_id(tensor) == expected, name
    assert not layouts["strided slice"].is_contiguous()
    assert not layouts["transposed back"].is_contiguous()


def test_expanded_and_conjugated_views_hash_their_values() -> None:
    row = torch.randn(1, 8)
    assert compute_prompt_embeds_id(row.expand(4, 8)) == compute_prompt_embeds_id(row.repeat(4, 1))
    z = torch.randn(3, 4, dtype=torch.complex64)
    assert compute_prompt_embeds_id(z.conj()) == compute_prompt_embeds_id(z.conj().resolve_conj())
    assert compute_prompt_embeds_id(-z) == compute_prompt_embeds_id((-z).clone())


def test_other_device_hashes_like_cpu() -> None:
    t = torch.randn(4, 16)
    devices = ["cuda"] if torch.cuda.is_available() else []
    if not devices:
        pytest.skip("no second device on this machine (CPU-only CI)")
    for device in devices:
        assert compute_prompt_embeds_id(t.to(device)) == compute_prompt_embeds_id(t)


def test_dtype_shape_and_one_element_change_the_id() -> None:
    t = torch.randn(4, 8)
    ids = {
        compute_prompt_embeds_id(t),
        compute_prompt_embeds_id(t.to(torch.float64)),
        compute_prompt_embeds_id(t.view(torch.int32)),  # same bytes, other dtype
        compute_prompt_embeds_id(t.reshape(8, 4)),  # same bytes, other shape
        compute_prompt_embeds_id(t.reshape(1, 4, 8)),
    }
    assert len(ids) == 5
    for i in range(t.numel()):
        changed = t.clone().reshape(-1)
        changed[i] = torch.nextafter(changed[i], torch.tensor(float("inf")))
        assert compute_prompt_embeds_id(changed.reshape(4, 8)) != compute_prompt_embeds_id(t)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(1, 12),
    cols=st.integers(1, 12),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.float64]),
    seed=st.integers(0, 2**31),
)
def test_id_stability_property(rows: int, cols: int, dtype: torch.dtype, seed: int) -> None:
    t = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)).to(dtype)
    ident = compute_prompt_embeds_id(t)
    assert is_prompt_embeds_id(ident)
    assert compute_prompt_embeds_id(t.t().contiguous().t()) == ident
    assert compute_prompt_embeds_id(t.clone()) == ident
    assert ident == _doc_id_of_tensor(t)
    if rows > 1:
        assert compute_prompt_embeds_id(t[:-1]) != ident


def test_large_payload_uses_the_threaded_path_and_still_matches() -> None:
    t = torch.randn(1024, 1024)  # 4 MiB, above the multithreading threshold
    assert compute_prompt_embeds_id(t) == _doc_id_of_tensor(t)


# --- errors (spec/001's contract) ------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b"\x00\x01", "computed over the deserialized payload, not its serialized form; got bytes"),
        ("blake3:abc", "computed over the deserialized payload, not its serialized form; got str"),
        (bytearray(b"x"), "got bytearray"),
        (None, "must be a torch.Tensor or a TurboQuant mapping, got NoneType"),
        (3.0, "must be a torch.Tensor or a TurboQuant mapping, got float"),
        ([torch.ones(1)], "must be a torch.Tensor or a TurboQuant mapping, got list"),
    ],
)
def test_type_errors(value: object, message: str) -> None:
    with pytest.raises(TypeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        compute_prompt_embeds_id(value)  # type: ignore[arg-type]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_non_dense_tensors_are_value_errors() -> None:
    dense = torch.eye(3)
    cases = {
        "layout torch.sparse_coo": dense.to_sparse(),
        "layout torch.sparse_csr": dense.to_sparse_csr(),
        "meta tensor": torch.empty(2, 3, device="meta"),
        "nested tensor": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
        "is a nested tensor": torch.nested.nested_tensor(
            [torch.ones(2, 4), torch.ones(3, 4)], layout=torch.jagged
        ),
        "quantized tensor": torch.quantize_per_tensor(dense, 0.1, 0, torch.qint8),
    }
    for message, tensor in cases.items():
        with pytest.raises(ValueError, match=message):
            compute_prompt_embeds_id(tensor)


def test_contiguous_cpu_tensors_are_hashed_in_place() -> None:
    """No copy for the common case: the hashed buffer is the tensor's own storage."""
    from promptcache.embeds.ids import _element_bytes

    base = torch.randn(64, 128).to(torch.bfloat16)
    for t in (base, base[8:16]):  # a contiguous view with a storage offset too
        view = _element_bytes(t)
        assert np.frombuffer(view, dtype=np.uint8).ctypes.data == t.data_ptr()
        assert view.nbytes == t.numel() * t.element_size()
    strided = base[:, ::2]
    assert np.frombuffer(_element_bytes(strided), dtype=np.uint8).ctypes.data != strided.data_ptr()

"""TurboQuant for prompt embeddings: a seeded rotation, Lloyd-Max codes, norms apart.

After Zandieh et al., "TurboQuant" (arXiv 2504.19874). Each row x (one token's
embedding, dimension d) is stored as its L2 norm plus b-bit codes of the unit
vector after a random rotation. A random rotation makes every coordinate of a
unit vector close to N(0, 1/d) whatever the input looked like, so one
precomputed scalar quantizer (Lloyd-Max for the Gaussian) is near-optimal for
all rows: normalised MSE about 0.36, 0.117, 0.035, 0.0095 at b = 1..4, within
the paper's bound 2.72·4^-b. The optional 1-bit QJL sketch of the residual is
the paper's TurboQuant-prod stage (unbiased inner products); it lowers the
residual's error only by a factor of about π/2 - 1, so plain codes one bit
wider are the better buy for reconstruction and QJL is off by default.

The rotation is two rounds of a randomized Hadamard transform, R = K·S2·P·K·S1,
with S1, S2 seeded random sign diagonals, P a seeded permutation, and
K = H ⊗ Q: H the Walsh-Hadamard matrix of the largest power-of-two factor of
d (applied as a Kronecker product of small Hadamard blocks, so it costs a few
small matmuls), Q a seeded random
orthogonal matrix for the odd factor of d (hidden sizes like 5120 = 1024·5 need
no padding). Two rounds instead of one make even adversarial rows (one-hot)
Gaussian-like. Every random quantity comes from a blake3 XOF of the seed, so a
client in another language can rebuild it (docs/prompt-embeds.md).

The decoded tensor depends on the decode settings (dtype) and on this codec's
version: a cache of decoded forms must be keyed by `decode_namespace(dtype)`.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Mapping
from typing import Final

import blake3
import numpy as np
import torch
from torch import Tensor

from promptcache.embeds.payload import (
    TURBOQUANT_DTYPES,
    TURBOQUANT_FORMAT,
    TURBOQUANT_MAX_BITS,
    TURBOQUANT_MAX_SEED,
    TURBOQUANT_MIN_BITS,
    TURBOQUANT_VERSION,
    TurboQuantFields,
    TurboQuantPayload,
    check_dense,
    validate_turboquant,
)

__all__ = [
    "DEFAULT_SEED",
    "LLOYD_MAX_CENTROIDS",
    "LLOYD_MAX_MSE",
    "decode",
    "decode_namespace",
    "encode",
    "rotate",
    "unrotate",
]

DEFAULT_SEED: Final[int] = 0
"""A fixed default so encoding the same tensor twice gives the same payload (and id)."""

LLOYD_MAX_CENTROIDS: Final[Mapping[int, tuple[float, ...]]] = {
    1: (0.797884561,),
    2: (0.452780035, 1.51041761),
    3: (0.245094179, 0.756005281, 1.34390928, 2.1519457),
    4: (
        0.12839503,
        0.388048299,
        0.656759119,
        0.942340456,
        1.2562312,
        1.61804639,
        2.06901723,
        2.73258957,
    ),
}
"""Positive half of the Lloyd-Max quantizer of N(0, 1) per bit width (symmetric).

Code i (0 ≤ i < 2^b) is the i-th centroid of the full, ascending codebook
(-c[-1], …, -c[0], c[0], …, c[-1]).
"""

LLOYD_MAX_MSE: Final[Mapping[int, float]] = {
    1: 0.3633802276,
    2: 0.1174818478,
    3: 0.0345477608,
    4: 0.0095010080,
}
"""Mean squared error of those quantizers on N(0, 1): the expected normalised MSE."""

_CHUNK_ELEMENTS: Final[int] = 1 << 22
_MAX_HADAMARD_BLOCK_LOG2: Final[int] = 7
_XOF_DOMAIN: Final[bytes] = b"promptcache-turboquant/v1/"
_QJL_SCALE: Final[float] = math.sqrt(math.pi / 2)


def decode_namespace(dtype: torch.dtype) -> str:
    """Everything a decoded tensor depends on besides the payload, as a cache-key prefix."""
    return f"{TURBOQUANT_FORMAT}/v{TURBOQUANT_VERSION}/{str(dtype).removeprefix('torch.')}"


# --- seeded randomness ---------------------------------------------------------


def _xof(purpose: str, seed: int, dim: int, length: int) -> bytes:
    """`length` pseudo-random bytes for one purpose, seed and dimension."""
    key = _XOF_DOMAIN + purpose.encode("ascii") + struct.pack("<QQ", seed, dim)
    return blake3.blake3(key).digest(length=length)


def _signs(purpose: str, seed: int, dim: int) -> Tensor:
    """±1.0 per coordinate: bit i of the XOF stream (LSB first) set means -1."""
    raw = torch.frombuffer(bytearray(_xof(purpose, seed, dim, -(-dim // 8))), dtype=torch.uint8)
    bits = _unpack(raw, 1, dim)
    return 1.0 - 2.0 * bits.to(torch.float32)


def _gaussian_matrix(seed: int, m: int) -> Tensor:
    """mxm standard normals: Box-Muller over 53-bit uniforms from the XOF, float64.

    Word i (u64 little-endian) gives u_i = ((w_i >> 11) + 0.5)·2^-53; pairs
    (u_2j, u_2j+1) give r·cos(2πu_2j+1), r·sin(2πu_2j+1) with r = sqrt(-2 ln u_2j),
    filled row-major.
    """
    count = m * m + (m * m) % 2
    words = np.frombuffer(_xof("odd-orthogonal", seed, m, 8 * count), dtype="<u8")
    u = torch.from_numpy(((words >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53)
    u1, u2 = u[0::2], u[1::2]
    radius = torch.sqrt(-2.0 * torch.log(u1))
    angle = 2 * math.pi * u2
    normals = torch.stack((radius * torch.cos(angle), radius * torch.sin(angle)), 1)
    return normals.reshape(-1)[: m * m].reshape(m, m)


def _permutation(purpose: str, seed: int, dim: int) -> Tensor:
    """A seeded permutation: Fisher-Yates, i = d-1 down to 1, j = w_i mod (i+1).

    w_i is the (d-1-i)-th little-endian u64 of the XOF stream.
    """
    words = np.frombuffer(_xof(purpose, seed, dim, 8 * max(dim - 1, 1)), dtype="<u8")
    order = list(range(dim))
    for step, i in enumerate(range(dim - 1, 0, -1)):
        j = int(words[step] % np.uint64(i + 1))
        order[i], order[j] = order[j], order[i]
    return torch.tensor(order, dtype=torch.int64)


@functools.lru_cache(maxsize=16)
def _odd_orthogonal(seed: int, m: int) -> Tensor:
    """A seeded random orthogonal mxm matrix (QR of a Gaussian, signs fixed by diag(R) > 0)."""
    q, r = torch.linalg.qr(_gaussian_matrix(seed, m))
    orthogonal: Tensor = (q * torch.sign(torch.diagonal(r))).to(torch.float32)
    return orthogonal


@functools.lru_cache(maxsize=8)
def _hadamard(size: int) -> Tensor:
    """The normalised Sylvester-Hadamard matrix of a power-of-two size."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < size:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return (h / math.sqrt(size)).to(torch.float32)


def _factors(dim: int) -> tuple[list[int], int]:
    """Split d = 2^k·m into small Hadamard block sizes (product 2^k) and the odd part m."""
    k = (dim & -dim).bit_length() - 1
    odd = dim >> k
    parts = -(-k // _MAX_HADAMARD_BLOCK_LOG2) if k else 0
    sizes = [k // parts + (1 if i < k % parts else 0) for i in range(parts)] if parts else []
    return [1 << s for s in sizes], odd


class _Rotation:
    """R = K·S2·P·K·S1 for one (purpose, seed, dim); K = H ⊗ Q as small per-axis matmuls.

    P, a seeded permutation between the rounds, spreads energy across the axes of
    the Kronecker product: without it, the small odd factor Q mixes too few
    coordinates and sparse rows (outlier channels) stay heavy-tailed.
    """

    def __init__(self, purpose: str, seed: int, dim: int) -> None:
        blocks, odd = _factors(dim)
        self.dim = dim
        self.axes = [*blocks, odd] if odd > 1 else blocks
        mats = [_hadamard(b) for b in blocks]
        if odd > 1:
            mats.append(_odd_orthogonal(seed, odd))
        self.mats = mats
        self.s1 = _signs(purpose + "/s1", seed, dim)
        self.s2 = _signs(purpose + "/s2", seed, dim)
        self.perm = _permutation(purpose + "/p", seed, dim)
        self.unperm = torch.argsort(self.perm)

    def _kron(self, x: Tensor, transpose: bool) -> Tensor:
        n = x.shape[0]
        for axis, mat in enumerate(self.mats):
            size = self.axes[axis]
            before = math.prod(self.axes[:axis])
            after = math.prod(self.axes[axis + 1 :])
            m = mat.T if transpose else mat
            if after == 1:
                x = (x.reshape(-1, size) @ m.T).reshape(n, self.dim)
            else:
                x = torch.matmul(m, x.reshape(n * before, size, after)).reshape(n, self.dim)
        return x

    def forward(self, x: Tensor) -> Tensor:
        first = self._kron(x * self.s1, False)
        return self._kron(first[:, self.perm] * self.s2, False)

    def inverse(self, y: Tensor) -> Tensor:
        first = self._kron(y, True) * self.s2
        return self._kron(first[:, self.unperm], True) * self.s1


@functools.lru_cache(maxsize=16)
def _rotation(purpose: str, seed: int, dim: int) -> _Rotation:
    return _Rotation(purpose, seed, dim)


def rotate(x: Tensor, seed: int = DEFAULT_SEED) -> Tensor:
    """Apply the codec's rotation to float32 rows `(n, d)` (exposed for tests and clients)."""
    return _rotation("rotation", seed, x.shape[-1]).forward(x)


def unrotate(y: Tensor, seed: int = DEFAULT_SEED) -> Tensor:
    """Undo `rotate`."""
    return _rotation("rotation", seed, y.shape[-1]).inverse(y)


# --- bit packing ---------------------------------------------------------------


def _pack(codes: Tensor, bits: int) -> Tensor:
    """Pack uint8 codes LSB-first into a byte stream: code k holds stream bits [k*b, k*b+b).

    Widths dividing 8 pack within a byte; 3 bits packs eight codes into three
    bytes. Both stay in uint8 (no widening), which keeps packing memory-bound.
    """
    count = codes.numel()
    per = 8 // bits if 8 % bits == 0 else 8
    padded = torch.zeros(-(-count // per) * per, dtype=torch.uint8)
    padded[:count] = codes.reshape(-1)
    groups = padded.view(-1, per)
    if 8 % bits == 0:
        out = groups[:, 0].clone()
        for j in range(1, per):
            out |= groups[:, j] << (j * bits)
        return out
    c = groups  # 3 bits: eight codes -> three bytes, spelled out in uint8
    out3 = torch.stack(
        (
            c[:, 0] | (c[:, 1] << 3) | ((c[:, 2] & 3) << 6),
            (c[:, 2] >> 2) | (c[:, 3] << 1) | (c[:, 4] << 4) | ((c[:, 5] & 1) << 7),
            (c[:, 5] >> 1) | (c[:, 6] << 2) | (c[:, 7] << 5),
        ),
        1,
    )
    return out3.reshape(-1)[: -(-count * bits // 8)]


def _unpack(packed: Tensor, bits: int, count: int) -> Tensor:
    """Inverse of `_pack`: `count` codes as uint8."""
    mask = (1 << bits) - 1
    if 8 % bits == 0:
        per = 8 // bits
        codes = torch.stack([(packed >> (j * bits)) & mask for j in range(per)], 1)
        return codes.reshape(-1)[:count]
    groups = -(-count // 8)
    padded = torch.zeros(groups * 3, dtype=torch.uint8)
    padded[: packed.numel()] = packed
    b = padded.view(groups, 3)
    codes3 = torch.stack(
        (
            b[:, 0],
            b[:, 0] >> 3,
            (b[:, 0] >> 6) | (b[:, 1] << 2),
            b[:, 1] >> 1,
            b[:, 1] >> 4,
            (b[:, 1] >> 7) | (b[:, 2] << 1),
            b[:, 2] >> 2,
            b[:, 2] >> 5,
        ),
        1,
    )
    return (codes3 & mask).reshape(-1)[:count]


# --- the codec -----------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _codebook(bits: int) -> tuple[Tensor, Tensor]:
    """Full ascending centroids and the decision boundaries (midpoints) between them."""
    half = torch.tensor(LLOYD_MAX_CENTROIDS[bits], dtype=torch.float32)
    centroids = torch.cat((-half.flip(0), half))
    return centroids, (centroids[1:] + centroids[:-1]) / 2


def _quantize(z: Tensor, boundaries: Tensor) -> Tensor:
    """Index of the nearest centroid: the number of boundaries strictly below z."""
    return torch.bucketize(z, boundaries).to(torch.uint8)


def _chunk_rows(dim: int) -> int:
    """Rows per chunk: bounded memory, and a multiple of 8 so packed chunks end on a byte."""
    return max(8, (_CHUNK_ELEMENTS // dim) // 8 * 8)


def encode(
    tensor: Tensor, bits: int, *, seed: int = DEFAULT_SEED, qjl: bool = False
) -> TurboQuantPayload:
    """Compress a dense float tensor into a `TurboQuantPayload`.

    Args:
        tensor: prompt embeddings, `(num_tokens, hidden)` or `(1, num_tokens, hidden)`
            (any shape works: rows are all dimensions but the last).
        bits: bits per coordinate in total, 1..4 (2..5 with `qjl`, whose sketch
            takes one of them).
        seed: rotation seed, 0..2**63-1; the default keeps encoding deterministic.
        qjl: add the 1-bit QJL residual sketch (TurboQuant-prod).

    Raises:
        TypeError: `tensor` is not a tensor.
        ValueError: unsupported dtype, empty or non-finite tensor, bits or seed
            out of range, non-dense tensor.
    """
    if not isinstance(tensor, Tensor):
        raise TypeError(f"encode expects a torch.Tensor, got {type(tensor).__name__}")
    check_dense(tensor, "tensor to encode")
    dtype_name = str(tensor.dtype).removeprefix("torch.")
    if dtype_name not in TURBOQUANT_DTYPES:
        raise ValueError(f"TurboQuant encodes {', '.join(TURBOQUANT_DTYPES)}, not {dtype_name}")
    code_bits = bits - 1 if qjl else bits
    if type(bits) is not int or not TURBOQUANT_MIN_BITS <= code_bits <= TURBOQUANT_MAX_BITS:
        low, high = TURBOQUANT_MIN_BITS + int(qjl), TURBOQUANT_MAX_BITS + int(qjl)
        raise ValueError(f"bits must be an int in {low}..{high}, got {bits!r}")
    if type(seed) is not int or not 0 <= seed <= TURBOQUANT_MAX_SEED:
        raise ValueError(f"seed must be an int in 0..{TURBOQUANT_MAX_SEED}, got {seed!r}")
    if tensor.dim() < 1 or tensor.numel() == 0:
        raise ValueError(f"cannot encode an empty tensor of shape {tuple(tensor.shape)}")

    dim = tensor.shape[-1]
    rows = tensor.detach().reshape(-1, dim)
    rotation = _rotation("rotation", seed, dim)
    projection = _rotation("qjl", seed, dim) if qjl else None
    centroids, boundaries = _codebook(code_bits)
    scale = math.sqrt(dim)
    norms, codes, signs, residual_norms = [], [], [], []
    step = _chunk_rows(dim)
    for start in range(0, rows.shape[0], step):
        x = rows[start : start + step].to(device="cpu", dtype=torch.float32)
        norm = torch.linalg.vector_norm(x, dim=1)
        if not torch.isfinite(norm).all():  # any NaN/inf element makes its row's norm so
            raise ValueError("cannot encode a tensor holding NaN or infinity (or overflowing)")
        unit = rotation.forward(x) / norm.clamp_min(torch.finfo(torch.float32).tiny)[:, None]
        code = _quantize(unit * scale, boundaries)
        norms.append(norm)
        codes.append(_pack(code.reshape(-1).to(torch.uint8), code_bits))
        if projection is not None:
            residual = unit - centroids[code.to(torch.int64)] / scale
            signs.append(_pack((projection.forward(residual) < 0).reshape(-1).to(torch.uint8), 1))
            residual_norms.append(torch.linalg.vector_norm(residual, dim=1) * norm)
    payload: TurboQuantPayload = {
        "format": TURBOQUANT_FORMAT,
        "version": TURBOQUANT_VERSION,
        "bits": code_bits,
        "seed": seed,
        "shape": list(tensor.shape),
        "dtype": dtype_name,
        "norms": torch.cat(norms),
        "codes": torch.cat(codes),
    }
    if projection is not None:
        payload["qjl_signs"] = torch.cat(signs)
        payload["qjl_norms"] = torch.cat(residual_norms)
    return payload


def _decode_fields(fields: TurboQuantFields, dtype: torch.dtype) -> Tensor:
    dim, bits = fields.dim, fields.bits
    rotation = _rotation("rotation", fields.seed, dim)
    projection = _rotation("qjl", fields.seed, dim) if fields.qjl_signs is not None else None
    centroids, _ = _codebook(bits)
    scale = math.sqrt(dim)
    out = torch.empty(fields.rows, dim, dtype=dtype)
    step = _chunk_rows(dim)
    for start in range(0, fields.rows, step):
        n = min(step, fields.rows - start)
        lo, hi = start * dim * bits // 8, -(-(start + n) * dim * bits // 8)
        code = _unpack(fields.codes[lo:hi], bits, n * dim).to(torch.int64).view(n, dim)
        norm = fields.norms[start : start + n].to(torch.float32)[:, None]
        y = centroids[code] * (norm / scale)
        if projection is not None and fields.qjl_signs is not None and fields.qjl_norms is not None:
            sl, sh = start * dim // 8, -(-(start + n) * dim // 8)
            sign = _unpack(fields.qjl_signs[sl:sh], 1, n * dim).view(n, dim)
            pm = 1.0 - 2.0 * sign.to(torch.float32)
            gamma = fields.qjl_norms[start : start + n].to(torch.float32)[:, None]
            y = y + projection.inverse(pm) * (gamma * _QJL_SCALE / scale)
        out[start : start + n] = rotation.inverse(y).to(dtype)
    return out.reshape(fields.shape)


def decode(
    payload: Mapping[str, object],
    dtype: torch.dtype | None = None,
    *,
    max_dense_bytes: int | None = None,
) -> Tensor:
    """Rebuild the dense tensor a `TurboQuantPayload` stands for, the way vLLM accepts it.

    The result has the payload's original shape (`(num_tokens, hidden)` or
    `(1, num_tokens, hidden)`) on the CPU, in `dtype` (default: the original
    dtype). It depends on `dtype` and the codec version: key any cache of decoded
    tensors by `decode_namespace(dtype)`.

    `max_dense_bytes` bounds the tensor decode would allocate: a 1-bit payload
    expands 16x into bf16 and 32x into float32, so a server that caps uploads
    should cap this too (vLLM densifies at most VLLM_MAX_EMBED_DECODE_BYTES, 2 GiB).

    Raises:
        TypeError: a field that must be a tensor is not one.
        ValueError: a malformed payload, a non-floating `dtype`, or a result larger
            than `max_dense_bytes`.
    """
    fields = validate_turboquant(payload)
    target = TURBOQUANT_DTYPES[fields.dtype] if dtype is None else dtype
    if not target.is_floating_point:
        raise ValueError(f"decode produces floating-point tensors, not {target}")
    dense_bytes = fields.rows * fields.dim * target.itemsize
    if max_dense_bytes is not None and dense_bytes > max_dense_bytes:
        raise ValueError(
            f"decoded TurboQuant tensor would be {dense_bytes} bytes; "
            f"the limit is {max_dense_bytes}"
        )
    return _decode_fields(fields, target)

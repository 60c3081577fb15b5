"""TurboQuant codec: encode/decode throughput and payload size vs dense bf16.

    python -m bench.embeds_turboquant            # 4096 x 4096 bf16 (32 MiB), ~1 min
    python -m bench.embeds_turboquant --full     # 32768 x 4096 (256 MiB), several minutes

For 2, 3 and 4 bits prints encode and decode throughput (elements/s and dense
bf16 MiB/s), bytes per element of the wire payload (torch.save bytes, before
base64) and the ratio dense bf16 payload / TurboQuant payload measured in this
run (expect about 4x at 4 bits), plus the normalised MSE of the round trip.
"""

from __future__ import annotations

import argparse
import base64
import time

import torch

from promptcache.embeds import encode_payload, turboquant


def wire_bytes(obj: object) -> int:
    return len(base64.b64decode(encode_payload(obj)))  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--full", action="store_true", help="32768 rows (256 MiB of bf16)")
    parser.add_argument("--repeat", type=int, default=2, help="best of N timings")
    args = parser.parse_args()
    rows = 32768 if args.full else args.rows

    x = torch.randn(rows, args.hidden, generator=torch.Generator().manual_seed(0))
    x = x.to(torch.bfloat16)
    elements = x.numel()
    mib = elements * 2 / 2**20
    dense = wire_bytes(x)
    start = time.perf_counter()
    encode_payload(x)
    dense_time = time.perf_counter() - start
    print(
        f"tensor {rows}x{args.hidden} bf16 ({mib:.0f} MiB); dense payload {dense / elements:.4f} "
        f"B/elt; torch.save+base64 of it {dense_time * 1e3:.0f} ms; torch threads "
        f"{torch.get_num_threads()}"
    )
    for bits in (2, 3, 4):
        turboquant.decode(turboquant.encode(x[:8], bits))  # warm-up: rotation tables
        encode_s = decode_s = float("inf")
        for _ in range(args.repeat):
            start = time.perf_counter()
            payload = turboquant.encode(x, bits)
            encode_s = min(encode_s, time.perf_counter() - start)
            start = time.perf_counter()
            y = turboquant.decode(payload, torch.bfloat16)
            decode_s = min(decode_s, time.perf_counter() - start)
        size = wire_bytes(payload)
        xf, yf = x.float(), y.float()
        nmse = float(((xf - yf) ** 2).sum() / (xf**2).sum())
        print(
            f"  {bits} bits: encode {elements / encode_s / 1e6:6.1f} Melt/s "
            f"({mib / encode_s:6.1f} MiB/s)  decode {elements / decode_s / 1e6:6.1f} Melt/s "
            f"({mib / decode_s:6.1f} MiB/s)  "
            f"{size / elements:.4f} B/elt  dense/turboquant {dense / size:.2f}x  nMSE {nmse:.4f}"
        )


if __name__ == "__main__":
    main()

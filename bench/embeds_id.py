"""Identifier speed: compute_prompt_embeds_id vs blake3 over the same raw bytes.

    python -m bench.embeds_id            # 32768 x 4096 bf16 (256 MiB), ~30 s
    python -m bench.embeds_id --rows 4096 --repeat 3   # quicker

Prints throughput and two ratios measured in this run (higher is better for us):
  vs raw:   blake3 (same max_threads) over the tensor's bytes, already in hand.
            Goal >= 0.9x: the canonical encoding must cost next to nothing.
  vs naive: `tensor.view(int16).numpy().tobytes()` then the same blake3,
            the obvious copy-then-hash implementation.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import blake3
import torch

from promptcache.embeds import compute_prompt_embeds_id


def best_of(repeat: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=32768)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    tensor = torch.randn(args.rows, args.hidden, generator=torch.Generator().manual_seed(0)).to(
        torch.bfloat16
    )
    raw = tensor.view(torch.uint8).numpy()  # a view: the same bytes, no copy
    mib = tensor.numel() * tensor.element_size() / 2**20
    threads = blake3.blake3.AUTO

    def ours() -> object:
        return compute_prompt_embeds_id(tensor)

    def raw_blake3() -> object:
        return blake3.blake3(raw, max_threads=threads).hexdigest()

    def naive() -> object:
        return blake3.blake3(
            tensor.view(torch.int16).numpy().tobytes(), max_threads=threads
        ).hexdigest()

    # interleave rounds so a noisy neighbour hurts all three alike
    results: dict[str, list[float]] = {"ours": [], "raw": [], "naive": []}
    for _ in range(args.repeat):
        results["raw"].append(best_of(1, raw_blake3))
        results["ours"].append(best_of(1, ours))
        results["naive"].append(best_of(1, naive))
    t = {k: min(v) for k, v in results.items()}
    med = {k: statistics.median(v) for k, v in results.items()}
    print(
        f"tensor: {args.rows}x{args.hidden} bfloat16 = {mib:.0f} MiB, blake3 max_threads=AUTO, "
        f"torch threads={torch.get_num_threads()}, best of {args.repeat}"
    )
    for name, label in (
        ("ours", "compute_prompt_embeds_id"),
        ("raw", "blake3(raw bytes)"),
        ("naive", "tobytes()+blake3"),
    ):
        print(
            f"  {label:26s} {t[name] * 1e3:8.1f} ms  {mib / 1024 / t[name]:6.2f} GiB/s  "
            f"(median {med[name] * 1e3:.1f} ms)"
        )
    print(
        f"ratio vs raw blake3 (throughput, goal >= 0.90): {t['raw'] / t['ours']:.3f}x  "
        f"(medians {med['raw'] / med['ours']:.3f}x)"
    )
    print(
        f"ratio vs naive copy+hash:                       {t['naive'] / t['ours']:.3f}x  "
        f"(medians {med['naive'] / med['ours']:.3f}x)"
    )


if __name__ == "__main__":
    main()

"""Cache speed: PromptEmbedsCache vs a plain locked OrderedDict LRU with the same HMAC.

    python -m bench.embeds_cache                 # ~20 s
    python -m bench.embeds_cache --ops 400000    # longer, steadier

Two workloads, each with 1 and 8 threads (total operations per second across
threads; CPython's GIL makes 8 threads a contention test, not a speed-up):
  get hit:        every lookup finds its entry (refreshes recency).
  put + evict:    the cache holds ~1000 entries and every put evicts one.
Prints ours / baseline throughput ratios measured in this run (goal >= 0.8x).
"""

from __future__ import annotations

import argparse
import hmac
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from promptcache.embeds import ENTRY_OVERHEAD_BYTES, PromptEmbedsCache

PAYLOAD_BYTES = 1024


class BaselineLru:
    """The simplest correct thing: OrderedDict + Lock + HMAC-SHA256 key + byte bound."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.entries: OrderedDict[bytes, str] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, identifier: str, cache_salt: str | None = None) -> str | None:
        key = hmac.digest((cache_salt or "").encode(), identifier.encode(), "sha256")
        with self.lock:
            value = self.entries.get(key)
            if value is not None:
                self.entries.move_to_end(key)
            return value

    def put(self, identifier: str, payload: str, cache_salt: str | None = None) -> bool:
        key = hmac.digest((cache_salt or "").encode(), identifier.encode(), "sha256")
        size = len(payload) + ENTRY_OVERHEAD_BYTES
        with self.lock:
            old = self.entries.pop(key, None)
            if old is not None:
                self.used -= len(old) + ENTRY_OVERHEAD_BYTES
            while self.used + size > self.capacity:
                _, evicted = self.entries.popitem(last=False)
                self.used -= len(evicted) + ENTRY_OVERHEAD_BYTES
            self.entries[key] = payload
            self.used += size
            return True


def run(threads: int, ops: int, work: Callable[[int, int], None]) -> float:
    """Operations per second for `ops` operations split over `threads` threads."""
    per = ops // threads
    barrier = threading.Barrier(threads + 1)
    workers = [
        threading.Thread(target=lambda n=n: (barrier.wait(), work(n, per))) for n in range(threads)
    ]
    for w in workers:
        w.start()
    barrier.wait()
    start = time.perf_counter()
    for w in workers:
        w.join()
    return per * threads / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ops", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    ids = [f"blake3:{i:064x}" for i in range(20_000)]
    payload = "A" * PAYLOAD_BYTES
    salt = "tenant-7f3a"
    entry = PAYLOAD_BYTES + ENTRY_OVERHEAD_BYTES

    def get_bench(make: Callable[[int], object], threads: int) -> float:
        cache = make(10_000 * entry * 2)
        hot = ids[:10_000]
        for i in hot:
            cache.put(i, payload, salt)  # type: ignore[attr-defined]
        get = cache.get  # type: ignore[attr-defined]

        def work(n: int, count: int) -> None:
            k = n * 997
            for j in range(count):
                assert get(hot[(k + j) % 10_000], salt) is not None

        return run(threads, args.ops, work)

    def put_bench(make: Callable[[int], object], threads: int) -> float:
        cache = make(1000 * entry)
        put = cache.put  # type: ignore[attr-defined]

        def work(n: int, count: int) -> None:
            k = n * 2003
            for j in range(count):
                put(ids[(k + j) % 20_000], payload, salt)

        return run(threads, args.ops, work)

    makers: dict[str, Callable[[int], object]] = {"ours": PromptEmbedsCache, "base": BaselineLru}
    print(
        f"payload {PAYLOAD_BYTES} B, salt set, {args.ops} ops per measurement, "
        f"best of {args.rounds} interleaved rounds"
    )
    for label, bench in (("get hit", get_bench), ("put + evict", put_bench)):
        for threads in (1, 8):
            best = {"ours": 0.0, "base": 0.0}
            for _ in range(args.rounds):
                for name in ("base", "ours"):
                    best[name] = max(best[name], bench(makers[name], threads))
            print(
                f"  {label:12s} {threads} thread(s): ours {best['ours'] / 1e3:8.1f} kops/s  "
                f"baseline {best['base'] / 1e3:8.1f} kops/s  "
                f"ratio {best['ours'] / best['base']:.3f}x (goal >= 0.8)"
            )


if __name__ == "__main__":
    main()

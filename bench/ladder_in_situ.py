"""The cache front with its accounting timed in place: `python -m bench.ladder_in_situ FLAGS`.

Runs `python -m promptcache.front FLAGS` with the thread CPU time (`time.thread_time_ns`)
taken around the two steps the predicted/delivered accounting adds to a request
(`front.salted._tally`: the header's check and its count; `FrontMetrics.observe_usage`: the
usage's count), summed apart for requests that carried a prediction header (checked or left
unchecked by the sampler, `front.sampling`) and those that did not. On SIGUSR1 it appends
the means since the last signal to the file named by
`LADDER_IN_SITU_OUT` and starts again:

    tally_with=<us> tally_without=<us> usage_with=<us> usage_without=<us> n_with=<n> n_without=<n>

Why: a loop that calls the check alone (`bench/ladder_overhead.py`'s micro part) keeps its
code and data in the CPU's caches; in the front, between two checks, a request's other work
has evicted them, and each step costs several times more. The difference with and without
is the accounting as the front pays it, far less noisy than the process's CPU per request,
whose paired rounds differ by more than the accounting. Each window's own cost (two clock
reads, ~0.5 us) is in both arms and cancels in the difference. Only for benchmarks.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from multidict import CIMultiDictProxy

import promptcache.front.salted as salted
from promptcache.contract import PREDICTED_MATCH_HEADER
from promptcache.front.__main__ import main
from promptcache.front.hits import Tally
from promptcache.front.metrics import FrontMetrics

_sums: dict[str, list[int]] = {
    key: [0, 0] for key in ("tally_with", "tally_without", "usage_with", "usage_without")
}
_clock = time.thread_time_ns
_tally = salted._tally  # the step timed
_observe = FrontMetrics.observe_usage


def _timed_tally(state: Any, headers: CIMultiDictProxy[str], plan: Any) -> Tally | None:
    start = _clock()
    tally = _tally(state, headers, plan)
    spent = _clock() - start
    sums = _sums["tally_with" if PREDICTED_MATCH_HEADER in headers else "tally_without"]
    sums[0] += 1
    sums[1] += spent
    return tally


def _timed_observe(
    self: FrontMetrics, prompt_tokens: int, cached_tokens: int | None, tally: Tally | None = None
) -> None:
    start = _clock()
    _observe(self, prompt_tokens, cached_tokens, tally)
    spent = _clock() - start
    # A request that carried the header: its prediction checked and believed, or left
    # unchecked by the sampler (`front.sampling`: weight 0), which is part of its cost too.
    carried = tally is not None and (tally.prediction is not None or tally.weight == 0.0)
    sums = _sums["usage_with" if carried else "usage_without"]
    sums[0] += 1
    sums[1] += spent


def _dump(*_: object) -> None:
    means = {k: v[1] / max(1, v[0]) / 1e3 for k, v in _sums.items()}
    counts = f"n_with={_sums['tally_with'][0]} n_without={_sums['tally_without'][0]}"
    with open(os.environ["LADDER_IN_SITU_OUT"], "a") as out:
        out.write(" ".join(f"{k}={v:.3f}" for k, v in means.items()) + f" {counts}\n")
    for sums in _sums.values():
        sums[0] = sums[1] = 0


if __name__ == "__main__":
    salted._tally = _timed_tally
    FrontMetrics.observe_usage = _timed_observe  # type: ignore[method-assign]
    signal.signal(signal.SIGUSR1, _dump)
    sys.exit(main(sys.argv[1:]))

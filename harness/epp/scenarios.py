"""Prompt shapes and load settings that make the EPP's scoring observable.

The default `estimate` token producer packs 4 request bytes into a pseudo-token,
and for chat requests the bytes are each message's role followed by its text.
So a prompt's block count is predictable: with the effective block size B
(>= 64 tokens), a shared prefix of `4*B*k` bytes spans k blocks.

To see whether a prefix *attracts* (rather than whether load happens to agree),
the pod holding it is given a small handicap: a KV-cache usage of 0.1 costs it
0.2 of score (weight 2 x 0.1), while any prefix match worth more than 7% of the
prompt is worth more than that (weight 3 x ratio). Zero match never wins.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from harness.waiting import wait_until

from .fake_pod import FakePod

BYTES_PER_TOKEN = 4
HANDICAP_KV_USAGE = 0.1


def unique_text(n_bytes: int) -> str:
    """n_bytes of text no other request shares (hex of random UUIDs)."""
    out = ""
    while len(out) < n_bytes:
        out += uuid.uuid4().hex
    return out[:n_bytes]


def prefixed(prefix: str, tail_bytes: int = 800) -> str:
    """A prompt that shares `prefix` and then diverges from every other prompt."""
    return prefix + unique_text(tail_bytes)


def wait_scrapes(pods: Sequence[FakePod], n: int = 3, timeout_s: float = 30) -> None:
    """Until every pod was scraped n more times, so the EPP sees values just set."""
    start = [p.scrapes for p in pods]
    wait_until(
        lambda: [p.scrapes - s for p, s in zip(pods, start, strict=True)],
        f"the EPP scraping every pod {n} more times (scrapes since, by pod)",
        within_s=timeout_s,
        interval_s=0.05,
        until=lambda since: all(count >= n for count in since),
    )


PREFIX_INDEX_SIZE = "inference_extension_prefix_indexer_size"
"""GIE's gauge of the prefix index's entries (blocks, summed over pods): its indexer reports
it every second (v1.5.0 `approximateprefix/indexer.go` `reportLRUSize`)."""


class MetricsSource(Protocol):
    """A picker whose Prometheus text a test can read (`EppProcess`)."""

    def metrics_text(self) -> str: ...


def index_size(epp: MetricsSource) -> float | None:
    """The picker's last reported prefix index size; None before its first report (or while
    its metrics port is down)."""
    try:
        text = epp.metrics_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(PREFIX_INDEX_SIZE):
            return float(line.rsplit(None, 1)[-1])
    return None


@contextmanager
def index_grows(epp: MetricsSource | None, by: int = 1, within_s: float = 30) -> Iterator[None]:
    """Around a pick: after it, until the picker's prefix index holds `by` more blocks.

    The picker adds a pick's blocks to its prefix index in a goroutine after it answered
    (GIE v1.5.0 `approximateprefix/plugin.go` `PreRequest`), so a follow-up sent at once may
    not see them. Waiting on the index's own size says they are in; a fixed pause only
    guessed it. The size is read before the pick, so the picks it wraps must add blocks the
    index does not hold yet (a fresh prefix) and the index must not be at its capacity.
    `epp` is a pool's optional picker process, so a pool without one fails here."""
    assert epp is not None, "no picker process to read the prefix index of"
    before = index_size(epp) or 0.0
    yield
    wait_until(
        lambda: index_size(epp),
        f"the picker's prefix index growing by {by} blocks from {before:g} ({PREFIX_INDEX_SIZE})",
        within_s=within_s,
        interval_s=0.2,
        until=lambda size: size is not None and size >= before + by,
    )


def settle_index(seconds: float = 0.5) -> None:
    """A fixed pause for the prefix index, kept only for the one caller that cannot observe
    it: the llm-d-router picker (not buildable here, so its index metric is unverified).
    Everything else waits with `index_grows`."""
    time.sleep(seconds)


def handicap(pods: Sequence[FakePod], loser: FakePod, **values: Any) -> None:
    """Make `loser` slightly worse than the others by load, and wait until seen."""
    for p in pods:
        p.set(kv_cache_usage=0.0, waiting=0)
    loser.set(kv_cache_usage=HANDICAP_KV_USAGE, **values)
    wait_scrapes(pods)

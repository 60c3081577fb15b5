"""promptcache's picker as a boundary: hostile clients beside a well-behaved tenant.

Without the policy step, the picker is the first of our processes to read a request body,
and GIE v1.5.0 alone buffers a body with no cap and no deadline. Our build bounds both
with the front's limits (`picker/boundary`; rendered as `--max-body-bytes` and
`--body-timeout-seconds` from `front.maxRequestBytes` and `front.bodyTimeoutSeconds`).

The pool runs as rendered for `gateway.picker: promptcache` (the real picker binary, its
rendered config and args, on the local control plane), except that ext_proc is served in
plain gRPC (`--secure-serving=false`): the hostile clients here must control the HTTP/2
stream themselves (a TLS relay in between would read what they leave unread). Over real
sockets, at once, until each kind of client has seen its outcome a stated number of times
(`ENOUGH`; three body deadlines at least):

* senders of huge bodies (64 MiB each, in 64 KiB messages) get the front's 413 once the
  cap passes, and stop;
* bodies that never finish get the front's 408 at the deadline;
* streams that send a whole body within the cap and then never read the answer (a small
  HTTP/2 receive window, nothing read) are ended by the send deadline;
* a well-behaved tenant's requests (1 KiB) are all routed, each within a bound stated below;
* the picker's resident memory (VmRSS) stays under a stated bound.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from harness.epp.binary import find_epp_binary, missing_reason
from harness.epp.extproc import DESTINATION_HEADER, chat_body
from harness.epp.launch import Launcher, routing_patch
from harness.epp.scenarios import unique_text
from harness.waiting import wait_until
from promptcache.contract import PickerFlag, PickerTarget

pytestmark = [pytest.mark.epp, pytest.mark.cluster]

OURS = PickerTarget.PROMPTCACHE
CAP = 1024 * 1024
"""`front.maxRequestBytes` here (the rendered default is 256 MiB; a smaller one makes the
bound visible in a few seconds)."""
DEADLINE_S = 2.0
"""`front.bodyTimeoutSeconds` here."""
CHUNK = 64 * 1024
HUGE = 64 * 1024 * 1024
"""What each huge sender would send if nothing stopped it."""
ATTACKERS = 4
"""Clients of each hostile kind, each on its own HTTP/2 connection, all at once."""
TENANT_PICKS = 20
"""The well-behaved tenant's requests the attack lasts for, at least."""
ENOUGH = {
    "huge:413": ATTACKERS,
    "slow:408": ATTACKERS,
    "unread:DEADLINE_EXCEEDED": ATTACKERS,
    "tenant:routed": TENANT_PICKS,
}
"""The attack lasts until every kind of client has seen this many of its outcomes (an unread
stream takes three deadlines, so the attack spans at least that), not for a fixed time: on
a busy machine a fixed window once held fewer than the counts asserted."""
ATTACK_WITHIN_S = 120.0
"""The deadline for those counts: generous, since only a picker that stalls misses it."""
WARM_PICKS = 10
"""The tenant's requests before the idle memory is read."""
TENANT_BOUND_S = 1.0
"""The most one of the well-behaved tenant's requests may wait for its pick while the
attack runs: half the body deadline (a tenant locked out behind a hostile body would wait
at least that deadline). Alone on this machine a pick takes about 2 ms."""
RSS_BOUND_MIB = 256
"""The picker's VmRSS above its idle level at most, during the attack: 12 hostile streams,
each held to the cap (its bytes, GIE's growing copy of them, its parse and the echo) for
at most the deadline, plus the Go heap's headroom (GOGC=100 lets the heap reach twice the
live data before collecting, and more is allocated while a starved collector runs): about
4 x 2 MiB + 4 x 5 MiB live, about 140-160 MiB measured on the shared 2-core machine
(load 7-9). Unbounded, the four huge senders alone make GIE hold 4 x 64 MiB and more (it
appends every chunk, then parses), and the stalled streams are never freed."""


def _headers(size: int | None) -> pb.ProcessingRequest:
    values = {
        ":method": "POST",
        ":path": "/v1/chat/completions",
        ":authority": "gateway.local",
        ":scheme": "http",
        "x-request-id": str(uuid.uuid4()),
        "content-type": "application/json",
    }
    if size is not None:
        values["content-length"] = str(size)
    headers = [base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(headers=headers), end_of_stream=False
        )
    )


def _body(data: bytes, end: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=end))


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _refusals(metrics: str, reason: str) -> float:
    line = f'promptcache_picker_body_refusals_total{{reason="{reason}"}} '
    values = [float(x[len(line) :]) for x in metrics.splitlines() if x.startswith(line)]
    return values[0] if values else 0.0


class Tally:
    """What each kind of client saw, counted across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.waits: dict[str, list[float]] = {}

    def add(self, what: str, wait: float | None = None) -> None:
        with self._lock:
            self.counts[what] = self.counts.get(what, 0) + 1
            if wait is not None:
                self.waits.setdefault(what, []).append(wait)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


def _outcome(call: Any) -> str:
    """The first answer's kind: an immediate response's status, a routed request, or the
    stream's end code."""
    try:
        for resp in call:
            kind = resp.WhichOneof("response")
            if kind == "immediate_response":
                return str(resp.immediate_response.status.code)
            if kind == "request_headers":
                mutation = resp.request_headers.response.header_mutation
                keys = {h.header.key for h in mutation.set_headers}
                return "routed" if DESTINATION_HEADER in keys else "unrouted"
        return "ended"
    except grpc.RpcError as error:
        return str(error.code().name)


def huge_sender(channel: grpc.Channel, stop: threading.Event, tally: Tally) -> None:
    stub = pb_grpc.ExternalProcessorStub(channel)
    while not stop.is_set():
        answered = threading.Event()

        def requests(answered: threading.Event) -> Iterator[pb.ProcessingRequest]:
            yield _headers(HUGE)
            sent = 0
            # Until answered, even once the test stops: a body cut short by the client
            # would end its own stream, which is not what is tested here.
            while sent < HUGE and not answered.is_set():
                sent += CHUNK
                yield _body(b"x" * CHUNK, sent >= HUGE)

        call = stub.Process(requests(answered), timeout=30)
        what = _outcome(call)
        answered.set()
        call.cancel()
        tally.add(f"huge:{what}")


def never_finishing(channel: grpc.Channel, stop: threading.Event, tally: Tally) -> None:
    stub = pb_grpc.ExternalProcessorStub(channel)
    while not stop.is_set():
        answered = threading.Event()

        def requests(answered: threading.Event) -> Iterator[pb.ProcessingRequest]:
            yield _headers(CAP)
            yield _body(b'{"model": "test-model", "messages": [', False)
            answered.wait(30)  # the rest never comes

        start = time.monotonic()
        call = stub.Process(requests(answered), timeout=30)
        what = _outcome(call)
        answered.set()
        call.cancel()
        tally.add(f"slow:{what}", time.monotonic() - start)


def not_reading(channel: grpc.Channel, stop: threading.Event, tally: Tally) -> None:
    """A whole body within the cap, then nothing read: the picker's answer (the body it
    forwards, about the cap) fills the small window and its send waits."""
    stub = pb_grpc.ExternalProcessorStub(channel)
    body = chat_body(unique_text(CAP - 4096))
    raw = json.dumps(body).encode()
    assert len(raw) <= CAP
    while not stop.is_set():
        done = threading.Event()

        def requests(done: threading.Event) -> Iterator[pb.ProcessingRequest]:
            yield _headers(len(raw))
            for i in range(0, len(raw), CHUNK):
                yield _body(raw[i : i + CHUNK], i + CHUNK >= len(raw))
            done.wait(30)

        start = time.monotonic()
        call = stub.Process(requests(done), timeout=30)
        # Read nothing meanwhile, even once the test stops: a client that reads drains the
        # answer, and its stream then waits for the response phase as a gateway's does.
        time.sleep(3 * DEADLINE_S)
        ended = "open"
        try:
            for _ in call:  # now read what was buffered, and how the stream ended
                pass
            ended = "ended"
        except grpc.RpcError as error:
            ended = error.code().name
        done.set()
        call.cancel()
        tally.add(f"unread:{ended}", time.monotonic() - start)


def tenant(target: str, stop: threading.Event, tally: Tally) -> None:
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.ExternalProcessorStub(channel)
        while not stop.is_set():
            raw = json.dumps(chat_body(unique_text(1024))).encode()
            start = time.monotonic()
            requests = iter([_headers(len(raw)), _body(raw, True)])
            call = stub.Process(requests, timeout=30)
            what = _outcome(call)
            call.cancel()
            tally.add(f"tenant:{what}", time.monotonic() - start)
            time.sleep(0.05)


def _run(
    target: str, client: Callable[[grpc.Channel, threading.Event, Tally], None], n: int,
    stop: threading.Event, tally: Tally, options: list[tuple[str, Any]],
) -> list[threading.Thread]:  # fmt: skip
    threads = []
    for _ in range(n):

        def body() -> None:
            with grpc.insecure_channel(target, options=options) as channel:
                client(channel, stop, tally)

        threads.append(threading.Thread(target=body, daemon=True))
    return threads


SMALL_WINDOW = [
    # A client that stops reading: no window growth by bandwidth probing, a small
    # read-ahead, so what the picker sends and nobody reads waits in the picker.
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 16 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]


@pytest.fixture
def launch(cluster: Any, namespace: str, tmp_path: Path) -> Iterator[Launcher]:
    if find_epp_binary(OURS) is None:
        pytest.fail(missing_reason(OURS))
    launcher = Launcher(cluster, namespace, tmp_path, OURS)
    try:
        yield launcher
    finally:
        launcher.close()


def test_hostile_bodies_neither_exhaust_the_picker_nor_lock_out_a_tenant(
    launch: Launcher,
) -> None:
    patch = routing_patch(replicas=2)
    patch["front"].update({"maxRequestBytes": CAP, "bodyTimeoutSeconds": DEADLINE_S})
    pool = launch(spec_patch=patch, extra_args=["--secure-serving=false"])
    args = pool.rendered.epp_args
    assert args[args.index(PickerFlag.MAX_BODY_BYTES) + 1] == str(CAP)
    assert args[args.index(PickerFlag.BODY_TIMEOUT_SECONDS) + 1] == f"{DEADLINE_S:g}"
    assert pool.epp is not None
    target, pid = f"127.0.0.1:{pool.epp.ports.grpc}", pool.epp.pid

    stop, tally = threading.Event(), Tally()
    # Warm: the tenant alone, so the idle level includes a served request's footprint.
    warmed = Tally()
    warm = threading.Thread(target=tenant, args=(target, stop, warmed), daemon=True)
    warm.start()
    try:
        wait_until(
            warmed.snapshot,
            f"the tenant alone routed {WARM_PICKS} times (its outcomes so far)",
            within_s=60,
            interval_s=0.05,
            until=lambda counts: counts.get("tenant:routed", 0) >= WARM_PICKS,
        )
    finally:
        stop.set()
        warm.join(10)
    idle = _rss_mib(pid)

    stop = threading.Event()
    threads = [
        *_run(target, huge_sender, ATTACKERS, stop, tally, []),
        *_run(target, never_finishing, ATTACKERS, stop, tally, []),
        *_run(target, not_reading, ATTACKERS, stop, tally, SMALL_WINDOW),
        threading.Thread(target=tenant, args=(target, stop, tally), daemon=True),
    ]
    peak = idle

    def sample() -> dict[str, int]:
        """The outcomes so far, and the picker's memory now, every 50 ms."""
        nonlocal peak
        peak = max(peak, _rss_mib(pid))
        return tally.snapshot()

    for t in threads:
        t.start()
    try:
        wait_until(
            sample,
            f"every client kind seeing its count of outcomes {ENOUGH} (outcomes so far)",
            within_s=ATTACK_WITHIN_S,
            interval_s=0.05,
            until=lambda counts: all(counts.get(k, 0) >= n for k, n in ENOUGH.items()),
        )
    finally:
        stop.set()
        for t in threads:
            t.join(40)
    assert not any(t.is_alive() for t in threads), "a client never finished"
    assert pool.epp.returncode is None, pool.epp.log_tail()
    counts = tally.counts
    print(f"outcomes {counts}; idle {idle:.0f} MiB, peak {peak:.0f} MiB")

    # Each hostile kind got the answer of its bound, and nothing else.
    assert counts.get("huge:413", 0) >= ATTACKERS, counts
    assert counts.get("slow:408", 0) >= ATTACKERS, counts
    assert counts.get("unread:DEADLINE_EXCEEDED", 0) >= ATTACKERS, counts
    assert set(counts) <= {
        "huge:413", "slow:408", "unread:DEADLINE_EXCEEDED", "tenant:routed",
    }, counts  # fmt: skip
    # A 408 comes at the deadline, not before (and not long after).
    slow = tally.waits["slow:408"]
    assert min(slow) >= DEADLINE_S, slow
    assert max(slow) <= DEADLINE_S + 2.0, slow
    # An unread stream was ended by the picker's send deadline, not by the client's own
    # 30 s timeout (which gives the same code): it is over when the client looks, at 3x
    # the deadline.
    unread = tally.waits["unread:DEADLINE_EXCEEDED"]
    assert max(unread) <= 3 * DEADLINE_S + 5.0, unread
    # The tenant: every request routed (no other outcome above), none waiting long.
    waits = tally.waits["tenant:routed"]
    print(
        f"tenant: {len(waits)} routed, p50 {statistics.median(waits) * 1000:.1f} ms, "
        f"max {max(waits) * 1000:.1f} ms"
    )
    assert len(waits) >= TENANT_PICKS, waits
    assert max(waits) <= TENANT_BOUND_S, waits
    # Each end is counted where the picker's metrics are served.
    metrics = pool.epp.metrics_text()
    for reason, seen in (
        ("request_too_large", counts["huge:413"]),
        ("body_timeout", counts["slow:408"]),
        ("send_timeout", counts["unread:DEADLINE_EXCEEDED"]),
    ):
        assert _refusals(metrics, reason) >= seen, (reason, seen)
    assert peak - idle <= RSS_BOUND_MIB, f"VmRSS grew {peak - idle:.0f} MiB (idle {idle:.0f})"

"""Loopback ports for the servers tests, benches, the demo and the control plane start: out
of the kernel's ephemeral range, and disjoint between the processes of one test run.

Why not "bind port 0 and close": that port comes from the kernel's ephemeral range
(`net.ipv4.ip_local_port_range`), the range every outgoing connection on the machine takes
its source port from. Between the pick and the server's own bind, another process's
connection can take it, and the server fails with "address already in use". With two
pytest workers (`PROMPTCACHE_TEST_WORKERS=2`) each making thousands of connections a minute,
that happened (a TLS relay of the adapter tests, CI run ci-51). Ports below the ephemeral range
are never handed to a connection, so only a server can take one; and each pytest-xdist
worker hands out its own slice of them, so two workers never pick the same port at once.

Within a process, ports are handed out in sequence from a random start in the slice (each
checked by binding it), so one process never returns the same port twice before its slice
wraps, and two processes of the same slice (a worker and a subprocess it starts) start far
apart. Stdlib only, like the rest of the tool.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import socket
import threading
from pathlib import Path

LOWEST = 10000
"""The first port handed out: above the well-known and registered ports services here use."""
SLICES = 8
"""How many slices the range is cut into: the run's main process and up to 7 workers."""
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_DEFAULT_EPHEMERAL = (32768, 60999)


@functools.cache
def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default where it cannot be read); read
    once per process, not once per port handed out."""
    with contextlib.suppress(OSError, ValueError):
        low, high = (int(x) for x in _RANGE_FILE.read_text().split())
        return low, high
    return _DEFAULT_EPHEMERAL


def slice_index() -> int:
    """This process's slice: 0 outside pytest-xdist, 1 + N for worker `gwN` (wrapping)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        return 1 + int(worker[2:]) % (SLICES - 1)
    return 0


def own_range() -> range:
    """The ports this process may hand out; empty when the ephemeral range leaves no room."""
    top = ephemeral_range()[0]
    width = (top - LOWEST) // SLICES
    if width < 64:
        return range(0)
    start = LOWEST + slice_index() * width
    return range(start, start + width)


class PortSequence:
    """The next free port of `ports`, in order from `start` (random when not given).

    Why a class with its range passed in: the process-wide sequence walks this process's
    slice, and the tests walk a small range of their own, where "every other port is taken"
    can be arranged without racing the servers the test session itself runs.
    """

    def __init__(self, ports: range, start: int | None = None) -> None:
        self.ports = ports
        self._lock = threading.Lock()
        self._start = start
        self._pid = -1
        self._next = 0

    def take(self, host: str, avoid: frozenset[int] = frozenset()) -> int:
        """A port bindable on `host` now and not in `avoid`; `OSError` when the whole range
        has been tried (never a port handed out a moment ago, in its place)."""
        ports = self.ports
        with self._lock:
            if self._pid != os.getpid():  # a fork starts its own sequence elsewhere
                self._pid = os.getpid()
                self._next = (
                    random.SystemRandom().randrange(len(ports))
                    if self._start is None
                    else self._start
                )
            for _ in range(len(ports)):
                port = ports[self._next % len(ports)]
                self._next += 1
                if port not in avoid and bindable(host, port):
                    return port
        raise OSError(
            f"no free port on {host} in {ports.start}-{ports.stop - 1}: "
            f"all {len(ports)} are bound or already handed out"
        )


def bindable(host: str, port: int) -> bool:
    """Whether a server could bind `port` on `host` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _bind_zero(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@functools.cache
def _own_sequence() -> PortSequence | None:
    """This process's sequence over its slice; None when the slice is empty (an ephemeral
    range reaching down here: the kernel's choice it is)."""
    ports = own_range()
    return PortSequence(ports) if ports else None


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, that no connection and no other worker will take before
    the caller's server binds it."""
    sequence = _own_sequence()
    return _bind_zero(host) if sequence is None else sequence.take(host)


def free_ports(
    names: list[str], host: str = "127.0.0.1", sequence: PortSequence | None = None
) -> dict[str, int]:
    """One distinct free port per name, or `OSError` when the range has too few free.

    Distinct even when the sequence wraps within the call (a slice nearly full of the
    session's own servers), so two components are never told to bind the same port."""
    sequence = sequence or _own_sequence()
    handed: dict[str, int] = {}
    for name in names:
        taken = frozenset(handed.values())
        if sequence is None:
            port = _bind_zero(host)
            while port in taken:
                port = _bind_zero(host)
        else:
            port = sequence.take(host, avoid=taken)
        handed[name] = port
    return handed

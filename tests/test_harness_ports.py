"""harness/localcluster/ports.py: ports no connection takes and no other worker picks.

Real sockets on loopback. What was wrong before: a port found by binding port 0 comes from
the kernel's ephemeral range, which outgoing connections draw from too, so another
process's connection could take it before the server bound it (CI run ci-51, with two
pytest workers)."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness.localcluster.ports import (
    PortSequence,
    bindable,
    ephemeral_range,
    free_port,
    free_ports,
    own_range,
)

ROOT = Path(__file__).resolve().parent.parent


def test_ports_lie_in_this_processs_slice_below_the_ephemeral_range() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    mine = own_range()
    assert all(p in mine for p in ports), (mine, ports)
    assert mine.stop <= ephemeral_range()[0]


def test_outgoing_connections_never_take_a_port_of_any_slice() -> None:
    """The premise of the fix, checked against this kernel: source ports are ephemeral."""
    low = ephemeral_range()[0]
    with socket.create_server(("127.0.0.1", 0)) as server:
        clients = [socket.create_connection(server.getsockname()) for _ in range(100)]
        try:
            sources = [c.getsockname()[1] for c in clients]
        finally:
            for c in clients:
                c.close()
    assert min(sources) >= low, sources


def quiet_stretch(width: int) -> range:
    """`width` consecutive ports of this process's slice, all free now, found just past
    the process's own sequence (where its next ports come from, so the likeliest free)."""
    mine = own_range()
    first = free_port()
    for offset in range(len(mine)):
        low = mine.start + (first + 1 - mine.start + offset) % len(mine)
        stretch = range(low, low + width)
        if stretch.stop <= mine.stop and all(bindable("127.0.0.1", p) for p in stretch):
            return stretch
    raise AssertionError(f"no {width} consecutive free ports in {mine}")


def test_a_port_in_use_is_never_handed_out() -> None:
    """Every port of a small range but one is in use: the sequence hands out that one,
    starting from the first port taken, and never a port a server holds."""
    ports = quiet_stretch(4)
    servers = [socket.create_server(("127.0.0.1", p)) for p in ports[:3]]
    try:
        sequence = PortSequence(ports, start=0)
        assert sequence.take("127.0.0.1") == ports[3]
    finally:
        for server in servers:
            server.close()


def test_a_call_never_hands_out_one_port_twice_even_when_the_range_wraps() -> None:
    """CI failed once on the old contract: asked for more ports than were free, the
    sequence wrapped and named one port for two components. Now the call refuses."""
    ports = quiet_stretch(4)
    with socket.create_server(("127.0.0.1", ports[1])):
        sequence = PortSequence(ports, start=2)
        handed = free_ports(["a", "b", "c"], sequence=sequence)
        assert sorted(handed.values()) == [ports[0], ports[2], ports[3]]
        with pytest.raises(OSError, match=r"all 4 are bound or already handed out"):
            free_ports(["a", "b", "c", "d"], sequence=PortSequence(ports, start=0))


def test_two_workers_hand_out_disjoint_ports() -> None:
    code = (
        "import json; from harness.localcluster.ports import free_port, own_range; "
        "r = own_range(); print(json.dumps([r.start, r.stop, [free_port() for _ in range(50)]]))"
    )
    seen = {}
    for worker in ("gw0", "gw1", ""):
        env = {**os.environ, "PYTEST_XDIST_WORKER": worker, "PYTHONPATH": str(ROOT)}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        start, stop, ports = json.loads(out.stdout)
        assert all(start <= p < stop for p in ports)
        seen[worker] = range(start, stop)
    ranges = sorted(seen.values(), key=lambda r: r.start)
    assert all(a.stop <= b.start for a, b in itertools.pairwise(ranges)), seen

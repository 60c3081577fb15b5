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

from harness.localcluster.ports import ephemeral_range, free_port, free_ports, own_range

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


def test_a_port_in_use_is_never_handed_out() -> None:
    taken = free_port()
    with socket.create_server(("127.0.0.1", taken)):
        handed = free_ports([str(i) for i in range(len(own_range()) - 1)])
    assert taken not in handed.values()
    assert len(set(handed.values())) == len(handed)


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

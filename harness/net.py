"""Loopback ports for the servers tests, benches and the demo start.

One helper for every one of them (there were seven copies once). The local control plane
picks its own components' ports together (`e2e.localcluster.state.free_ports`), since it
must hold every socket until all are chosen; a single server started a moment later needs
only this.
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` right now, for a server the caller starts a moment later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])

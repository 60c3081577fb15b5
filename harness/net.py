"""Loopback ports for the servers tests, benches and the demo start, and readiness polls.

One port helper for every one of them (there were seven copies once):
`harness.localcluster.ports`, which the control plane's own components use too. Its ports
lie below the kernel's ephemeral range, in a slice of their own per pytest-xdist worker, so
no connection and no other worker takes one between the pick and the server's bind.
"""

from __future__ import annotations

import socket
import urllib.request

from harness.localcluster.ports import free_port

__all__ = ["accepts_connections", "answers_ok", "free_port"]


def answers_ok(url: str, timeout: float = 2) -> bool:
    """Whether `url` answers 200 now; False while nothing listens yet or it errs.

    For polls on a server just started: a loaded machine can take seconds to bind the
    port, and a refused connection then means "not yet", not a failure (an autoscaling
    run failed in CI when a Prometheus poll let the refusal escape).
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def accepts_connections(host: str, port: int, timeout: float = 1) -> bool:
    """Whether something listens on `host:port` now (a TCP connect, closed at once): for a
    server whose readiness is no more than its port (a gRPC server before TLS is set up,
    an engine still starting), where a refusal means "not yet"."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False

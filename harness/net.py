"""Loopback ports for the servers tests, benches and the demo start.

One helper for every one of them (there were seven copies once). The local control plane
picks its own components' ports together (`harness.localcluster.state.free_ports`), since it
must hold every socket until all are chosen; a single server started a moment later needs
only this.
"""

from __future__ import annotations

import socket
import urllib.request


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` right now, for a server the caller starts a moment later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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

"""The rendered vLLM health check (startup and liveness behind the front) run for real.

It is a bash script the kubelet runs inside the vllm container; here it runs against a
real HTTP server on a real socket, answering as vLLM's /health does or failing as a
wedged or absent engine would."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from promptcache.render.model_server import vllm_health_check


class _Health(BaseHTTPRequestHandler):
    status: ClassVar[int] = 200
    paths: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        type(self).paths.append(self.path)
        self.send_response(self.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    _Health.status, _Health.paths = 200, []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def _check(port: int, timeout_s: float = 10) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        vllm_health_check(port), capture_output=True, timeout=timeout_s, check=False
    )


def test_a_healthy_engine_passes_and_is_asked_for_health(server: ThreadingHTTPServer) -> None:
    done = _check(server.server_address[1])
    assert done.returncode == 0, done.stderr
    assert _Health.paths == ["/health"]


@pytest.mark.parametrize("status", [500, 503, 404, 301])
def test_any_other_status_fails(server: ThreadingHTTPServer, status: int) -> None:
    _Health.status = status
    assert _check(server.server_address[1]).returncode != 0


def test_nothing_listening_fails_as_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        done = _check(s.getsockname()[1])  # bound, never listening: refused
    assert done.returncode != 0
    assert b"Connection refused" in done.stderr, done.stderr


def test_an_engine_that_never_answers_fails_after_four_seconds() -> None:
    """Accepted and never answered (a wedged event loop): the check gives up by itself
    after its 4 s read timeout (the probe's own is 5 s) and fails; `_check` raises if it
    had to be killed instead."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        started = time.monotonic()
        done = _check(listener.getsockname()[1], timeout_s=60)
        waited = time.monotonic() - started
    assert done.returncode != 0
    assert waited >= 4, f"gave up after {waited:.1f} s, before its read timeout"

"""The harness's TLS relay says why it could not reach the picker, and closes cleanly.

Without a reason, a relay that cannot reach the picker can only close the client's
connection, and grpcio reports `UNAVAILABLE: Socket closed`, which says nothing of the
cause (the benchmark once switched the picker's TLS off over exactly that). No cluster and
no picker binary: the failure is a port where nothing listens yet, as when GIE is still
making its key after its health port is up.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.epp.extproc import ExtProcClient, chat_body
from harness.epp.tls_relay import TlsRelay
from harness.net import free_port


def test_a_picker_not_listening_is_named_not_just_socket_closed() -> None:
    port = free_port()  # nothing listens here
    with (
        ExtProcClient(f"127.0.0.1:{port}", tls=True, timeout_s=10) as client,
        pytest.raises(ConnectionError) as caught,
    ):
        client.pick(chat_body("hello"))
    message = str(caught.value)
    assert f"TLS relay could not reach the picker on 127.0.0.1:{port}" in message
    assert "ConnectionRefusedError" in message


@pytest.fixture
def tls_echo(tmp_path: Path) -> Iterator[int]:
    """A TLS echo server on loopback with a self-signed key (as the picker makes one)."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(["h2"])
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=echo, args=(raw,), daemon=True).start()

    def echo(raw: socket.socket) -> None:
        with contextlib.suppress(OSError), ctx.wrap_socket(raw, server_side=True) as conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(listener.getsockname()[1])
    stop.set()
    thread.join(timeout=5)
    listener.close()


def test_closing_the_relay_ends_open_connections_without_an_asyncio_error(
    tls_echo: int, caplog: pytest.LogCaptureFixture
) -> None:
    """The bench closes the relay after every router while the picker's stream is open; that
    must end the connection, not leave asyncio logging a traceback per run."""
    relay = TlsRelay(tls_echo)
    with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as client:
        client.sendall(b"ping")
        assert client.recv(4) == b"ping"  # relayed through TLS and back: the pipes are open
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            relay.close()
        assert client.recv(4) == b"", "the relay left the client's connection open"
    errors = [r for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]

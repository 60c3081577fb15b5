"""A loopback relay that lets a plaintext gRPC client talk to an Endpoint Picker serving TLS.

A picker rendered without the policy step in front serves ext_proc over TLS with the
self-signed certificate it makes at start-up (`--secure-serving` defaults to true), and
gateways dial it without verifying that certificate (the GIE and llm-d guides configure
exactly that). grpcio cannot skip verification, and the certificate names no host, so the
harness plays the gateway's TLS side here: it accepts plaintext HTTP/2 on a free loopback
port and relays the bytes over a real TLS connection (ALPN h2, no verification) to the
picker. Tests thereby run the picker with its rendered transport instead of switching
TLS off.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading

from .process import free_port


def _client_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the picker's certificate is self-signed, as in a cluster
    ctx.set_alpn_protocols(["h2"])
    return ctx


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


class TlsRelay:
    """Plaintext on 127.0.0.1:<port> in, TLS to `upstream_port` out; one thread per side."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._ctx = _client_context()
        self._closed = False
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                raw = socket.create_connection(self.upstream, timeout=10)
                upstream = self._ctx.wrap_socket(raw)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            self._conns += [client, upstream]
            threading.Thread(target=_pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.close()

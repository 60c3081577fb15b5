"""localcluster.pki makes a CA and certificates that openssl and a real TLS handshake accept,
with the names, key usages and subjects the control plane's components rely on."""

from __future__ import annotations

import socket
import ssl
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from harness.localcluster.pki import APISERVER_SANS, admin_ssl, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    make_pki(d)
    return d


def openssl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["openssl", *args], capture_output=True, text=True, check=check)


def text(pki: Path, name: str) -> str:
    return openssl("x509", "-in", str(pki / f"{name}.crt"), "-noout", "-text").stdout


def test_every_leaf_chains_to_the_ca_for_its_purpose(pki: Path) -> None:
    ca = str(pki / "ca.crt")
    for name, purpose in (
        ("apiserver", "sslserver"),
        ("admin", "sslclient"),
        ("front-proxy-client", "sslclient"),
    ):
        out = openssl("verify", "-purpose", purpose, "-CAfile", ca, str(pki / f"{name}.crt"))
        assert out.stdout.strip().endswith(": OK"), out
    # And not for the other purpose: a client cert cannot serve, the serving cert is no client.
    for name, purpose in (("admin", "sslserver"), ("apiserver", "sslclient")):
        out = openssl(
            "verify", "-purpose", purpose, "-CAfile", ca, str(pki / f"{name}.crt"), check=False
        )
        assert out.returncode != 0, out


def test_the_api_server_cert_names_loopback_and_the_in_cluster_names(pki: Path) -> None:
    out = openssl(
        "x509", "-in", str(pki / "apiserver.crt"), "-noout", "-ext", "subjectAltName"
    ).stdout
    listed = {n.strip().replace("IP Address:", "IP:") for n in out.splitlines()[1].split(",")}
    assert listed == set(APISERVER_SANS)
    assert "kubernetes.default.svc.cluster.local" in out


def test_subjects_and_key_usages(pki: Path) -> None:
    admin = text(pki, "admin")
    assert (
        "Subject: O = system:masters, CN = kubernetes-admin" in admin
    )  # cluster-admin through RBAC
    assert "TLS Web Client Authentication" in admin
    assert "Digital Signature, Key Encipherment" in admin
    assert "Subject: CN = front-proxy-client" in text(pki, "front-proxy-client")
    api = text(pki, "apiserver")
    assert "TLS Web Server Authentication" in api
    assert "Client Authentication" not in api
    ca = text(pki, "ca")
    assert "CA:TRUE" in ca
    assert "Subject: CN = promptcache-local-ca" in ca
    assert "prime256v1" in ca


def test_the_service_account_pair_matches_and_keys_are_private(pki: Path) -> None:
    derived = openssl("ec", "-in", str(pki / "sa.key"), "-pubout").stdout
    assert derived == (pki / "sa.pub").read_text()
    for path in pki.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_a_tls_handshake_with_mutual_auth(pki: Path) -> None:
    """The API server's side (serving cert, client CA) and the admin's side (`admin_ssl`)
    complete a real handshake over loopback, checking the hostname 127.0.0.1."""
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki / "ca.crt"))
    server_ctx.load_cert_chain(str(pki / "apiserver.crt"), str(pki / "apiserver.key"))
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    seen: dict[str, object] = {}
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            conn, _ = listener.accept()
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                seen["peer"] = tls.getpeercert()
                tls.sendall(b"ok")

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        with (
            socket.create_connection(("127.0.0.1", port), timeout=30) as raw,
            admin_ssl(pki).wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            assert tls.recv(2) == b"ok"
            server_cert = tls.getpeercert()
        thread.join(timeout=30)
    assert dict(x[0] for x in server_cert["subject"])["commonName"] == "kube-apiserver"
    peer = seen["peer"]
    assert isinstance(peer, dict)
    subject = dict(x[0] for x in peer["subject"])
    assert subject == {"organizationName": "system:masters", "commonName": "kubernetes-admin"}

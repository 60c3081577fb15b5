"""The cluster's PKI, made with openssl: one CA, serving and client certificates, SA keys.

Why openssl and not the components' self-signed certs: every client (kubectl, the Python
client, the operator, helm) needs one CA to trust, and the admin needs a client
certificate in `system:masters`. EC P-256 keys: generated in milliseconds, accepted by
every component. Files, all mode 0600, in the directory given to `make_pki`:

- `ca.crt`/`ca.key`: the CA (client CA, request-header CA, cluster signing CA)
- `apiserver.crt`/`.key`: serving, SANs for loopback and the in-cluster names
- `admin.crt`/`.key`: client, `O=system:masters`, `CN=kubernetes-admin`
- `front-proxy-client.crt`/`.key`: the aggregation layer's client certificate
- `sa.key`/`sa.pub`: the service-account token signing pair
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

from .errors import ClusterError

CA_SUBJECT = "/CN=promptcache-local-ca"
APISERVER_SANS = (
    "IP:127.0.0.1",
    "IP:10.0.0.1",  # the first address of the service CIDR: the `kubernetes` Service
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
)
CLIENT_EXT = "extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n"
DAYS = "3650"


def openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ClusterError(f"openssl {' '.join(args[:2])} failed: {proc.stderr}")


def make_pki(pki: Path) -> None:
    """A CA, the API server's serving cert, the admin and front-proxy client certs, and the
    service-account signing key pair, in `pki` (created if missing)."""
    if shutil.which("openssl") is None:
        raise ClusterError("openssl is needed to create the cluster's certificates")
    pki.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", DAYS,
            "-subj", CA_SUBJECT, cwd=pki)  # fmt: skip

    def leaf(name: str, subj: str, ext: str) -> None:
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subj,
                cwd=pki)  # fmt: skip
        (pki / f"{name}.ext").write_text(ext)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.crt", "-days", DAYS,
                "-extfile", f"{name}.ext", cwd=pki)  # fmt: skip

    leaf(
        "apiserver",
        "/CN=kube-apiserver",
        f"subjectAltName={','.join(APISERVER_SANS)}\n"
        "extendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n",
    )
    leaf("admin", "/O=system:masters/CN=kubernetes-admin", CLIENT_EXT)
    # The aggregation layer's client: the API server proxies to extension API servers (e.g. a
    # custom metrics adapter) with this certificate and the user in X-Remote-* headers.
    leaf("front-proxy-client", "/CN=front-proxy-client", CLIENT_EXT)
    openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key", cwd=pki)
    openssl("ec", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    for p in pki.iterdir():
        p.chmod(0o600)


def admin_ssl(pki: Path) -> ssl.SSLContext:
    """A client TLS context that trusts the CA and presents the admin certificate."""
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return ctx

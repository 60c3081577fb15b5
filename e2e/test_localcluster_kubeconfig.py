"""localcluster.kubeconfig writes a kubeconfig the built kubectl reads back as written."""

from __future__ import annotations

import base64
import json
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness.localcluster.kubeconfig import write_kubeconfig
from harness.localcluster.pki import make_pki
from harness.localcluster.targets import binary_path


@pytest.fixture(scope="module")
def kubectl() -> str:
    path = binary_path("kubectl")
    if not path.is_file():
        pytest.fail(f"kubectl is not built at {path}: run `python e2e/cluster build`")
    return str(path)


def view(kubectl: str, cfg: Path, *flags: str) -> Any:
    out = subprocess.run(
        [kubectl, "config", "view", "--kubeconfig", str(cfg), "-o", "json", *flags],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(out.stdout)


def test_kubectl_reads_back_what_was_written(kubectl: str, tmp_path: Path) -> None:
    make_pki(tmp_path / "pki")
    path = write_kubeconfig(tmp_path, "kc-test", 6443)
    assert path == tmp_path / "kubeconfig"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it names the admin's private key

    seen = view(kubectl, path)
    assert seen["current-context"] == "kc-test"
    assert seen["clusters"] == [
        {
            "name": "kc-test",
            "cluster": {
                "server": "https://127.0.0.1:6443",
                "certificate-authority": str(tmp_path / "pki" / "ca.crt"),
            },
        }
    ]
    assert seen["users"] == [
        {
            "name": "kc-test-admin",
            "user": {
                "client-certificate": str(tmp_path / "pki" / "admin.crt"),
                "client-key": str(tmp_path / "pki" / "admin.key"),
            },
        }
    ]
    assert seen["contexts"] == [
        {"name": "kc-test", "context": {"cluster": "kc-test", "user": "kc-test-admin"}}
    ]

    # --flatten makes kubectl read every referenced file: the paths resolve to the PKI.
    flat = view(kubectl, path, "--flatten", "--minify")
    cluster = flat["clusters"][0]["cluster"]
    user = flat["users"][0]["user"]
    assert (
        base64.b64decode(cluster["certificate-authority-data"])
        == (tmp_path / "pki" / "ca.crt").read_bytes()
    )
    assert (
        base64.b64decode(user["client-certificate-data"])
        == (tmp_path / "pki" / "admin.crt").read_bytes()
    )
    assert (
        base64.b64decode(user["client-key-data"]) == (tmp_path / "pki" / "admin.key").read_bytes()
    )

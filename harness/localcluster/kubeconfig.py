"""The admin kubeconfig: the one file every client of a local cluster reads.

Written as JSON (valid YAML; every Kubernetes client reads it), with file paths to the PKI
rather than inline data, so `cat kubeconfig` stays readable and a rotated cert is picked up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def kubeconfig(name: str, server: str, pki: Path) -> dict[str, Any]:
    """Cluster `name` at `server`, trusting `pki/ca.crt`, as `<name>-admin` (`pki/admin.*`),
    in a current context named `name`."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": f"{name}-admin",
                "user": {
                    "client-certificate": str(pki / "admin.crt"),
                    "client-key": str(pki / "admin.key"),
                },
            }
        ],
        "contexts": [
            {"name": name, "context": {"cluster": name, "user": f"{name}-admin"}},
        ],
        "current-context": name,
    }


def write_kubeconfig(d: Path, name: str, port: int) -> Path:
    """`d/kubeconfig` (mode 0600) for the API server on loopback `port`, PKI in `d/pki`."""
    path = d / "kubeconfig"
    cfg = kubeconfig(name, f"https://127.0.0.1:{port}", d / "pki")
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    path.chmod(0o600)
    return path

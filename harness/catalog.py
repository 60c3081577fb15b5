"""Run the model-list responder (`promptcache catalog`) as a process against a test cluster,
with a ServiceAccount that holds exactly the chart's rules for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from harness.localcluster.ports import free_ports
from harness.net import answers_ok
from harness.pytest_cluster import Cluster
from harness.waiting import log_tail, wait_until
from promptcache.contract.router import GATEWAY_HEADER

ROOT = Path(__file__).resolve().parents[1]
RULES_FILE = ROOT / "charts" / "promptcache-operator" / "files" / "model-list-rules.yaml"


def least_privilege_kubeconfig(cluster: Cluster, namespace: str, workdir: Path) -> Path:
    """A ServiceAccount in `namespace` bound there to a Role of the chart's rules, and
    nothing else: what the chart gives the responder with watch.namespaces."""
    rules = yaml.safe_load(RULES_FILE.read_text())
    docs = [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "models", "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "models", "namespace": namespace}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "models", "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "models"},
         "subjects": [{"kind": "ServiceAccount", "name": "models", "namespace": namespace}]},
    ]  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    return cluster.service_account_kubeconfig(namespace, "models", workdir / "models.kubeconfig")


class CatalogProcess:
    """`promptcache catalog -n NS` on loopback; a context manager so it always stops."""

    def __init__(self, kubeconfig: Path, namespaces: list[str], workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        ports = free_ports(["http", "health"])
        self.port, self.health_port = ports["http"], ports["health"]
        self.log_path = workdir / "catalog.log"
        self.argv = [
            sys.executable, "-m", "promptcache.cli", "catalog",
            *(f"--namespace={ns}" for ns in namespaces),
            "--bind-address=127.0.0.1", f"--port={self.port}",
            f"--health-port={self.health_port}", "--log-level=info",
        ]  # fmt: skip
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"}
        self.env["NO_PROXY"] = self.env["no_proxy"] = "127.0.0.1,localhost"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> CatalogProcess:
        with self.log_path.open("ab") as log:
            proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        self._proc = proc

        def exited() -> str | None:
            code = proc.poll()
            return None if code is None else f"the responder exited {code}"

        wait_until(
            lambda: answers_ok(f"http://127.0.0.1:{self.health_port}/readyz"),
            "the responder's /readyz answering 200",
            within_s=60,
            interval_s=0.5,
            fail_if=exited,
            detail=lambda: f"log tail:\n{log_tail(self.log_path, 40)}",
        )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)

    def request(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> tuple[int, Any]:
        """One request as the Gateway forwards it (the route's headers included)."""
        req = urllib.request.Request(
            self.url + path, data=body, method=method, headers=dict(headers)
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return int(resp.status), json.loads(resp.read())
        except urllib.error.HTTPError as error:
            return int(error.code), json.loads(error.read())

    def models(self, gateway: str, host: str = "gateway.local") -> list[tuple[str, str | None]]:
        """(id, parent) of `GET /v1/models` for a Gateway `<namespace>/<name>`."""
        status, body = self.request("GET", "/v1/models", {GATEWAY_HEADER: gateway, "Host": host})
        assert status == 200, body
        return [(m["id"], m.get("parent")) for m in body["data"]]

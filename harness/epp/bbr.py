"""Run the real body-based router (GIE `bbr` v1.5.0) and play the Gateway around it.

The router is an ext_proc in front of the Gateway's routing: it copies the body's `model`
into a header and the model's base (from the bbr-managed ConfigMaps it watches on the API
server) into another; the Gateway then matches HTTPRoute rules on those headers. Here the
router runs with the arguments the chart gives it (`helm template`, only ports added) and a
kubeconfig for the local control plane, and `route_for` matches the rendered HTTPRoutes the
way a Gateway does for the rules this project renders (path prefix, exact headers).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import grpc
import yaml

from e2e.localcluster.state import free_ports

from .extproc import ExtProcClient
from .process import terminate


def chart_router_args(helm_template: Any) -> list[str]:
    """The router container's args as the chart renders them (bodyBasedRouter enabled)."""
    docs = [
        d for d in yaml.safe_load_all(helm_template("--set", "bodyBasedRouter.enabled=true")) if d
    ]
    (deployment,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-bbr")
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return [str(a) for a in container["args"]]


@dataclass(frozen=True)
class RouterPorts:
    grpc: int
    health: int
    metrics: int


class BbrProcess:
    """One running router; a context manager so it always stops."""

    def __init__(
        self,
        binary: Path,
        workdir: Path,
        kubeconfig: Path,
        args: Sequence[str],
        namespace: str | None = None,
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        ports = free_ports(["grpc", "health", "metrics"])
        self.ports = RouterPorts(ports["grpc"], ports["health"], ports["metrics"])
        self.log_path = workdir / "bbr.log"
        self.args = [
            str(binary),
            f"--grpc-port={self.ports.grpc}",
            f"--grpc-health-port={self.ports.health}",
            f"--metrics-port={self.ports.metrics}",
            *args,
        ]
        self.secure = "--secure-serving=false" not in args
        self.env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "NAMESPACE")}
        self.env["KUBECONFIG"] = str(kubeconfig)
        if namespace is not None:
            self.env["NAMESPACE"] = namespace
        self.env["NO_PROXY"] = self.env["no_proxy"] = "127.0.0.1,localhost"
        self.workdir = workdir
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None

    def __enter__(self) -> BbrProcess:
        self._log = self.log_path.open("wb")
        self._proc = subprocess.Popen(
            self.args, stdout=self._log, stderr=subprocess.STDOUT, env=self.env, cwd=self.workdir
        )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            terminate(self._proc, 20.0)
        if self._log is not None:
            self._log.close()

    def log_tail(self, lines: int = 60) -> str:
        if self._log is not None:
            self._log.flush()
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def healthy(self) -> bool:
        with grpc.insecure_channel(f"127.0.0.1:{self.ports.health}") as ch:
            call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = ch.unary_unary(
                "/grpc.health.v1.Health/Check"
            )
            try:
                return bool(call(b"", timeout=2) == b"\x08\x01")
            except grpc.RpcError:
                return False

    def serving_ext_proc(self) -> bool:
        """Whether the ext_proc port accepts connections: with TLS the router first makes a
        self-signed certificate, seconds after its health port is up."""
        try:
            with socket.create_connection(("127.0.0.1", self.ports.grpc), timeout=1):
                return True
        except OSError:
            return False

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"bbr exited with {self._proc.returncode}:\n{self.log_tail()}")
            if self.healthy() and self.serving_ext_proc():
                return
            time.sleep(0.2)
        raise TimeoutError(f"bbr not healthy after {timeout_s}s:\n{self.log_tail()}")

    def client(self) -> ExtProcClient:
        """The Gateway's ext_proc client (TLS without verification, as the chart's Istio
        DestinationRule does, when the router serves its self-signed certificate)."""
        return ExtProcClient(f"127.0.0.1:{self.ports.grpc}", tls=self.secure)


def _matches(match: Mapping[str, Any], path: str, headers: Mapping[str, str]) -> bool:
    lowered = {k.lower(): v for k, v in headers.items()}
    want_path = match.get("path", {"type": "PathPrefix", "value": "/"})
    if want_path["type"] != "PathPrefix" or not path.startswith(want_path["value"]):
        return False
    for header in match.get("headers", []):
        if header.get("type", "Exact") != "Exact":
            raise NotImplementedError(header)
        if lowered.get(header["name"].lower()) != header["value"]:
            return False
    return True


def route_for(
    routes: Sequence[Mapping[str, Any]], path: str, headers: Mapping[str, str]
) -> str | None:
    """The InferencePool a Gateway sends the request to after the router ran, or None (no
    rule matches: the Gateway answers 404). Only the shapes the renderer writes."""
    for route in routes:
        for rule in route["spec"]["rules"]:
            if any(_matches(m, path, headers) for m in rule.get("matches", [{}])):
                (backend,) = rule["backendRefs"]
                return str(backend["name"])
    return None

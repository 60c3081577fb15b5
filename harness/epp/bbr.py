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
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import grpc
import yaml

from harness.localcluster.ports import free_ports
from harness.net import accepts_connections
from harness.waiting import wait_until

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
    """One running router; a context manager so it always stops.

    `namespace` (no default: each caller chooses): read only that namespace's mapping
    ConfigMaps (the chart's `allNamespaces: false`); None reads every namespace (the chart's
    default, for a control plane of the caller's own). A test on the session's shared
    control plane passes its own: other tests' namespaces are deleted in
    the background after them, and a mapping ConfigMap the router lists as it starts, then
    sees deleted with its namespace, stays mapped in that router for good (bbr v1.5.0
    misses deletions: `e2e/test_bbr.py`). Another test's leftover `base-b` failed the
    operator's exit test so in a CI run; one leftover mapping fails it every time.
    """

    def __init__(
        self,
        binary: Path,
        workdir: Path,
        kubeconfig: Path,
        args: Sequence[str],
        *,
        namespace: str | None,
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

    @property
    def pid(self) -> int:
        """The running process's id (for its CPU time in /proc)."""
        assert self._proc is not None, "not started"
        return self._proc.pid

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
        return accepts_connections("127.0.0.1", self.ports.grpc)

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        proc = self._proc

        def exited() -> str | None:
            if proc is None or proc.poll() is None:
                return None
            return f"bbr exited with {proc.returncode}"

        wait_until(
            lambda: {"health": self.healthy(), "ext_proc": self.serving_ext_proc()},
            "bbr serving health and ext_proc",
            within_s=timeout_s,
            interval_s=0.2,
            until=lambda up: all(up.values()),
            fail_if=exited,
            detail=lambda: f"log tail:\n{self.log_tail()}",
        )

    def client(self) -> ExtProcClient:
        """The Gateway's ext_proc client (TLS without verification, as the chart's Istio
        DestinationRule does, when the router serves its self-signed certificate)."""
        return ExtProcClient(f"127.0.0.1:{self.ports.grpc}", tls=self.secure)


@dataclass(frozen=True)
class Routed:
    """Where a Gateway sends a request after the router ran: the rule's backend, and the
    request's headers after the rule's `RequestHeaderModifier` filters."""

    backend: str
    headers: dict[str, str]


def _matches(match: Mapping[str, Any], method: str, path: str, headers: Mapping[str, str]) -> bool:
    lowered = {k.lower(): v for k, v in headers.items()}
    want_path = match.get("path", {"type": "PathPrefix", "value": "/"})
    if want_path["type"] == "Exact":
        if path.split("?", 1)[0] != want_path["value"]:
            return False
    elif want_path["type"] == "PathPrefix":
        prefix = want_path["value"].rstrip("/")
        bare = path.split("?", 1)[0]
        if not (bare == prefix or bare.startswith(prefix + "/") or not prefix):
            return False
    else:
        raise NotImplementedError(want_path)
    if "method" in match and match["method"] != method:
        return False
    for header in match.get("headers", []):
        if header.get("type", "Exact") != "Exact":
            raise NotImplementedError(header)
        if lowered.get(header["name"].lower()) != header["value"]:
            return False
    return True


def _precedence(match: Mapping[str, Any]) -> tuple[bool, int, bool, int]:
    """Gateway API's order among matching rules: an exact path, then the longest prefix,
    then a method match, then the most header matches (ties: the first route, the oldest)."""
    path = match.get("path", {"type": "PathPrefix", "value": "/"})
    return (path["type"] == "Exact", len(path["value"]), "method" in match,
            len(match.get("headers", [])))  # fmt: skip


def _modified(rule: Mapping[str, Any], headers: Mapping[str, str]) -> dict[str, str]:
    out = dict(headers)
    for f in rule.get("filters", []):
        if f["type"] != "RequestHeaderModifier":
            raise NotImplementedError(f)
        mod = f["requestHeaderModifier"]
        for h in mod.get("set", []):
            out = {k: v for k, v in out.items() if k.lower() != h["name"].lower()}
            out[h["name"]] = h["value"]
        for name in mod.get("remove", []):
            out = {k: v for k, v in out.items() if k.lower() != name.lower()}
    return out


def route(
    routes: Sequence[Mapping[str, Any]], method: str, path: str, headers: Mapping[str, str]
) -> Routed | None:
    """The rule a Gateway picks among every rule of `routes` (all on one Gateway), by Gateway
    API precedence, or None (the Gateway answers 404). Only the shapes this project renders:
    Exact and PathPrefix paths, a method, exact headers, RequestHeaderModifier."""
    best: tuple[tuple[bool, int, bool, int], Mapping[str, Any]] | None = None
    for r in routes:
        for rule in r["spec"]["rules"]:
            for match in rule.get("matches", [{}]):
                if _matches(match, method, path, headers) and (
                    best is None or _precedence(match) > best[0]
                ):
                    best = (_precedence(match), rule)
    if best is None:
        return None
    (backend,) = best[1]["backendRefs"]
    return Routed(str(backend["name"]), _modified(best[1], headers))


def route_for(
    routes: Sequence[Mapping[str, Any]], path: str, headers: Mapping[str, str]
) -> str | None:
    """The backend a Gateway sends a POST to after the router ran, or None (no rule matches:
    the Gateway answers 404)."""
    routed = route(routes, "POST", path, headers)
    return None if routed is None else routed.backend

"""The pinned CRD files, and waiting until a CRD is Established.

The CRD YAML comes from Go modules pinned in e2e/tools/crds (downloaded, verified by
go.sum, never built). `wait_established` is the one CRD wait of the e2e tree (the cluster
script, the demo and the tests): it polls, because `kubectl wait
--for=condition=Established` right after an apply fails at once ("accessor error: <nil>",
or NotFound) while the API server has not yet written the object or any condition, which a
loaded machine makes likely.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .build import go_bin, go_env, gomod_version
from .errors import ClusterError, say
from .paths import E2E

CRD_MODULE_DIR = "tools/crds"
"""Modules that only carry YAML (CRDs); downloaded, never built."""
GATEWAY_API = "sigs.k8s.io/gateway-api"
INFERENCE_EXT = "sigs.k8s.io/gateway-api-inference-extension"
PROMETHEUS_OPERATOR = "github.com/prometheus-operator/prometheus-operator"
"""The Prometheus Operator's CRDs (PodMonitor, PrometheusRule, ServiceMonitor): not
installed by `up` (most clusters lack them, and the operator must say so); `which
monitoring-crds` lists them for the tests that install them."""
MONITORING_CRDS = ("podmonitors", "prometheusrules", "servicemonitors")
MONITORING_CRD_NAMES = tuple(f"{plural}.monitoring.coreos.com" for plural in MONITORING_CRDS)
GATEWAY_CRD_NAMES = (
    "httproutes.gateway.networking.k8s.io",
    "inferencepools.inference.networking.k8s.io",
)
"""The two of the installed CRDs whose readiness `up` waits for (the ones the tests use)."""


def crd_dirs() -> dict[str, Path]:
    """Where the pinned CRD YAML lives: inside the downloaded Go modules (verified by go.sum)."""
    gomod = E2E / CRD_MODULE_DIR / "go.mod"
    out: dict[str, Path] = {}
    for module in (GATEWAY_API, INFERENCE_EXT, PROMETHEUS_OPERATOR):
        version = gomod_version(gomod, module)
        cached = Path(go_env()["GOMODCACHE"]) / f"{module}@{version}"
        if not cached.is_dir():
            say(f"downloading {module}@{version} (CRDs)")
            proc = subprocess.run(
                [go_bin(), "mod", "download", "-json", module],
                cwd=E2E / CRD_MODULE_DIR,
                env=go_env(),
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                raise ClusterError(f"go mod download {module} failed: {proc.stderr or proc.stdout}")
            cached = Path(json.loads(proc.stdout)["Dir"])
        out[module] = cached
    return out


def monitoring_crd_files() -> list[Path]:
    base = crd_dirs()[PROMETHEUS_OPERATOR] / "example" / "prometheus-operator-crd"
    files = [base / f"monitoring.coreos.com_{plural}.yaml" for plural in MONITORING_CRDS]
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise ClusterError(f"Prometheus Operator CRD files not found: {missing}")
    return files


def gateway_crd_files() -> list[Path]:
    dirs = crd_dirs()
    standard = dirs[GATEWAY_API] / "config" / "crd" / "standard"
    files = sorted(p for p in standard.glob("*.yaml") if p.name != "kustomization.yaml")
    pool = (
        dirs[INFERENCE_EXT]
        / "config"
        / "crd"
        / "bases"
        / "inference.networking.k8s.io_inferencepools.yaml"
    )
    if not files or not pool.is_file():
        raise ClusterError(f"CRD files not found under {standard} / {pool}")
    return [*files, pool]


def established(crd: Mapping[str, Any] | None) -> bool:
    """Whether a CRD object (as `kubectl get -o json` returns it) says Established=True."""
    conditions = ((crd or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


CrdGetter = Callable[[str], Mapping[str, Any] | None]
"""Reads one CRD by name: its object, or None when the API server does not show it yet."""


def kubectl_getter(kubectl: Sequence[str]) -> CrdGetter:
    """A `CrdGetter` running `kubectl` (an argv prefix, e.g. [path, "--kubeconfig", cfg])."""

    def get(name: str) -> Mapping[str, Any] | None:
        proc = subprocess.run(
            [*kubectl, "get", "crd", name, "-o", "json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if proc.returncode != 0 or not proc.stdout.strip():
            return None
        obj: Mapping[str, Any] = json.loads(proc.stdout)
        return obj

    return get


def wait_established(
    get: CrdGetter, names: Iterable[str], timeout: float = 60, every: float = 0.25
) -> None:
    """Poll until every CRD in `names` is Established; a CRD not visible yet is waited for,
    not an error. Raises `ClusterError` naming the CRDs still waiting after `timeout`."""
    waiting = list(dict.fromkeys(names))
    deadline = time.monotonic() + timeout
    while True:
        waiting = [n for n in waiting if not established(get(n))]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise ClusterError(
                f"timed out after {timeout:.0f}s waiting for CRD {', '.join(waiting)} "
                "to be Established"
            )
        time.sleep(every)

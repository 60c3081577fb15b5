"""Pytest plugin: a real Kubernetes cluster for tests marked ``@pytest.mark.cluster``.

Why a plugin module (registered from ``tests/conftest.py`` and ``e2e/conftest.py``) rather
than fixtures in one conftest: both test trees need the same *single* session cluster;
fixtures defined in two conftests would be two fixture definitions and start two clusters.

Fixtures:
- ``cluster`` (session): a started cluster (``e2e/cluster up``), or the cluster that
  ``KUBECONFIG`` points at when ``PROMPTCACHE_USE_EXISTING_CLUSTER=1``. Torn down at the end.
- ``cluster_factory`` (session): ``cluster_factory(gateway_crds=False)`` starts another,
  independent local cluster (e.g. without Gateway API CRDs); all are torn down at the end.
- ``namespace`` (function): a fresh namespace in ``cluster`` whose default ServiceAccount
  exists (pods can be created at once); deleted afterwards.

Env: ``PROMPTCACHE_CACHE_DIR`` (binaries and cluster dirs), ``PROMPTCACHE_USE_EXISTING_CLUSTER``,
``PROMPTCACHE_POD_CIDR`` (pod CIDR of an existing cluster whose pod IPs are loopback).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from harness.localcluster.paths import CACHE, CLI
from harness.localcluster.state import State
from harness.localcluster.targets import binary_path
from harness.waiting import wait_until
from promptcache.api.constants import GROUP, PLURAL, VERSION

READ_TIMEOUT_S = 30
"""A read of the in-process client that gets no answer in this long is a failed read."""

CLUSTER_CLI = CLI
BUILD_ON_REQUEST_TIMEOUT_S = 3600  # a cold Prometheus build on a loaded 2-core machine
UP_TIMEOUT_S = 240  # warm `up` takes well under 60 s; a loaded CI machine gets slack


def _cli(*args: str, timeout: float = UP_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """`e2e/cluster` as a child process, for what must outlive or stay apart from this one:
    `up` (its components run in their own sessions, its progress is read for retries),
    `down`, and `build` (minutes, under the shared build lock, with a timeout)."""
    return subprocess.run(
        [sys.executable, str(CLUSTER_CLI), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@functools.cache
def binary(name: str) -> Path:
    """Path of a binary built by ``e2e/cluster build`` (kubectl, helm, epp, kwok, ...)."""
    path = binary_path(name)
    if not path.is_file():
        raise RuntimeError(f"{name} is not built: run `e2e/cluster build` (expected {path})")
    return path


def built_binary(name: str) -> Path:
    """Path of an on-request binary (prometheus, promtool, epp, ...), building its target
    once if it is not in the cache yet (`e2e/cluster build --only NAME`, which takes the
    build lock, so concurrent sessions build it once)."""
    if not binary_path(name).is_file():
        built = _cli("build", "--only", name, timeout=BUILD_ON_REQUEST_TIMEOUT_S)
        if built.returncode != 0:
            raise RuntimeError(f"building {name} failed:\n{built.stderr[-4000:]}")
    return binary(name)


@dataclass
class Cluster:
    """Handle on a running cluster: kubeconfig, kubectl/helm helpers, a Python client."""

    kubeconfig: Path
    pod_cidr: str | None  # loopback CIDR of fake pod IPs; None when pod IPs are not loopback
    mode: str  # "local" (built here), "existing" (KUBECONFIG), "kind"
    dir: Path | None = None
    gateway_crds: bool = True
    nodes: list[str] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """Environment for a subprocess that should talk to this cluster."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    @property
    def loopback_pod_ips(self) -> bool:
        """True when a test may bind a server to a pod's IP (kwok pods in 127/8)."""
        return bool(self.pod_cidr) and str(self.pod_cidr).startswith("127.")

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; raises with stderr on failure when ``check``."""
        proc = subprocess.run(
            [str(binary("kubectl")), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}"
            )
        return proc

    def service_account_kubeconfig(
        self, namespace: str, sa: str, path: Path, *, duration: str = "2h"
    ) -> Path:
        """A kubeconfig (mode 0600) that authenticates as ServiceAccount `namespace/sa` with a
        token from `kubectl create token`, like its pod's mounted token, and nothing else:
        the admin kubeconfig's server and CA, no client certificate."""
        token = self.kubectl("create", "token", sa, "-n", namespace, "--duration", duration)
        admin = yaml.safe_load(self.kubeconfig.read_text())
        context = admin.get("current-context") or admin["contexts"][0]["name"]
        current = next(c for c in admin["contexts"] if c["name"] == context)["context"]
        server = next(c for c in admin["clusters"] if c["name"] == current["cluster"])["cluster"]
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "cluster", "cluster": server}],
            "users": [{"name": sa, "user": {"token": token.stdout.strip()}}],
            "contexts": [
                {
                    "name": "sa",
                    "context": {"cluster": "cluster", "user": sa, "namespace": namespace},
                }
            ],
            "current-context": "sa",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def helm(
        self, *args: str, check: bool = True, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        """Run helm against this cluster with a private helm home (no user config leaks in)."""
        home = Path(self.dir or CACHE) / "helm-home"
        env = {
            **self.env,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        proc = subprocess.run(
            [str(binary("helm")), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=env,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
        return proc

    @cached_property
    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for this cluster (official Python client)."""
        return config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig)
        )

    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.api_client)

    @property
    def apps(self) -> Any:
        return client.AppsV1Api(self.api_client)

    @property
    def custom(self) -> Any:
        return client.CustomObjectsApi(self.api_client)

    def create_namespace(self, prefix: str = "t") -> str:
        """A fresh namespace, returned once its default ServiceAccount exists (pods need it)."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.kubectl("create", "namespace", name)
        self.wait_for(
            lambda: (
                self.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode
                == 0
            ),
            f"default ServiceAccount in {name}",
        )
        return name

    def wait_for(self, cond: Callable[[], Any], what: str, timeout: float = 90) -> Any:
        """Poll ``cond`` until truthy (returns it); fail naming ``what`` and its last value
        (`harness.waiting.wait_until`, the harness's one wait loop)."""
        return wait_until(cond, what, within_s=timeout, interval_s=0.3)

    def get_json(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    # The two reads the pollers make several times a second (the harness's kubelet lists its
    # pods every 0.5 s for a module's whole life; waits read a resource's status), through
    # the in-process client's kept-alive connection instead of a kubectl each time: a Go
    # process with its own TLS handshake and discovery read costs about 0.07 CPU-s and
    # 0.08 s here, 0.4 s on a loaded machine, where the waits and the engines need the CPU.
    # A resource that is not there yet is None, as `operator.get_json` gives it, and the
    # poller asks again; a failed pod list raises with its reason, as `Cluster.get_json` did.

    def pods_json(self, namespace: str, selector: str) -> dict[str, Any]:
        """The pods of `namespace` matching the label `selector`, as `kubectl get pods -l
        -o json` prints them (a PodList). A failed read raises, with the API server's
        reason."""
        resp = self.core.list_namespaced_pod(
            namespace,
            label_selector=selector,
            _preload_content=False,
            _request_timeout=READ_TIMEOUT_S,
        )
        listed: dict[str, Any] = json.loads(resp.data)
        return listed

    def pcd_json(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The PromptCacheDeployment `namespace/name` as `kubectl get pcd -o json` prints
        it; None when it does not exist or the read failed."""
        try:
            found: dict[str, Any] = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=READ_TIMEOUT_S
            )
        except Exception:  # not found, an HTTP error or a lost connection, as a kubectl's exit 1
            return None
        return found


def failure_summary(stderr: str, *, line_chars: int = 600, tail_chars: int = 3000) -> str:
    """What a failed `e2e/cluster up` said, readable: its progress lines and the error line
    (each cut to `line_chars`), then the end of its output. The error quotes a component's
    last log lines, and kwok's are long JSON records: a plain tail of the output showed
    only those, never what failed."""
    lines = stderr.splitlines()
    said = [line[:line_chars] for line in lines if line.startswith("[cluster ")]
    return "\n".join([*said[-12:], "--- the end of its output:", stderr[-tail_chars:]])


def start_local_cluster(
    gateway_crds: bool = True,
    name: str | None = None,
    *,
    nodes: int | None = None,
    pods_per_node: int | None = None,
    cpus_per_node: int | None = None,
) -> Cluster:
    """Start a fresh local cluster in its own dir; the caller must ``stop_cluster`` it.
    `nodes`, `pods_per_node`, `cpus_per_node` size the fake nodes (`e2e/cluster up`'s
    defaults if None)."""
    name = name or f"pytest-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    d = CACHE / "clusters" / name
    args = ["up", "--dir", str(d), "--no-build", "--watch-pid", str(os.getpid())]
    if nodes is not None:
        args += ["--nodes", str(nodes)]
    if pods_per_node is not None:
        args += ["--pods-per-node", str(pods_per_node)]
    if cpus_per_node is not None:
        args += ["--cpus-per-node", str(cpus_per_node)]
    if not gateway_crds:
        args.append("--no-gateway-crds")
    proc = _cli(*args)
    if proc.returncode != 0:
        _cli("down", "--dir", str(d), timeout=60)
        raise RuntimeError(f"e2e/cluster up failed:\n{failure_summary(proc.stderr)}")
    if "retrying" in proc.stderr:
        # Visible in pytest's warnings summary: a flaky start should not pass unnoticed.
        warnings.warn(
            f"e2e/cluster up needed a retry:\n{failure_summary(proc.stderr)}", stacklevel=2
        )
    state = State.load(d)
    if state is None:
        raise RuntimeError(f"e2e/cluster up left no state in {d}:\n{proc.stderr[-4000:]}")
    return Cluster(
        kubeconfig=state.kubeconfig,
        pod_cidr=state.pod_cidr or None,
        mode=state.mode,
        dir=d,
        gateway_crds=state.gateway_crds,
        nodes=list(state.nodes),
    )


def stop_cluster(c: Cluster) -> None:
    if c.mode != "existing" and c.dir is not None:
        _cli("down", "--dir", str(c.dir), timeout=120)


def existing_cluster() -> Cluster | None:
    """The cluster KUBECONFIG points at, when the user asked for it explicitly."""
    if os.environ.get("PROMPTCACHE_USE_EXISTING_CLUSTER") != "1":
        return None
    kubeconfig = os.environ.get("KUBECONFIG")
    if not kubeconfig:
        raise RuntimeError("PROMPTCACHE_USE_EXISTING_CLUSTER=1 needs KUBECONFIG set")
    return Cluster(
        kubeconfig=Path(kubeconfig.split(os.pathsep)[0]),
        pod_cidr=os.environ.get("PROMPTCACHE_POD_CIDR") or None,
        mode="existing",
        gateway_crds=True,
    )


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The session's cluster: started once, shared by every ``cluster``-marked test."""
    existing = existing_cluster()
    if existing is not None:
        yield existing
        return
    c = start_local_cluster(gateway_crds=True)
    try:
        yield c
    finally:
        stop_cluster(c)


@pytest.fixture(scope="session")
def cluster_factory() -> Iterator[Callable[..., Cluster]]:
    """Start extra local clusters on demand, e.g. ``cluster_factory(gateway_crds=False)``."""
    started: list[Cluster] = []

    def make(gateway_crds: bool = True) -> Cluster:
        if existing_cluster() is not None:
            pytest.skip("extra clusters need the local control plane, not an existing cluster")
        c = start_local_cluster(gateway_crds=gateway_crds)
        started.append(c)
        return c

    try:
        yield make
    finally:
        for c in started:
            stop_cluster(c)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace in the session cluster, deleted (without waiting) afterwards."""
    name = cluster.create_namespace()
    try:
        yield name
    finally:
        # One API call, not a kubectl process (a second or two each on a busy machine, in
        # every cluster test's teardown); the server deletes the contents in the background.
        with contextlib.suppress(client.ApiException):
            cluster.core.delete_namespace(name)

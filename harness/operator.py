"""Running `promptcache run` as a subprocess against a test cluster, and measuring it.

The one place for the e2e process helpers: `OperatorProcess` (the operator as a real
process, started from flags or exactly as the chart's container would run it), `wait_for`
(one argument order: condition, what, timeout), and the child kinds the operator makes
(read from the renderer, so a new child kind is covered everywhere). Shared by the
`test_operator_*.py` and `test_install_*.py` modules and `bench/operator_scale.py`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from harness.localcluster.crds import wait_established as crd_wait
from harness.net import answers_ok, free_port
from harness.waiting import wait_until
from promptcache.api.constants import API_VERSION, CRD_NAME, GROUP, KIND, PLURAL
from promptcache.controller.rbac import leader_election_role, load_rules, picker_cluster_role

ROOT = Path(__file__).resolve().parents[1]
CRD_FILE = ROOT / "crds" / f"{GROUP}_{PLURAL}.yaml"
RULES_FILE = ROOT / "charts" / "promptcache-operator" / "files" / "clusterrole-rules.yaml"
WRITE_VERBS = ("POST", "PUT", "PATCH", "APPLY")


def _rendered_child_kinds() -> tuple[str, ...]:
    """The plurals of what the operator renders for a resource with no route."""
    from promptcache.api import parse_resource  # noqa: PLC0415 - keep the harness import light
    from promptcache.controller.kube import by_kind  # noqa: PLC0415
    from promptcache.render import render  # noqa: PLC0415

    sample = parse_resource(resource("sample", "ns"))
    return tuple(dict.fromkeys(by_kind(m["kind"]).plural for m in render(sample)))


CHILD_KINDS: tuple[str, ...] = ()
"""What every resource gets (plurals), from the renderer; filled below `resource`."""
CHILD_RESOURCES: tuple[str, ...] = ()
"""Everything the operator writes: the resource, its children, the HTTPRoute a route adds
and the salt Secret the controller generates."""


def wait_for(
    cond: Callable[[], Any],
    what: str,
    timeout: float = 120,
    every: float = 0.5,
    *,
    operator: OperatorProcess | None = None,
    until: Callable[[Any], object] = bool,
    fail_if: Callable[[], str | None] | None = None,
) -> Any:
    """Poll until `until(cond())` holds (returns the state); fail naming `what` and `cond`'s
    last value, at once if `operator` exits meanwhile or `fail_if()` gives a reason, and
    with the operator's log tail. `harness.waiting.wait_until` under the argument order the
    e2e modules use (condition, what, timeout)."""
    if operator is None:
        return wait_until(
            cond, what, within_s=timeout, interval_s=every, until=until, fail_if=fail_if
        )
    op = operator

    def stop() -> str | None:
        if op.exited():
            return f"the operator exited {op.returncode()}"
        return None if fail_if is None else fail_if()

    return wait_until(
        cond,
        what,
        within_s=timeout,
        interval_s=every,
        until=until,
        fail_if=stop,
        detail=lambda: f"the operator's log tail:\n{op.log_tail()}",
    )


def ladder_section(described: str) -> str:
    """The `Cache:` section of `kubectl describe pcd` (the hit-ratio ladder, issue 39), or
    "" when the status has none."""
    lines = described.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == "Cache:":
            indent = len(line) - len(line.lstrip())
            end = next(
                (
                    j
                    for j in range(i + 1, len(lines))
                    if lines[j].strip() and len(lines[j]) - len(lines[j].lstrip()) <= indent
                ),
                len(lines),
            )
            return "\n".join(lines[i:end])
    return ""


def wait_established(kubectl: Callable[..., Any], *crds: str, timeout: float = 60) -> None:
    """Poll until every CRD named is Established (`harness.localcluster.crds`'s
    `wait_established`, the one CRD wait of the e2e tree): `kubectl wait
    --for=condition=Established` right after the apply fails at once while the API server
    has not yet shown the object or written any condition, which a loaded machine makes
    likely."""
    crd_wait(lambda name: get_json(kubectl, "crd", name), crds, timeout=timeout)


def install_crd(kubectl: Callable[..., Any]) -> None:
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    wait_established(kubectl, CRD_NAME)


def resource(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    """A PromptCacheDeployment with a tiny model and the given spec overrides."""
    # No GPUs unless asked: the fake nodes' 16 GPUs are shared by every test in the session.
    model = {
        "name": "Qwen/Qwen2.5-0.5B-Instruct",
        "replicas": 1,
        "resources": {"gpus": 0},
        **spec.pop("model", {}),
    }
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"model": model, **spec},
    }


CHILD_KINDS = _rendered_child_kinds()
CHILD_RESOURCES = ("promptcachedeployments", *CHILD_KINDS, "httproutes", "secrets")


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


def parse_prometheus(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The exposition text as {(sample name, labels): value}, by prometheus-client's parser
    (counters' samples keep their `_total` name)."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric_sum(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float],
    name: str,
    **match: str | Iterable[str],
) -> float:
    total = 0.0
    for (sample, labels), value in samples.items():
        if sample != name:
            continue
        d = dict(labels)
        ok = True
        for key, want in match.items():
            allowed = {want} if isinstance(want, str) else set(want)
            if d.get(key, "") not in allowed:
                ok = False
                break
        if ok:
            total += value
    return total


def apiserver_writes(
    kubectl: Callable[..., Any], resources: Iterable[str] = CHILD_RESOURCES
) -> float:
    """Writes the API server served to these resources, plus PromptCacheDeployment status.

    Status subresources of children are left out: controllers (the Deployment and disruption
    controllers) write those, not the operator. `apiserver_request_total` counts every
    client; the operator's own client counts separately (`promptcache_api_requests_total`).
    """
    samples = parse_prometheus(kubectl("get", "--raw", "/metrics").stdout)
    main = metric_sum(
        samples, "apiserver_request_total", verb=WRITE_VERBS, resource=tuple(resources),
        subresource="",
    )  # fmt: skip
    status = metric_sum(
        samples, "apiserver_request_total", verb=WRITE_VERBS,
        resource="promptcachedeployments", subresource="status",
    )  # fmt: skip
    return main + status


def _die_with_parent(argv: list[str]) -> list[str]:
    """`argv` run so that it gets SIGTERM when the test process dies (no operator outlives
    its test), through util-linux's `setpriv --pdeathsig` rather than a `preexec_fn`.

    A `preexec_fn` forces a plain fork() of the multi-threaded pytest process and runs
    Python in the child: grpc (imported by the gateway policy step's tests) then runs its fork
    handlers there, and under load its poller aborted the child with "epoll_wait error:
    Bad file descriptor" (SIGABRT, exit -6) before the operator was even exec'd. Without
    a preexec_fn, subprocess uses vfork/exec, which runs no fork handlers."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--", *argv] if setpriv else argv


@dataclass
class OperatorProcess:
    """One `promptcache run` subprocess with its health/metrics ports and log file.

    From flags (`args`), or exactly as a container runs it (`command`, `env`, `container`:
    see `from_container`), then its probes are the container's."""

    kubeconfig: Path
    log_path: Path
    args: list[str] = field(default_factory=list)
    health_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    command: list[str] | None = None
    """The whole argv; None: `python -m promptcache.cli run` with the ports and `args`."""
    env: dict[str, str] | None = None
    """The whole environment (KUBECONFIG is set from `kubeconfig`); None: this one's."""
    container: dict[str, Any] | None = None
    """The container spec this process stands for (its probes); None: plain flags."""
    cwd: Path | None = None

    @classmethod
    def from_container(
        cls,
        container: dict[str, Any],
        *,
        kubeconfig: Path,
        log_path: Path,
        env: dict[str, str],
        health_port: int,
        metrics_port: int,
        extra_args: list[str],
        cwd: Path,
    ) -> OperatorProcess:
        """The operator as the container runs it: its command (the `promptcache` console
        script, here the venv's) and args, with `env` already resolved."""
        (command, *rest) = container["command"]
        executable = Path(sys.executable).parent / command
        assert executable.is_file(), f"{executable} is not installed"
        argv = [str(executable), *rest, *container["args"], *extra_args]
        return cls(kubeconfig=kubeconfig, log_path=log_path, health_port=health_port,
                   metrics_port=metrics_port, command=argv, env=env, container=container,
                   cwd=cwd)  # fmt: skip

    def start(self, *, wait_healthy: bool = True) -> OperatorProcess:
        env = dict(os.environ if self.env is None else self.env)
        env.update(KUBECONFIG=str(self.kubeconfig), PYTHONUNBUFFERED="1")
        if self.env is None:
            env.pop("POD_NAME", None)
        argv = self.command or [
            sys.executable, "-m", "promptcache.cli", "run",
            "--bind-address", "127.0.0.1",
            "--health-port", str(self.health_port),
            "--metrics-port", str(self.metrics_port),
            *self.args,
        ]  # fmt: skip
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            _die_with_parent(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.cwd,
        )
        log.close()
        if wait_healthy:
            wait_for(self._healthy, f"operator health endpoint ({self.log_tail()})", timeout=60)
        return self

    def _healthy(self) -> bool:
        if self.exited():
            raise AssertionError(f"operator exited {self.returncode()}:\n{self.log_tail()}")
        return answers_ok(f"http://127.0.0.1:{self.health_port}/healthz")

    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def port(self, name: str) -> int:
        """The port a container port name stands for, on this host."""
        return {"health": self.health_port, "metrics": self.metrics_port}[name]

    def probe(self, kind: str) -> tuple[int, str]:
        """GET the container's probe (path and named port as the kubelet would), on loopback."""
        assert self.container is not None, "probe() needs the container this process runs"
        http = self.container[kind]["httpGet"]
        url = f"http://127.0.0.1:{self.port(http['port'])}{http['path']}"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as error:
            return int(error.code), ""
        except OSError:
            return 0, ""

    def readyz(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=5) as r:
            return str(r.read().decode().strip())

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as r:
            return parse_prometheus(r.read().decode())

    def counter(self, name: str, **match: str | Iterable[str]) -> float:
        return metric_sum(self.metrics(), name, **match)

    def writes(self) -> float:
        return self.counter(
            "promptcache_api_requests_total", verb=("POST", "PUT", "PATCH", "DELETE")
        )

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


def get_json(kubectl: Callable[..., Any], *args: str) -> Any:
    proc = kubectl("get", *args, "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout)


def apply_yaml(kubectl: Callable[..., Any], *docs: dict[str, Any]) -> None:
    kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))


@contextlib.contextmanager
def namespaced_operator(
    cluster: Any, label: str, log_dir: Path, extra_args: Sequence[str] = ()
) -> Iterator[dict[str, Any]]:
    """The CRD installed, a fresh namespace `label-…` and an operator watching only it
    (no leader election, 2 s resyncs, then `extra_args`); the operator stopped and the
    namespace deleted after. `cluster` is harness/pytest_cluster.Cluster. Yields
    `{"ns": ..., "op": ...}`."""
    install_crd(cluster.kubectl)
    ns = cluster.create_namespace(label)
    op = OperatorProcess(
        kubeconfig=cluster.kubeconfig,
        log_path=log_dir / "operator.log",
        args=["-n", ns, "--no-leader-election", "--resync-seconds", "2", *extra_args],
    ).start()
    try:
        yield {"ns": ns, "op": op}
    finally:
        op.stop()
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def operator_rules(name: str) -> list[dict[str, Any]]:
    """The rules file as the chart gives it: `bind` on this operator's picker role."""
    return load_rules(RULES_FILE, picker_role=f"{name}-endpoint-picker")


def bind_operator_rules(cluster: Any, name: str, ns: str, rules: list[dict[str, Any]]) -> None:
    """ServiceAccount `ns/name` bound to `rules` cluster-wide, its leader-election Role in
    `ns` and the picker ClusterRole it binds per namespace, as the chart makes them."""
    leader = leader_election_role(name)
    leader["metadata"]["namespace"] = ns
    apply_yaml(
        cluster.kubectl,
        picker_cluster_role(name),
        leader,
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": leader["metadata"]["name"], "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": leader["metadata"]["name"]},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]},
    )  # fmt: skip
    apply_yaml(
        cluster.kubectl,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": name}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]},
    )  # fmt: skip


def run_as_service_account(
    cluster: Any,
    ns: str,
    name: str,
    rules: list[dict[str, Any]],
    tmp: Path,
    extra_args: tuple[str, ...] = (),
) -> OperatorProcess:
    """The operator as ServiceAccount `ns/name` bound to `rules` (a token in a kubeconfig of
    its own), watching `ns`; `cluster` is harness/pytest_cluster.Cluster."""
    bind_operator_rules(cluster, name, ns, rules)
    kubeconfig = cluster.service_account_kubeconfig(ns, name, tmp / f"{name}.kubeconfig")
    return OperatorProcess(
        kubeconfig=kubeconfig, log_path=tmp / f"{name}.log",
        args=["-n", ns, "--lease-namespace", ns, "--resync-seconds", "2",
              "--endpoint-picker-cluster-role", f"{name}-endpoint-picker", *extra_args],
    ).start()  # fmt: skip

"""A rendered pool on the local control plane, with the real Endpoint Picker in front.

Applies what `promptcache render` produced (InferencePool, EPP RBAC and
ConfigMap, model-server Deployment) to a namespace of the real API server. kwok
plays the kubelets: it makes the model-server pods Running/Ready with loopback
pod IPs, and the harness binds one stand-in pod server per pod on
`podIP:targetPort`. The EPP Deployment cannot run under kwok, so the harness
runs the real EPP process with the rendered config and args, authenticated as
the rendered ServiceAccount: if the rendered Role lacked a verb the EPP needs,
the EPP would fail here.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness.waiting import wait_until
from promptcache.contract import VLLM_LOCAL_PORT, Container, GatewayPolicyEnv

from .binary import find_epp_binary, missing_reason
from .extproc import ExtProcClient
from .fake_pod import FakePod, VllmMetrics
from .front import FrontProcess
from .process import EppProcess
from .rendered import Rendered
from .shim import GatewayPolicyProcess


class ClusterLike(Protocol):
    """The slice of harness/pytest_cluster.Cluster the harness uses."""

    kubeconfig: Path

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> Any: ...

    def get_json(self, *args: str) -> Any: ...

    def pods_json(self, namespace: str, selector: str) -> dict[str, Any]: ...

    def service_account_kubeconfig(
        self, namespace: str, sa: str, path: Path, *, duration: str = "2h"
    ) -> Path: ...


@dataclass
class PodHandle:
    """One model-server pod: its API object's name/IP and what stands in for it."""

    name: str
    ip: str
    server: FakePod
    """The vLLM stand-in (metrics and /v1); behind the front when there is one."""
    front: FrontProcess | None = None

    @property
    def endpoint(self) -> str:
        """What the EPP writes into x-gateway-destination-endpoint for this pod."""
        return f"{self.ip}:{self.port}"

    @property
    def port(self) -> int:
        return self.front.port if self.front is not None else self.server.port

    def set(self, **values: Any) -> None:
        self.server.set(**values)


@dataclass
class PoolOnCluster:
    """Rendered objects applied to one namespace, stand-in pods, and the real EPP."""

    cluster: ClusterLike
    rendered: Rendered
    workdir: Path
    metrics: Callable[[int], VllmMetrics] = lambda i: VllmMetrics()
    pods: list[PodHandle] = field(default_factory=list)
    epp: EppProcess | None = None
    shim: GatewayPolicyProcess | None = None
    _starts: int = 0

    @property
    def salt_key_file(self) -> Path:
        """The pool's salt Secret, as a file: every front and the policy step read it (the
        operator creates one Secret per resource and mounts it in both pods)."""
        path = self.workdir / "salt-key"
        if not path.exists():
            self.workdir.mkdir(parents=True, exist_ok=True)
            path.write_text(secrets.token_hex(32))
            path.chmod(0o600)
        return path

    @property
    def salt_key(self) -> bytes:
        return self.salt_key_file.read_bytes().strip()

    def client(self) -> ExtProcClient:
        """What the gateway dials: the policy step when the pod renders one, else the
        picker itself (over TLS when it serves TLS, as rendered)."""
        if self.shim is not None:
            return self.shim.client()
        assert self.epp is not None, "start the EPP first"
        return self.epp.client()

    # --- objects ------------------------------------------------------------------
    def applicable_objects(self) -> list[dict[str, Any]]:
        """Everything but what cannot run here: the EPP Deployment (run as a process
        instead), the HTTPRoute (no gateway controller on the local cluster) and PodMonitors
        (no Prometheus Operator; the dashboard test scrapes with their labels itself).
        The model-server pods keep their GPU requests; a nodeSelector naming a GPU
        product is dropped because the fake nodes carry no product label."""
        skip = {id(self.rendered.epp_deployment)}
        out: list[dict[str, Any]] = []
        for obj in self.rendered.objects:
            if id(obj) in skip or obj.get("kind") in ("HTTPRoute", "PodMonitor"):
                continue
            if obj is self.rendered.model_deployment:
                copy = json.loads(json.dumps(obj))
                copy["spec"]["template"]["spec"].pop("nodeSelector", None)
                out.append(copy)
            else:
                out.append(obj)
        return out

    def apply(self) -> None:
        ns = self.rendered.namespace
        self.cluster.kubectl("get", "namespace", ns)
        # Secrets the pods mount must exist for kwok to report the pod Running? kwok
        # does not mount volumes, so none are created here. A PriorityClass the pod template
        # names must exist, or admission refuses the pods (a platform team has its own).
        priority = self.rendered.model_deployment["spec"]["template"]["spec"].get(
            "priorityClassName"
        )
        if priority:
            self.cluster.kubectl("create", "priorityclass", priority, "--value=1000", check=False)
        doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": self.applicable_objects()})
        self.cluster.kubectl("apply", "-n", ns, "-f", "-", input=doc)

    def live_pods(self, *, ready: bool = True) -> list[dict[str, Any]]:
        """The pool's model-server pods that kwok gave an IP and nobody is deleting, by
        name; with `ready`, only those whose Ready condition is True."""
        live = []
        for p in self.cluster.pods_json(self.rendered.namespace, self.rendered.label_selector)[
            "items"
        ]:
            if p["metadata"].get("deletionTimestamp") or not p["status"].get("podIP"):
                continue
            conds = {c["type"]: c["status"] for c in p["status"].get("conditions", [])}
            if not ready or conds.get("Ready") == "True":
                live.append(p)
        return sorted(live, key=lambda p: p["metadata"]["name"])

    def ready_pods(self) -> list[dict[str, Any]]:
        return self.live_pods(ready=True)

    def wait_pods(self, timeout_s: float = 120, *, ready: bool = True) -> list[dict[str, Any]]:
        """Until the Deployment's replicas are all live (and with `ready`, Ready)."""
        want = self.rendered.replicas
        return wait_until(
            lambda: self.live_pods(ready=ready),
            f"{want} model-server pods {'Ready' if ready else 'with an IP'}",
            within_s=timeout_s,
            interval_s=0.3,
            until=lambda pods: len(pods) == want,
        )

    # --- stand-ins ------------------------------------------------------------------
    def start_pods(self, with_front: bool = False) -> list[PodHandle]:
        """Bind a stand-in on each pod IP; with the front, the front owns the target port
        and the stand-in sits on the vLLM port behind it (the rendered pod's shape)."""
        port = self.rendered.target_port
        for i, pod in enumerate(self.wait_pods()):
            name, ip = pod["metadata"]["name"], pod["status"]["podIP"]
            if with_front:
                server = FakePod(name, ip, VLLM_LOCAL_PORT, self.metrics(i)).start()
                front = FrontProcess(
                    listen=(ip, port),
                    upstream=f"http://{ip}:{VLLM_LOCAL_PORT}",
                    env=self.front_env(),
                    workdir=self.workdir / f"front-{name}",
                    salt_key_file=self.salt_key_file,
                ).start()
                self.pods.append(PodHandle(name, ip, server, front))
            else:
                server = FakePod(name, ip, port, self.metrics(i)).start()
                self.pods.append(PodHandle(name, ip, server))
        for handle in self.pods:
            if handle.front is not None:
                handle.front.wait_ready()
        return self.pods

    def front_env(self) -> dict[str, str]:
        """The environment the renderer gives the cache-front container."""
        spec = self.rendered.model_deployment["spec"]["template"]["spec"]
        for c in spec["containers"]:
            if c["name"] != Container.VLLM:
                return {e["name"]: str(e["value"]) for e in c.get("env", []) if "value" in e}
        return {}

    def by_endpoint(self, endpoint: str | None) -> PodHandle | None:
        for p in self.pods:
            if p.endpoint == endpoint:
                return p
        return None

    # --- the Endpoint Picker ----------------------------------------------------------
    def service_account_kubeconfig(self) -> Path:
        """A kubeconfig that authenticates as the rendered EPP ServiceAccount."""
        return self.cluster.service_account_kubeconfig(
            self.rendered.namespace,
            self.rendered.service_account,
            self.workdir / "epp-kubeconfig.yaml",
        )

    def start_epp(
        self,
        config_text: str | None = None,
        extra_args: Sequence[str] = (),
        wait_scraped: bool = True,
        rendered_args: Sequence[str] | None = None,
        ready_timeout_s: float = 90.0,
        with_policy_step: bool = True,
    ) -> EppProcess:
        """Run the EPP with the rendered config and args (or the given replacements), and
        the rendered policy step in front of it when the pod has one: the whole pod."""
        binary = find_epp_binary(self.rendered.picker)
        if binary is None:
            raise RuntimeError(missing_reason(self.rendered.picker))
        if self.epp is not None:
            self.epp.stop()  # a restart: a fresh process with an empty prefix index
        self._starts += 1
        run_dir = self.workdir / f"epp-{self._starts}"
        run_dir.mkdir(parents=True, exist_ok=True)
        self.epp = EppProcess(
            binary,
            (
                config_text
                if config_text is not None
                else self.rendered.epp_config_text_with_salt_key(self.salt_key_file)
            ),
            run_dir,
            pool_name=self.rendered.pool_name,
            pool_namespace=self.rendered.namespace,
            extra_args=[
                *(self.rendered.epp_args if rendered_args is None else rendered_args),
                *extra_args,
            ],
            kubeconfig=self.service_account_kubeconfig(),
        ).start()
        self.epp.wait_ready(ready_timeout_s)
        if with_policy_step and self.rendered.policy_step_container is not None:
            self.start_gateway_policy()
        if wait_scraped:
            self.wait_scraped()
        return self.epp

    def start_gateway_policy(self) -> GatewayPolicyProcess:
        """Run the rendered `gateway-policy` container in front of the running EPP.

        The rendered wiring is checked, then kept: the shim must relay to
        `127.0.0.1:<the EPP's rendered --grpc-port>` and listen on its `grpc` port; here
        both ports become the free loopback ports the harness really uses."""
        container = self.rendered.gateway_policy_container
        if container is None:
            raise LookupError("the rendered EPP pod has no gateway-policy container")
        assert self.epp is not None, "start the EPP first"
        env = {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}
        upstream = f"127.0.0.1:{self.rendered.epp_grpc_port}"
        relays_to = env.get(GatewayPolicyEnv.UPSTREAM)
        if relays_to != upstream:
            raise AssertionError(f"the shim relays to {relays_to!r}, the EPP serves {upstream}")
        (grpc_port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "grpc"]
        if not env.get(GatewayPolicyEnv.LISTEN, "").endswith(f":{grpc_port}"):
            raise AssertionError(f"the step listens on {env.get(GatewayPolicyEnv.LISTEN)!r}")
        if self.shim is not None:
            self.shim.stop()
        self.shim = GatewayPolicyProcess(
            container["args"],
            env,
            self.epp.ports.grpc,
            self.workdir / "gateway-policy",
            salt_key_file=self.salt_key_file,
        ).start()
        self.shim.wait_ready()
        return self.shim

    def wait_scraped(self, timeout_s: float = 60) -> None:
        """Until the EPP's metrics show every pod with the queue its stand-in reports."""
        assert self.epp is not None
        expected = {p.name: float(p.server.snapshot().waiting or 0) for p in self.pods}
        self.epp.wait_scraped(expected, timeout_s)

    def stop_picker(self) -> None:
        """Stop the policy step and the picker (the pods keep running), so that the next
        router starts fresh."""
        if self.shim is not None:
            self.shim.stop()
            self.shim = None
        if self.epp is not None:
            self.epp.stop()
            self.epp = None

    def close(self) -> None:
        """The router first (nothing picks a stopping pod), then every front at once."""
        self.stop_picker()
        fronts = [p.front for p in self.pods if p.front is not None]
        for front in fronts:
            front.terminate()
        for front in fronts:
            front.stop()
        for p in self.pods:
            p.server.stop()

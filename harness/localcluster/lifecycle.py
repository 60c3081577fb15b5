"""`up` and `down`: the control plane composed from the parts (binaries, PKI, kubeconfig,
supervised processes, fake nodes, CRDs).

Started as plain processes bound to loopback: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, and kwok, which plays the kubelets of fake GPU
nodes and gives pods loopback IPs (so tests can bind small HTTP servers to a pod's IP).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import crds
from .build import go_bin, go_env
from .errors import ClusterError, ComponentExitedError, say
from .kubeconfig import write_kubeconfig
from .paths import CLI, E2E
from .pki import admin_ssl, make_pki
from .ports import free_ports
from .state import State, pick_pod_cidr
from .supervise import Supervisor, http_ok, insecure_ssl
from .targets import binary_path, ensure_binaries, find_target

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
PROCESS_POD_ANNOTATION = "kubelet.harness.promptcache.io/processes"
"""A pod carrying this annotation ("true") really runs, as processes (harness/pod.py): kwok
only makes it Running with a pod IP, and the harness's probes decide when it is Ready."""
_SELECT_PROCESS_PODS = (
    "    - key: '.metadata.annotations[\"" + PROCESS_POD_ANNOTATION + "\"]'\n"
    "      operator: '{op}'\n"
)
"""Node annotation kwok selects on: only our fake nodes are driven by this cluster's kwok."""
SERVICE_CIDR = "10.0.0.0/16"
"""Allocation only: nothing routes service IPs here; room for 200+ resources x 2 Services."""


@dataclass(frozen=True)
class UpOptions:
    """What `e2e/cluster up` was asked for."""

    name: str
    dir: str | None = None
    nodes: int = 2
    gpus: int = 8
    pods_per_node: int = 110
    """The kubelet's default; a node's /24 podCIDR holds at most 254."""
    cpus_per_node: int = 64
    pod_cidr: str | None = None
    gateway_crds: bool = True
    allow_build: bool = True
    kind: bool = False
    keep_on_failure: bool = False
    watch_pid: int | None = None


def kubectl(state: State, *args: str, input_: str | None = None, check: bool = True) -> str:
    cmd = [str(binary_path("kubectl")), "--kubeconfig", str(state.kubeconfig), *args]
    proc = subprocess.run(
        cmd, input=input_, capture_output=True, text=True, timeout=120, check=False
    )
    if check and proc.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def kwok_config(state: State) -> Path:
    """kwok needs Stage objects; the 'fast' set (node ready + lease heartbeat, pods
    Running at once) ships inside the kwok module, pinned with it."""
    kwok_dir = Path(go_env()["GOMODCACHE"]) / f"sigs.k8s.io/kwok@{find_target('kwok').version()}"
    stage_root = kwok_dir / "kustomize" / "stage"
    files = [
        stage_root / "node" / "fast" / "node-initialize.yaml",
        stage_root / "node" / "heartbeat-with-lease" / "node-heartbeat-with-lease.yaml",
        stage_root / "pod" / "fast" / "pod-ready.yaml",
        stage_root / "pod" / "fast" / "pod-complete.yaml",
        stage_root / "pod" / "fast" / "pod-delete.yaml",
    ]
    if not all(f.is_file() for f in files):
        # The module cache may have been pruned; re-download the module (cheap).
        subprocess.run(
            [go_bin(), "mod", "download", "sigs.k8s.io/kwok"],
            cwd=E2E / "tools" / "kwok",
            env=go_env(),
            check=True,
        )
    texts = [f.read_text() for f in files]
    ready = next(i for i, f in enumerate(files) if f.name == "pod-ready.yaml")
    texts[ready : ready + 1] = process_pod_stages(texts[ready])
    path = Path(state.dir) / "kwok.yaml"
    path.write_text("\n---\n".join(texts))
    return path


def process_pod_stages(pod_ready: str) -> list[str]:
    """kwok's pod-ready stage, split in two: pods without the process annotation become
    Ready at once as before; annotated pods become Running with an IP but not Ready."""
    anchor = "    matchExpressions:\n"
    if pod_ready.count(anchor) != 1 or pod_ready.count('status: "True"') < 3:
        raise ClusterError("kwok's pod-ready stage changed shape: revisit process_pod_stages")
    plain = pod_ready.replace(anchor, anchor + _SELECT_PROCESS_PODS.format(op="DoesNotExist"))
    processes = (
        pod_ready.replace("name: pod-ready", "name: pod-running-as-processes", 1)
        .replace(anchor, anchor + _SELECT_PROCESS_PODS.format(op="Exists"))
        .replace('status: "True"\n        type: Ready', 'status: "False"\n        type: Ready')
        .replace(
            'status: "True"\n        type: ContainersReady',
            'status: "False"\n        type: ContainersReady',
        )
        .replace("ready: true", "ready: false")
    )
    if "type: Ready\n" not in processes or processes.count('status: "False"') != 2:
        raise ClusterError("kwok's pod-ready stage changed shape: revisit process_pod_stages")
    return [plain, processes]


def node_manifest(state: State, nodes: int, gpus: int, pods: int = 110, cpus: int = 64) -> str:
    net = ipaddress.ip_network(state.pod_cidr)
    subnets = net.subnets(new_prefix=24)
    next(subnets)  # keep x.y.0.0/24 unused: .0 addresses read as "network" to people
    items = []
    for i in range(nodes):
        name = f"kwok-gpu-{i}"
        state.nodes.append(name)
        resources = {"cpu": str(cpus), "memory": f"{8 * cpus}Gi", "pods": str(pods),
                     "nvidia.com/gpu": str(gpus)}  # fmt: skip
        items.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "type": "kwok",
                        "nvidia.com/gpu.present": "true",
                        "nvidia.com/gpu.count": str(gpus),
                    },
                },
                "spec": {"podCIDR": str(next(subnets))},
                "status": {"allocatable": dict(resources), "capacity": dict(resources)},
            }
        )
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


def up_local(opts: UpOptions, d: Path) -> State:
    t0 = time.monotonic()
    ensure_binaries(allow_build=opts.allow_build)
    if opts.gateway_crds:
        crds.gateway_crd_files()  # fail before starting anything if the CRDs cannot be had
    for sub in ("pki", "logs", "etcd", "certs"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    ports = free_ports(["etcd", "etcd-peer", "apiserver", "kcm", "scheduler", "kwok"])
    state = State(
        name=opts.name if not opts.dir else d.name,
        dir=str(d),
        pod_cidr=opts.pod_cidr or pick_pod_cidr(),
        ports=ports,
        gateway_crds=opts.gateway_crds,
    )
    state.save()
    procs = Supervisor(d, state.pids, on_change=state.save)
    say(f"cluster {state.name} in {d}; pod CIDR {state.pod_cidr}")
    pki = d / "pki"
    make_pki(pki)

    etcd_url = f"http://127.0.0.1:{ports['etcd']}"
    peer_url = f"http://127.0.0.1:{ports['etcd-peer']}"
    procs.start("etcd", [
        str(binary_path("etcd")), "--name", "default", "--data-dir", str(d / "etcd"),
        "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
        "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"default={peer_url}", "--unsafe-no-fsync",
        "--log-level", "warn", "--quota-backend-bytes", str(2 * 1024**3),
    ])  # fmt: skip
    procs.wait_until("etcd /health", lambda: http_ok(f"{etcd_url}/health"), 30, "etcd")

    api_port = ports["apiserver"]
    procs.start("kube-apiserver", [
        str(binary_path("kube-apiserver")),
        "--etcd-servers", etcd_url,
        "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
        "--secure-port", str(api_port),
        "--tls-cert-file", str(pki / "apiserver.crt"),
        "--tls-private-key-file", str(pki / "apiserver.key"),
        "--client-ca-file", str(pki / "ca.crt"),
        "--authorization-mode", "Node,RBAC",
        "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
        "--service-account-key-file", str(pki / "sa.pub"),
        "--service-account-signing-key-file", str(pki / "sa.key"),
        "--service-cluster-ip-range", SERVICE_CIDR,
        # The default `kubernetes` endpoints would point at 127.0.0.1, which Endpoints
        # validation rejects; nothing in-cluster dials the API server here anyway.
        "--endpoint-reconciler-type", "none",
        "--allow-privileged=true",
        "--profiling=false",
        "--cert-dir", str(d / "certs"),
        # The aggregation layer, so an APIService (custom metrics for the HPA) can be served.
        "--requestheader-client-ca-file", str(pki / "ca.crt"),
        "--requestheader-allowed-names", "front-proxy-client",
        "--requestheader-username-headers", "X-Remote-User",
        "--requestheader-group-headers", "X-Remote-Group",
        "--requestheader-extra-headers-prefix", "X-Remote-Extra-",
        "--proxy-client-cert-file", str(pki / "front-proxy-client.crt"),
        "--proxy-client-key-file", str(pki / "front-proxy-client.key"),
    ])  # fmt: skip
    ctx = admin_ssl(pki)
    procs.wait_until(
        "kube-apiserver /readyz",
        lambda: http_ok(f"https://127.0.0.1:{api_port}/readyz", ctx),
        90,
        "kube-apiserver",
    )
    kubeconfig = write_kubeconfig(d, state.name, api_port)

    common = [
        "--kubeconfig", str(kubeconfig),
        "--authentication-kubeconfig", str(kubeconfig),
        "--authorization-kubeconfig", str(kubeconfig),
        "--bind-address", "127.0.0.1", "--leader-elect=false",
        "--cert-dir", str(d / "certs"),
    ]  # fmt: skip
    procs.start("kube-controller-manager", [
        str(binary_path("kube-controller-manager")), *common,
        "--secure-port", str(ports["kcm"]),
        "--controllers", "*",
        "--service-account-private-key-file", str(pki / "sa.key"),
        "--root-ca-file", str(pki / "ca.crt"),
        "--cluster-signing-cert-file", str(pki / "ca.crt"),
        "--cluster-signing-key-file", str(pki / "ca.key"),
        "--service-cluster-ip-range", SERVICE_CIDR,
        "--allocate-node-cidrs=false",
        "--use-service-account-credentials=false",
        "--profiling=false",
        # The default 20 requests/s makes a fleet of 2,000 resources (bench/operator_scale.py:
        # 4,000 Deployments, their ReplicaSets and pods) take minutes to roll out and to
        # garbage-collect; a real control plane's controller-manager is sized up alike.
        "--kube-api-qps", "200", "--kube-api-burst", "400",
        "--concurrent-deployment-syncs", "10", "--concurrent-replicaset-syncs", "10",
    ])  # fmt: skip
    procs.start("kube-scheduler", [
        str(binary_path("kube-scheduler")), *common,
        "--secure-port", str(ports["scheduler"]),
        "--profiling=false",
    ])  # fmt: skip
    procs.start("kwok", [
        str(binary_path("kwok")),
        "--kubeconfig", str(kubeconfig),
        "--config", str(kwok_config(state)),
        "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector", f"{KWOK_NODE_ANNOTATION}=fake",
        "--cidr", state.pod_cidr,
        "--node-ip", "127.0.0.1",
        "--node-lease-duration-seconds", "40",
        "--server-address", f"127.0.0.1:{ports['kwok']}",
    ])  # fmt: skip
    insecure = insecure_ssl()
    procs.wait_until(
        "kube-controller-manager /healthz",
        lambda: http_ok(f"https://127.0.0.1:{ports['kcm']}/healthz", insecure),
        60,
        "kube-controller-manager",
    )
    procs.wait_until(
        "kube-scheduler /healthz",
        lambda: http_ok(f"https://127.0.0.1:{ports['scheduler']}/healthz", insecure),
        60,
        "kube-scheduler",
    )
    procs.wait_until(
        "kwok /healthz", lambda: http_ok(f"http://127.0.0.1:{ports['kwok']}/healthz"), 60, "kwok"
    )

    say(f"creating {opts.nodes} fake nodes with {opts.gpus} nvidia.com/gpu each")
    kubectl(
        state,
        "create",
        "-f",
        "-",
        input_=node_manifest(state, opts.nodes, opts.gpus, opts.pods_per_node, opts.cpus_per_node),
    )
    state.save()
    # One list, not `kubectl wait --all`: that checks the nodes one after another within its
    # one timeout, so past about 20 nodes it never saw them all Ready (34 for 2,000 resources).
    procs.wait_until(
        "fake nodes Ready",
        lambda: ready_nodes(state) == opts.nodes,
        60,
        "kwok",
    )
    procs.wait_until(
        "default service account (controller-manager)",
        lambda: "default" in kubectl(state, "get", "serviceaccount", "default", "-o", "name",
                                     check=False),
        60,
        "kube-controller-manager",
    )  # fmt: skip
    # A Service's ClusterIP comes from the default ServiceCIDR, which the API server creates
    # and marks Ready shortly after it is itself ready; until then creating a Service hangs
    # until the request times out (seen as the first reconciles' 15 s timeouts).
    procs.wait_until(
        "default ServiceCIDR Ready",
        lambda: kubectl(state, "get", "servicecidr", "kubernetes", "-o",
                        "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
                        check=False).strip() == "True",
        60,
        "kube-apiserver",
    )  # fmt: skip
    if state.gateway_crds:
        install_gateway_crds(state)
    say(f"cluster {state.name} up in {time.monotonic() - t0:.1f}s")
    return state


def install_gateway_crds(state: State) -> None:
    files = crds.gateway_crd_files()
    say(f"installing Gateway API + InferencePool CRDs ({len(files)} files)")
    argv = ["apply", "--server-side", "--field-manager", "promptcache-e2e"]
    for f in files:
        argv += ["-f", str(f)]
    kubectl(state, *argv)
    getter = crds.kubectl_getter(
        [str(binary_path("kubectl")), "--kubeconfig", str(state.kubeconfig)]
    )
    crds.wait_established(getter, crds.GATEWAY_CRD_NAMES, timeout=60)


def container_engine() -> str | None:
    for engine in ("docker", "podman"):
        path = shutil.which(engine)
        if (
            path
            and subprocess.run([path, "info"], capture_output=True, check=False).returncode == 0
        ):
            return engine
    return None


def kind_binary() -> str | None:
    built = binary_path("kind")
    return str(built) if built.is_file() else shutil.which("kind")


def up_kind(opts: UpOptions, d: Path) -> State:
    """Same cluster shape on kind, for machines that have a container engine (user CI)."""
    engine = container_engine()
    if engine is None:
        raise ClusterError("--kind needs a working docker or podman; none found on this machine")
    kind = kind_binary()
    if kind is None:
        raise ClusterError("--kind needs kind: run `e2e/cluster build --only kind`")
    d.mkdir(parents=True, exist_ok=True)
    state = State(name=d.name, dir=str(d), pod_cidr="", ports={}, mode="kind",
                  gateway_crds=opts.gateway_crds)  # fmt: skip
    state.save()
    say(f"creating kind cluster {state.name} with {engine}")
    subprocess.run(
        [kind, "create", "cluster", "--name", state.name, "--kubeconfig", str(state.kubeconfig),
         "--wait", "120s"],
        check=True,
    )  # fmt: skip
    if state.gateway_crds:
        install_gateway_crds(state)
    return state


def supervisor(state: State) -> Supervisor:
    return Supervisor(Path(state.dir), state.pids, on_change=state.save)


def ready_nodes(state: State) -> int:
    """How many nodes have the condition Ready=True, from one list request."""
    listed = kubectl(
        state,
        "get",
        "nodes",
        "-o",
        "jsonpath={range .items[*]}{.status.conditions[?(@.type=='Ready')].status}{'\\n'}{end}",
        check=False,
    )
    return listed.split().count("True")


def up(opts: UpOptions, d: Path) -> State:
    """Start the cluster in `d`, or return the one already running there (idempotent)."""
    old = State.load(d)
    if old is not None:
        procs = supervisor(old)
        alive = [c for c in old.pids if procs.alive(c)]
        if old.mode == "local" and alive and len(alive) == len(old.pids):
            say(f"cluster {old.name} is already up in {d}")
            return old
        say(f"cleaning up a stale cluster in {d}")
        down(old, keep=False)
    attempts = 1 if opts.kind else 2
    for attempt in range(1, attempts + 1):
        d.mkdir(parents=True, exist_ok=True)
        try:
            state = up_kind(opts, d) if opts.kind else up_local(opts, d)
            break
        except ComponentExitedError as exc:
            # A component dying at start is most often a port taken between our pick and
            # its bind (other clusters and tests share the machine): retry once, on fresh
            # ports, saying why.
            st = State.load(d)
            if attempt == attempts or st is None or opts.keep_on_failure:
                if st is not None and not opts.keep_on_failure:
                    say("start failed; stopping what was started")
                    down(st, keep=True)  # keep logs for the post-mortem
                raise
            say(f"start failed ({exc}); retrying once on fresh ports")
            down(st, keep=False)
        except BaseException:
            st = State.load(d)
            if st is None:
                with contextlib.suppress(OSError):
                    d.rmdir()  # nothing was started: leave no empty cluster dir behind
            if st is not None and not opts.keep_on_failure:
                say("start failed; stopping what was started")
                down(st, keep=True)  # keep logs for the post-mortem
            raise
    if opts.watch_pid:
        spawn_watcher(state, opts.watch_pid)
    return state


def spawn_watcher(state: State, pid: int) -> None:
    """A detached guard that takes the cluster down if its owner (e.g. pytest) dies
    without running teardown, so no control plane outlives a killed test session."""
    proc = subprocess.Popen(
        [sys.executable, str(CLI), "_watch", "--dir", state.dir, "--pid", str(pid)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    state.pids["watcher"] = proc.pid
    state.save()


def watch(d: Path, pid: int) -> None:
    """Until the cluster in `d` is gone: take it down once `pid` has exited."""
    while True:
        st = State.load(d)
        if st is None:
            return
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            st.pids.pop("watcher", None)
            down(st, keep=False)
            return
        except PermissionError:
            pass
        time.sleep(1)


def down(state: State, keep: bool) -> None:
    """Stop every process (clients first, then the API server, etcd last) and remove the
    state dir, or keep it (logs) with no pids."""
    if state.mode == "kind":
        kind = kind_binary()
        if kind:
            subprocess.run([kind, "delete", "cluster", "--name", state.name], check=False)
    me = os.getpid()
    comps = [c for c in state.pids if state.pids[c] != me]
    procs = supervisor(state)
    # Clients first, then the API server (its graceful shutdown needs etcd), etcd last.
    for group in (
        [c for c in comps if c not in ("kube-apiserver", "etcd")],
        [c for c in comps if c == "kube-apiserver"],
        [c for c in comps if c == "etcd"],
    ):
        procs.stop(group)
    state.pids = {}
    if keep:
        state.save()
    else:
        shutil.rmtree(state.dir, ignore_errors=True)

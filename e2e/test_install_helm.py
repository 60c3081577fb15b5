"""The Helm chart on a real control plane: install, reconcile, upgrade, uninstall.

kwok pods run no containers, so "the chart-installed operator" is run here as a process
with exactly what the chart gave its pod: the Deployment's command, args and env, and the
credentials of the chart's ServiceAccount (a token from `kubectl create token` in a
kubeconfig of its own). Whatever that process can do, the pod could do; whatever RBAC
the chart forgot, it cannot.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.net import free_port
from harness.operator import OperatorProcess, wait_established, wait_for
from harness.pytest_cluster import Cluster
from promptcache.api.defaults import OperatorDefaults, flag_of

pytestmark = [pytest.mark.cluster, pytest.mark.helm]

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "promptcache-operator"
CRD_NAME = "promptcachedeployments.serving.promptcache.io"
CRD_FILE = "serving.promptcache.io_promptcachedeployments.yaml"
EXAMPLE = ROOT / "examples" / "minimal.yaml"
RECONCILE_TIMEOUT_S = 180  # a cold kopf start plus ten children on a loaded 2-core machine


def release_name() -> str:
    return f"pco-{uuid.uuid4().hex[:6]}"


def fullname(release: str) -> str:
    return f"{release}-promptcache-operator"


def example_in(namespace: str, path: Path = EXAMPLE) -> list[dict[str, Any]]:
    """The example's resources, moved into `namespace` (examples name `default`)."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
    return docs


DEFAULT_FLAGS = tuple(f"{flag_of(name)}=" for name in OperatorDefaults.model_fields)
"""The operator-wide defaults: `promptcache run` and `promptcache render` share them."""


def rendered_children(
    resources: list[dict[str, Any]],
    operator_args: Sequence[str] = (),
) -> list[tuple[str, str, str]]:
    """(kubectl resource, namespace, name) of every child `promptcache render` produces,
    given the operator-wide defaults among `operator_args` (the chart's `run` flags)."""
    flags = [a for a in operator_args if a.startswith(DEFAULT_FLAGS)]
    proc = subprocess.run(
        [sys.executable, "-m", "promptcache.cli", "render", "-f", "-", *flags],
        input=yaml.safe_dump_all(resources),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    out = []
    for doc in yaml.safe_load_all(proc.stdout):
        if not doc:
            continue
        group = doc["apiVersion"].rpartition("/")[0]
        kind = doc["kind"].lower()
        out.append(
            (
                f"{kind}.{group}" if group else kind,
                doc["metadata"]["namespace"],
                doc["metadata"]["name"],
            )
        )
    assert out, "render produced no children"
    return out


def exists(cluster: Cluster, resource: str, namespace: str, name: str) -> bool:
    return cluster.kubectl("get", resource, name, "-n", namespace, check=False).returncode == 0


def can_i(cluster: Cluster, sa: str, verb: str, resource: str, namespace: str) -> bool:
    proc = cluster.kubectl(
        "auth", "can-i", verb, resource, "-n", namespace, f"--as={sa}", check=False
    )
    return proc.stdout.strip() == "yes"


def run_as_chart_pod(
    cluster: Cluster, namespace: str, deployment: str, workdir: Path, replica: int = 0
) -> OperatorProcess:
    """Start the operator exactly as the chart's Deployment would, as its ServiceAccount.

    Replica 0 listens on the chart's ports; further replicas (pods on other IPs in a real
    cluster) share this host's loopback, so they get free ports appended to the args.
    """
    dep = cluster.get_json("deployment", deployment, "-n", namespace)
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    kubeconfig = cluster.service_account_kubeconfig(
        namespace, pod["serviceAccountName"], workdir / "sa-kubeconfig", duration="1h"
    )
    fields = {"metadata.name": f"{deployment}-local-{replica}", "metadata.namespace": namespace}
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
    ports = {p["name"]: int(p["containerPort"]) for p in container["ports"]}
    extra = ["--bind-address=127.0.0.1"]  # loopback here; in the pod, the pod IP (0.0.0.0)
    if replica:
        ports = {name: free_port() for name in ports}
        extra += [f"--health-port={ports['health']}", f"--metrics-port={ports['metrics']}"]
    return OperatorProcess.from_container(
        container,
        kubeconfig=kubeconfig,
        log_path=workdir / f"operator-{replica}.log",
        env=env,
        health_port=ports["health"],
        metrics_port=ports["metrics"],
        extra_args=extra,
        cwd=workdir,
    ).start(wait_healthy=False)


@pytest.fixture
def ops_namespace(cluster: Cluster) -> Iterator[str]:
    name = cluster.create_namespace("ops")
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_install_and_the_operator_reconciles_with_the_chart_credentials(
    cluster: Cluster, ops_namespace: str, namespace: str, tmp_path: Path
) -> None:
    # The shared cluster holds the CRD already (other tests apply crds/), as a cluster
    # whose CRD a GitOps tool manages does: the chart then leaves it alone (crds.install).
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds" / CRD_FILE)
    )
    release = release_name()
    name = fullname(release)
    install = cluster.helm(
        "install",
        release,
        str(CHART),
        "-n",
        ops_namespace,
        "--set",
        "crds.install=false",
        # Operator-wide default images: the example names none, so its pods get these.
        "--set",
        "image.registry=mirror.example/pc",
        "--set",
        "defaultImages.front.tag=9.9.9",
        "--set",
        f"watch.namespaces={{{namespace}}}",
        "--set",
        f"health.port={free_port()}",
        "--set",
        f"metrics.port={free_port()}",
        "--wait",
        "--timeout",
        "3m",
    )
    try:
        assert "STATUS: deployed" in install.stdout
        # NOTES tell the next command, for the namespace the operator watches.
        assert f"kubectl -n {ops_namespace} rollout status deployment/{name}" in install.stdout
        assert f"namespace: {namespace}" in install.stdout
        wait_established(cluster.kubectl, CRD_NAME)

        # Least privilege: rights in the watched namespace only, none elsewhere.
        sa = f"system:serviceaccount:{ops_namespace}:{name}"
        assert can_i(
            cluster, sa, "watch", "promptcachedeployments.serving.promptcache.io", namespace
        )
        assert not can_i(
            cluster, sa, "watch", "promptcachedeployments.serving.promptcache.io", "default"
        )
        assert not can_i(cluster, sa, "get", "secrets", ops_namespace)
        assert can_i(cluster, sa, "update", "leases.coordination.k8s.io", ops_namespace)
        assert not can_i(cluster, sa, "update", "leases.coordination.k8s.io", "default")
        assert cluster.kubectl("get", "clusterrolebinding", name, check=False).returncode != 0

        operator = run_as_chart_pod(cluster, ops_namespace, name, tmp_path)
        try:
            # The chart's probes hit real endpoints of the operator it runs.
            wait_for(
                lambda: operator.probe("livenessProbe")[0] == 200,
                "liveness probe",
                60,
                operator=operator,
            )
            wait_for(
                lambda: operator.probe("readinessProbe")[0] == 200,
                "readiness probe",
                60,
                operator=operator,
            )
            resources = example_in(namespace)
            cluster.kubectl(
                "apply",
                "--server-side",
                "--field-manager=gitops",
                "-f",
                "-",
                input=yaml.safe_dump_all(resources),
            )
            children = rendered_children(resources, operator.container["args"])
            # The picker's rights: a RoleBinding to the chart's static ClusterRole.
            assert (
                "rolebinding.rbac.authorization.k8s.io",
                namespace,
                "qwen-small-epp-picker",
            ) in children
            assert not any(kind.startswith("role.") for kind, _, _ in children)
            for resource, ns, child in children:
                wait_for(
                    lambda r=resource, n=ns, c=child: exists(cluster, r, n, c),
                    f"{resource} {ns}/{child}",
                    RECONCILE_TIMEOUT_S,
                    operator=operator,
                )
            pcd = resources[0]["metadata"]["name"]
            # The example names no image of this project: the chart's defaults fill them in.
            assert "front" not in resources[0]["spec"]
            model_server = cluster.get_json("deployment", pcd, "-n", namespace)
            images = {
                c["name"]: c["image"]
                for c in model_server["spec"]["template"]["spec"]["containers"]
            }
            assert images["cache-front"] == "mirror.example/pc/promptcache-front:9.9.9"
            wait_for(
                lambda: (
                    cluster.get_json("pcd", pcd, "-n", namespace)
                    .get("status", {})
                    .get("observedGeneration")
                    == 1
                ),
                "status.observedGeneration",
                RECONCILE_TIMEOUT_S,
                operator=operator,
            )
            # This process (not some other operator) did the work, as the Lease leader.
            assert operator.counter("promptcache_leader") == 1
            assert operator.counter("promptcache_children_applied_total") >= len(children)
            assert operator.probe("readinessProbe")[1].strip() == "leader"
            # GitOps with the operator in the loop: what it adds (status, annotations; it
            # sets no finalizer) is not drift for a server-side diff of the committed resource.
            diff = cluster.kubectl(
                "diff",
                "--server-side",
                "--field-manager=gitops",
                "-f",
                "-",
                input=yaml.safe_dump_all(resources),
                check=False,
            )
            assert diff.returncode == 0, diff.stdout + diff.stderr
            # Uninstall order of docs/install.md: resources first; the children go with them
            # (owner references). No finalizer: the object is gone at once.
            live = json.loads(
                cluster.kubectl("get", "pcd", pcd, "-n", namespace, "-o", "json").stdout
            )
            assert not live["metadata"].get("finalizers"), live["metadata"]
            cluster.kubectl("delete", "pcd", pcd, "-n", namespace, "--wait", "--timeout=120s")
            deployment = next(c for c in children if c[0] == "deployment.apps")
            wait_for(
                lambda: not exists(cluster, *deployment),
                f"garbage collection of {deployment}",
                RECONCILE_TIMEOUT_S,
                operator=operator,
            )
            assert not operator.exited(), operator.log_tail()
        finally:
            operator.stop()
        assert "Forbidden" not in operator.log_text(), operator.log_text()
    finally:
        cluster.helm("uninstall", release, "-n", ops_namespace, "--wait", check=False)


@pytest.mark.timeout(1200)  # starts a control plane of its own (up: 240 s at most)
def test_upgrade_and_uninstall_keep_the_crd_and_user_resources(
    cluster_factory: Any, tmp_path: Path
) -> None:
    # A cluster of its own: the chart, not an earlier test, must be what installs the CRD.
    fresh: Cluster = cluster_factory(gateway_crds=False)
    assert fresh.kubectl("get", "crd", CRD_NAME, check=False).returncode != 0
    ops = fresh.create_namespace("ops")
    team = fresh.create_namespace("team")
    release = "promptcache-operator"

    fresh.helm("install", release, str(CHART), "-n", ops, "--wait", "--timeout", "3m")
    wait_established(fresh.kubectl, CRD_NAME)
    crd = fresh.get_json("crd", CRD_NAME)
    shipped = yaml.safe_load((ROOT / "crds" / CRD_FILE).read_text())
    assert crd["spec"]["versions"][0]["schema"] == shipped["spec"]["versions"][0]["schema"]
    assert fresh.get_json("clusterrolebinding", release)["subjects"][0]["namespace"] == ops
    dep = fresh.get_json("deployment", release, "-n", ops)
    assert dep["spec"]["replicas"] == 1
    assert "--all-namespaces" in dep["spec"]["template"]["spec"]["containers"][0]["args"]

    resources = example_in(team)
    fresh.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(resources))

    upgrade = fresh.helm(
        "upgrade",
        release,
        str(CHART),
        "-n",
        ops,
        "--reuse-values",
        "--set",
        "replicas=2",
        "--set",
        "logLevel=debug",
        "--set",
        f"watch.namespaces={{{team}}}",
        "--wait",
        "--timeout",
        "3m",
    )
    assert "REVISION: 2" in upgrade.stdout
    dep = fresh.get_json("deployment", release, "-n", ops)
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert dep["spec"]["replicas"] == 2
    assert dep["status"].get("readyReplicas") == 2
    assert f"--namespace={team}" in args
    assert "--all-namespaces" not in args
    assert "--log-level=DEBUG" in args
    assert f"--lease-name={release}" in args
    # The binding moved from cluster-wide to the watched namespace.
    assert fresh.kubectl("get", "clusterrolebinding", release, check=False).returncode != 0
    assert fresh.get_json("rolebinding", release, "-n", team)["roleRef"]["name"] == release

    # Two replicas as the upgraded chart runs them: one leads through the Lease in the
    # release namespace (granted by the chart's Role there), the other stands by and takes
    # over when the leader goes away.
    replicas = [run_as_chart_pod(fresh, ops, release, tmp_path, replica=i) for i in (0, 1)]
    try:

        def roles() -> list[str]:
            return [r.probe("readinessProbe")[1].strip() for r in replicas]

        wait_for(lambda: sorted(roles()) == ["leader", "standby"], "one leader and one standby", 90)
        leader = roles().index("leader")
        assert replicas[leader].counter("promptcache_leader") == 1
        assert replicas[1 - leader].counter("promptcache_leader") == 0
        replicas[leader].stop()
        wait_for(
            lambda: roles()[1 - leader] == "leader",
            "the standby to take over",
            90,
            operator=replicas[1 - leader],
        )
        lease = fresh.get_json("lease", release, "-n", ops)
        assert lease["spec"]["holderIdentity"] == f"{release}-local-{1 - leader}"
    finally:
        for r in replicas:
            r.stop()

    bad = fresh.helm(
        "upgrade",
        release,
        str(CHART),
        "-n",
        ops,
        "--reuse-values",
        "--set",
        "replicas=0",
        check=False,
    )
    assert bad.returncode != 0
    assert "- at '/replicas': minimum: got 0, want 1" in bad.stderr
    history = json.loads(fresh.helm("history", release, "-n", ops, "-o", "json").stdout)
    assert [h["status"] for h in history] == ["superseded", "deployed"]

    fresh.helm("uninstall", release, "-n", ops, "--wait", "--timeout", "2m")
    for kind, ns in (
        ("deployment", ops),
        ("serviceaccount", ops),
        ("rolebinding", team),
        ("clusterrole", None),
    ):
        scope = ["-n", ns] if ns else []
        gone = fresh.kubectl("get", kind, release, *scope, check=False)
        assert gone.returncode != 0, f"{kind} {release} survived uninstall"
    # As Helm does: the CRD and the user's resources stay.
    assert fresh.kubectl("get", "crd", CRD_NAME, check=False).returncode == 0
    kept = fresh.get_json("pcd", resources[0]["metadata"]["name"], "-n", team)
    assert kept["spec"]["model"]["name"] == resources[0]["spec"]["model"]["name"]


def _chart_with_a_new_crd_field(tmp_path: Path, field: str) -> Path:
    """Chart N+1: this chart, its CRD generated with one more spec field, version bumped."""
    spec = importlib.util.spec_from_file_location(
        "install_assets_n1", ROOT / "tools" / "install_assets.py"
    )
    assert spec is not None
    assert spec.loader is not None
    assets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(assets)
    crd = yaml.safe_load((ROOT / "crds" / CRD_FILE).read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["properties"]["spec"]["properties"][field] = {
        "type": "string",
        "description": "A field chart N does not know.",
    }
    crds = tmp_path / "crds-n1"
    crds.mkdir()
    (crds / CRD_FILE).write_text("---\n" + yaml.safe_dump(crd, sort_keys=False))
    newer = tmp_path / "chart-n1"
    shutil.copytree(CHART, newer)
    assets.CRDS = crds
    ((_, template),) = assets.chart_crds().items()
    (newer / "templates" / "crds.yaml").write_text(template)
    chart = yaml.safe_load((newer / "Chart.yaml").read_text())
    chart["version"] = chart["version"] + "-next"
    (newer / "Chart.yaml").write_text(yaml.safe_dump(chart, sort_keys=False))
    return newer


@pytest.mark.timeout(1200)  # starts a control plane of its own (up: 240 s at most)
def test_the_crd_upgrades_with_the_chart_and_uninstall_keeps_it_unless_asked(
    cluster_factory: Any, tmp_path: Path
) -> None:
    fresh: Cluster = cluster_factory(gateway_crds=False)
    ops = fresh.create_namespace("ops")
    team = fresh.create_namespace("team")
    release = "pco"
    fresh.helm("install", release, str(CHART), "-n", ops, "--wait", "--timeout", "3m")
    wait_established(fresh.kubectl, CRD_NAME)
    crd = fresh.get_json("crd", CRD_NAME)
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    spec_fields = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert "canary" not in spec_fields["properties"]

    existing = example_in(team)
    fresh.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(existing))
    name = existing[0]["metadata"]["name"]
    before = fresh.get_json("pcd", name, "-n", team)
    # Chart N refuses the field (strict decoding names it).
    new = example_in(team)[0]
    new["metadata"]["name"] = "uses-canary"
    new["spec"]["canary"] = "yes"
    refused = fresh.kubectl(
        "apply", "--server-side", "-f", "-", input=yaml.safe_dump(new), check=False
    )
    assert refused.returncode != 0
    assert "spec.canary" in refused.stderr, refused.stderr

    newer = _chart_with_a_new_crd_field(tmp_path, "canary")
    upgrade = fresh.helm(
        "upgrade", release, str(newer), "-n", ops, "--reuse-values", "--wait", "--timeout", "3m"
    )
    assert "REVISION: 2" in upgrade.stdout
    fresh.wait_for(
        lambda: (
            "canary"
            in fresh.get_json("crd", CRD_NAME)["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
                "properties"
            ]["spec"]["properties"]
        ),
        "the upgraded CRD",
    )
    fresh.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(new))
    assert fresh.get_json("pcd", "uses-canary", "-n", team)["spec"]["canary"] == "yes"
    after = fresh.get_json("pcd", name, "-n", team)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert after["spec"] == before["spec"]

    # Uninstall keeps the CRD and every resource (helm.sh/resource-policy: keep).
    fresh.helm("uninstall", release, "-n", ops, "--wait", "--timeout", "2m")
    assert fresh.kubectl("get", "crd", CRD_NAME, check=False).returncode == 0
    assert fresh.get_json("pcd", name, "-n", team)["spec"] == before["spec"]
    assert fresh.get_json("pcd", "uses-canary", "-n", team)["spec"]["canary"] == "yes"

    # Unless asked: a release that owns the kept CRD with crds.keep=false deletes it, and the
    # resources with it, on uninstall.
    fresh.helm(
        "install", release, str(newer), "-n", ops, "--set", "crds.keep=false", "--wait",
        "--timeout", "3m",
    )  # fmt: skip
    annotations = fresh.get_json("crd", CRD_NAME)["metadata"].get("annotations", {})
    assert "helm.sh/resource-policy" not in annotations
    fresh.helm("uninstall", release, "-n", ops, "--wait", "--timeout", "3m")
    fresh.wait_for(
        lambda: fresh.kubectl("get", "crd", CRD_NAME, check=False).returncode != 0,
        "the CRD to be deleted",
        120,
    )

"""The chart through the real helm binary: lint, golden renders, hardening, bad values.

`helm template` output is compared byte for byte with `tests/chart/golden/<set>.yaml` for
each value set in `tests/chart/values/`; regenerate with `tools/install_assets.py` and
review the diff. The structural checks below say *why* the renders look as they do.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tools import install_assets

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.helm

CHART = ROOT / "charts" / "promptcache-operator"
VALUE_SETS = sorted((ROOT / "tests" / "chart" / "values").glob("*.yaml"))


def render(*extra: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(install_assets.helm_template(*extra)) if d]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def template_error(*set_args: str) -> str:
    args = ["template", "x", str(CHART)]
    for s in set_args:
        args += ["--set", s]
    proc = install_assets.helm(*args, check=False)
    assert proc.returncode != 0, f"helm accepted {set_args}"
    return str(proc.stderr)


@pytest.mark.parametrize("value_set", [None, *VALUE_SETS], ids=lambda p: p.stem if p else "none")
def test_helm_lint_strict_passes(value_set: Path | None) -> None:
    extra = ["-f", str(value_set)] if value_set else []
    proc = install_assets.helm("lint", "--strict", str(CHART), *extra, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout
    assert "[WARNING]" not in proc.stdout
    assert "[ERROR]" not in proc.stdout


@pytest.mark.parametrize("value_set", VALUE_SETS, ids=lambda p: p.stem)
def test_helm_template_matches_golden(value_set: Path) -> None:
    golden = ROOT / "tests" / "chart" / "golden" / value_set.name
    rendered = install_assets.helm_template("-f", str(value_set))
    expected = golden.read_text()
    diff = "".join(
        difflib.unified_diff(
            expected.splitlines(keepends=True),
            rendered.splitlines(keepends=True),
            str(golden.relative_to(ROOT)),
            "helm template",
        )
    )
    assert rendered == expected, f"run tools/install_assets.py and review:\n{diff}"


def test_no_generated_file_is_stale() -> None:
    stale = install_assets.stale_files()
    assert stale == [], f"run tools/install_assets.py; stale: {stale}"


def test_default_install_is_cluster_wide_and_hardened() -> None:
    docs = render()
    assert sorted(d["kind"] for d in docs) == [
        "ClusterRole",  # the operator's
        "ClusterRole",  # the Endpoint Picker's, bound per namespace by the operator
        "ClusterRole",  # aggregated into admin
        "ClusterRole",  # ... edit
        "ClusterRole",  # ... view
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "Deployment",
        "Role",  # the leader Lease, in the release namespace
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert deployment["spec"]["replicas"] == 1
    assert container["image"] == "ghcr.io/promptcache/promptcache-operator:0.1.0"
    assert container["command"] == ["promptcache"]
    assert container["args"][:2] == ["run", "--all-namespaces"]
    assert "--log-level=INFO" in container["args"]
    # Leader election is always on: a rolling update briefly runs two pods.
    assert "--lease-name=promptcache-operator" in container["args"]
    assert not any(a.startswith("--no-leader-election") for a in container["args"])
    # Operator-wide defaults for the resources: this release's images, the picker's role.
    assert "--front-image=ghcr.io/promptcache/promptcache-front:0.1.0" in container["args"]
    assert (
        "--gateway-policy-image=ghcr.io/promptcache/promptcache-operator:0.1.0" in container["args"]
    )
    assert (
        "--endpoint-picker-cluster-role=promptcache-operator-endpoint-picker" in container["args"]
    )
    assert "--model-server-user=1000" in container["args"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }  # no UID: the image's, or the platform's
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8080, "metrics": 9090}
    assert "--health-port=8080" in container["args"]
    assert "--metrics-port=9090" in container["args"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    assert container["resources"]["limits"]["memory"] == "512Mi"
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    assert "affinity" not in pod
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == "promptcache-operator"
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": "promptcache-operator",
            "namespace": "promptcache-system",
        }
    ]
    service = one(docs, "Service")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def rules_file() -> list[dict[str, Any]]:
    from promptcache.controller.rbac import load_rules

    rules = load_rules(
        CHART / "files" / "clusterrole-rules.yaml",
        picker_role="promptcache-operator-endpoint-picker",
    )
    assert isinstance(rules, list)
    assert rules, "the rules file holds no rule"
    return rules


def test_watched_namespaces_get_rolebindings_and_only_cluster_scoped_rules_cluster_wide() -> None:
    docs = render("-f", str(ROOT / "tests/chart/values/ha-namespaced.yaml"))
    by_name = {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")): d for d in docs}
    bindings = [
        d for d in docs if d["kind"] == "RoleBinding" and d["roleRef"]["kind"] == "ClusterRole"
    ]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "promptcache-operator",
        }
    # The full rules are never bound cluster-wide...
    cluster_bindings = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    assert [b["roleRef"]["name"] for b in cluster_bindings] == [
        "promptcache-operator-cluster-scope"
    ]
    # ...only the file's rules on cluster-scoped resources are (a RoleBinding cannot grant them).
    scoped = by_name[("ClusterRole", "promptcache-operator-cluster-scope", None)]["rules"]
    namespaced_kinds = {"pods", "secrets", "deployments", "leases", "promptcachedeployments"}
    for rule in scoped:
        assert not namespaced_kinds & set(rule["resources"]), rule
        assert any(
            set(rule["apiGroups"]) <= set(r["apiGroups"])
            and set(rule["resources"]) <= set(r["resources"])
            and rule["verbs"] == r["verbs"]
            for r in rules_file()
        ), f"{rule} is not from the rules file"
    # The leader Lease lives in the release namespace: the Lease rules as a Role there.
    lease_role = by_name[("Role", "promptcache-operator-leader-election", "promptcache-system")]
    (lease_rule,) = lease_role["rules"]
    assert lease_rule["resources"] == ["leases"]
    assert lease_rule["verbs"] == ["get", "create", "update"]
    lease_binding = by_name[
        ("RoleBinding", "promptcache-operator-leader-election", "promptcache-system")
    ]
    assert lease_binding["roleRef"]["kind"] == "Role"
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[:3] == ["run", "--namespace=team-a", "--namespace=team-b"]
    assert "--all-namespaces" not in args
    assert "--log-level=DEBUG" in args
    assert container["image"].endswith("@sha256:" + "0123456789abcdef" * 4)


def test_replicas_above_one_spread_peers_unless_affinity_is_given() -> None:
    pod = one(render("--set", "replicas=2"), "Deployment")["spec"]["template"]["spec"]
    spread = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert spread[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    custom = one(render("--set", "replicas=2", "--set", "affinity.nodeAffinity.x=y"), "Deployment")[
        "spec"
    ]["template"]["spec"]["affinity"]
    assert custom == {"nodeAffinity": {"x": "y"}}


def test_clusterrole_rules_are_the_rules_files() -> None:
    from promptcache.controller.rbac import leader_election_role, picker_cluster_role
    from promptcache.render.epp import picker_rules

    docs = render()
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] in ("ClusterRole", "Role")}
    assert roles["promptcache-operator"]["rules"] == rules_file()
    picker = roles["promptcache-operator-endpoint-picker"]["rules"]
    assert picker == picker_rules() == picker_cluster_role()["rules"]
    leader = roles["promptcache-operator-leader-election"]
    assert leader["rules"] == leader_election_role()["rules"]
    # Least privilege: no Lease, no Secret read, and bind on the picker role only.
    for rule in rules_file():
        assert "leases" not in rule["resources"], rule
        if "secrets" in rule["resources"]:
            assert rule["verbs"] == ["create"]
        if "bind" in rule["verbs"]:
            assert rule["resourceNames"] == ["promptcache-operator-endpoint-picker"]
    for role in ("admin", "edit", "view"):
        aggregated = roles[f"promptcache-operator-{role}"]
        assert (
            aggregated["metadata"]["labels"][f"rbac.authorization.k8s.io/aggregate-to-{role}"]
            == "true"
        )
    assert "promptcache-operator-view" not in {
        d["metadata"]["name"] for d in render("--set", "rbac.aggregateToUserRoles=false")
    }


def test_default_images_follow_the_registry_and_may_be_pinned() -> None:
    def args(*values: str) -> list[str]:
        (container,) = one(render(*values), "Deployment")["spec"]["template"]["spec"]["containers"]
        return [a for a in container["args"] if a.startswith(("--front-", "--gateway-policy-"))] + [
            container["image"]
        ]

    digest = "sha256:" + "ab" * 32
    assert args("--set", "image.registry=reg.example:5000/mirror") == [
        "--front-image=reg.example:5000/mirror/promptcache-front:0.1.0",
        "--gateway-policy-image=reg.example:5000/mirror/promptcache-operator:0.1.0",
        "reg.example:5000/mirror/promptcache-operator:0.1.0",
    ]
    assert args(
        "--set", f"defaultImages.front.digest={digest}",
        "--set", "defaultImages.gatewayPolicy.repository=shim",
        "--set", "defaultImages.gatewayPolicy.registry=other.example",
        "--set-string", "defaultImages.gatewayPolicy.tag=7",
    ) == [
        f"--front-image=ghcr.io/promptcache/promptcache-front@{digest}",
        "--gateway-policy-image=other.example/shim:7",
        "ghcr.io/promptcache/promptcache-operator:0.1.0",
    ]  # fmt: skip
    # The old name of the value was removed (CHANGELOG): refused, never silently ignored.
    assert "sessionShim" in template_error("defaultImages.sessionShim.repository=old")
    (container,) = one(render("--set", "modelServerUser=null"), "Deployment")["spec"]["template"][
        "spec"
    ]["containers"]
    assert "--model-server-user=none" in container["args"]


def test_the_crd_is_a_template_kept_on_uninstall_unless_asked() -> None:
    crd = one(render(), "CustomResourceDefinition")
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    generated = yaml.safe_load(
        (ROOT / "crds" / "serving.promptcache.io_promptcachedeployments.yaml").read_text()
    )
    del crd["metadata"]["annotations"]
    assert crd == generated
    unkept = one(render("--set", "crds.keep=false"), "CustomResourceDefinition")
    assert "annotations" not in unkept["metadata"]
    kinds = [d["kind"] for d in render("--set", "crds.install=false")]
    assert "CustomResourceDefinition" not in kinds


def test_servicemonitor_only_when_asked() -> None:
    docs = render("--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.port=9000")
    monitor = one(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert "ServiceMonitor" not in [d["kind"] for d in render()]
    assert "Service" not in [d["kind"] for d in render("--set", "metrics.service.enabled=false")]


def test_monitoring_objects_only_when_asked_and_verbatim() -> None:
    """The PrometheusRule and the dashboard ConfigMap carry the promtool-tested rules file and
    the e2e-tested dashboard byte for byte; the ConfigMap has the Grafana sidecar's label."""
    import json

    kinds = [d["kind"] for d in render()]
    assert "PrometheusRule" not in kinds
    assert not [d for d in render() if d["metadata"]["name"].endswith("-dashboard")]
    docs = render(
        "--set", "monitoring.prometheusRule.enabled=true",
        "--set", "monitoring.prometheusRule.labels.release=kube-prometheus-stack",
        "--set", "monitoring.dashboard.enabled=true",
        "--set", "monitoring.dashboard.namespace=monitoring",
        "--set", "monitoring.podMonitorsByDefault=true",
    )  # fmt: skip
    rule = one(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    from harness.schemas import validate_manifest

    validate_manifest(rule)  # the pinned Prometheus Operator CRD
    validate_manifest(one(render("--set", "metrics.serviceMonitor.enabled=true"), "ServiceMonitor"))
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    files = CHART / "files"
    assert rule["spec"] == yaml.safe_load((files / "prometheus-rules.yaml").read_text())
    (dashboard,) = [d for d in docs if d["metadata"]["name"].endswith("-dashboard")]
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    on_disk = json.loads((files / "dashboards" / "promptcache.json").read_text())
    assert json.loads(dashboard["data"]["promptcache.json"]) == on_disk
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--pod-monitors=true" in container["args"]
    (container,) = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert not [a for a in container["args"] if a.startswith("--pod-monitors")]


SCHEMA_PREFIX = (
    "Error: values don't meet the specifications of the schema(s) in the following chart(s):\n"
    "promptcache-operator:\n"
)

BAD_VALUES = [
    (("replicas=0",), "- at '/replicas': minimum: got 0, want 1"),
    (("replicas=two",), "- at '/replicas': got string, want integer"),
    (
        ("logLevel=verbose",),
        "- at '/logLevel': value must be one of 'debug', 'info', 'warning', 'error'",
    ),
    (("replicaCount=2",), "- at '': additional properties 'replicaCount' not allowed"),
    (
        ("watch.namespaces={Team_A}",),
        "- at '/watch/namespaces/0': 'Team_A' does not match pattern "
        "'^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$'",
    ),
    (("watch.namespaces={a,a}",), "- at '/watch/namespaces': items at 0 and 1 are equal"),
    (("watch.namespaces={123}",), "- at '/watch/namespaces/0': got number, want string"),
    (
        ("fullnameOverride=9lives",),
        "- at '/fullnameOverride': '9lives' does not match pattern "
        "'^([a-z]([-a-z0-9]*[a-z0-9])?)?$'",
    ),
    (("metrics.port=80",), "- at '/metrics/port': minimum: got 80, want 1,024"),
    (
        ("image.pullPolicy=Sometimes",),
        "- at '/image/pullPolicy': value must be one of 'Always', 'IfNotPresent', 'Never'",
    ),
    (
        ("image.digest=sha256:abc",),
        "- at '/image/digest': 'sha256:abc' does not match pattern '^(sha256:[a-f0-9]{64})?$'",
    ),
    (
        ("defaultImages.front.tag=has space",),
        "- at '/defaultImages/front/tag': 'has space' does not match pattern "
        "'^([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$'",
    ),
    (("modelServerUser=0",), "- at '/modelServerUser': minimum: got 0, want 1"),
    (
        ("metrics.serviceMonitor.interval=soon",),
        "- at '/metrics/serviceMonitor/interval': 'soon' does not match pattern '^([0-9]+(ms|s|m|h))+$'",
    ),
]


@pytest.mark.parametrize(("set_args", "message"), BAD_VALUES, ids=lambda v: str(v)[:40])
def test_bad_values_fail_with_the_path_and_the_rule(
    set_args: tuple[str, ...], message: str
) -> None:
    error = template_error(*set_args)
    assert error.startswith(SCHEMA_PREFIX), error
    assert message in error.splitlines(), error


@pytest.mark.parametrize(
    ("set_args", "message"),
    [
        (
            ("metrics.serviceMonitor.enabled=true", "metrics.service.enabled=false"),
            "metrics.serviceMonitor.enabled needs metrics.service.enabled: "
            "a ServiceMonitor scrapes through the metrics Service",
        ),
        (
            ("health.port=9090",),
            "health.port and metrics.port are both 9090: "
            "the operator serves them on separate ports",
        ),
        (
            ("serviceAccount.create=false",),
            "serviceAccount.name is required when serviceAccount.create is false",
        ),
        (
            ("bodyBasedRouter.modelList.enabled=true",),
            "bodyBasedRouter.modelList.enabled needs bodyBasedRouter.enabled",
        ),
    ],
)
def test_inconsistent_values_fail_with_a_sentence(set_args: tuple[str, ...], message: str) -> None:
    error = template_error(*set_args)
    assert message in error, error


def test_notes_tell_the_next_command() -> None:
    proc = install_assets.helm(
        "install", "promptcache-operator", str(CHART), "--namespace", "ops",
        "--dry-run=client", "--set", "watch.namespaces={team-a}",
    )  # fmt: skip
    notes = proc.stdout.split("NOTES:\n", 1)[1]
    assert "It watches namespaces: team-a." in notes
    assert "kubectl -n ops rollout status deployment/promptcache-operator" in notes
    assert "kubectl -n team-a get promptcachedeployments -w" in notes
    assert "namespace: team-a" in notes


@pytest.mark.parametrize("value_set", VALUE_SETS, ids=lambda p: p.stem)
def test_the_operator_accepts_the_charts_command_line(value_set: Path) -> None:
    """The chart's args parse with the real `promptcache` parser: flags cannot drift apart."""
    from promptcache.cli import build_parser

    docs = [
        d
        for d in render("-f", str(value_set))
        if not d["metadata"]["name"].endswith(("-bbr", "-models"))
    ]
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["promptcache"]
    args = build_parser().parse_args(container["args"])
    assert args.command == "run"
    values = yaml.safe_load(value_set.read_text()) or {}
    watched = values.get("watch", {}).get("namespaces", [])
    assert (args.namespaces or []) == watched
    assert args.all_namespaces is (not watched)
    assert args.log_level == values.get("logLevel", "info").upper()
    assert args.health_port == values.get("health", {}).get("port", 8080)
    assert args.metrics_port == values.get("metrics", {}).get("port", 9090)
    assert args.leader_election is True
    assert args.lease_name == "promptcache-operator"
    # The Lease lives where the chart's leader-election Role grants it: the release namespace.
    assert args.lease_namespace == "promptcache-system"


def test_body_based_router_is_off_by_default() -> None:
    docs = render()
    assert not [d for d in docs if "bbr" in d["metadata"]["name"]]


def test_body_based_router_runs_the_contracts_plugins_on_its_ports() -> None:
    from promptcache.contract.router import BBR_GRPC_PORT, BBR_HEALTH_PORT, BBR_PLUGINS

    docs = render("--set", "bodyBasedRouter.enabled=true")
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    bbr = deployments["promptcache-operator-bbr"]
    (container,) = bbr["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    plugins = [args[i + 1] for i, a in enumerate(args) if a == "--plugin"]
    assert tuple(plugins) == BBR_PLUGINS
    assert "env" not in container, "no NAMESPACE: every namespace's mapping ConfigMaps"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert (ports["grpc"], ports["grpc-health"]) == (BBR_GRPC_PORT, BBR_HEALTH_PORT)
    assert container["readinessProbe"]["grpc"]["port"] == BBR_HEALTH_PORT
    # The operator's own Service and Deployment must not select the router's pods.
    router_labels = bbr["spec"]["template"]["metadata"]["labels"]
    for d in docs:
        selector = (d.get("spec") or {}).get("selector")
        if d["metadata"]["name"].endswith("-bbr") or not isinstance(selector, dict):
            continue
        wanted = selector.get("matchLabels", selector)
        assert not wanted.items() <= router_labels.items(), d["metadata"]["name"]
    role = next(
        d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-bbr")
    )
    assert {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "verbs": ["get", "list", "watch"],
    } in role["rules"]


def test_body_based_router_in_one_namespace_gets_a_role_and_namespace() -> None:
    docs = render(
        "--set", "bodyBasedRouter.enabled=true", "--set", "bodyBasedRouter.allNamespaces=false"
    )
    bbr = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-bbr")
    )
    (container,) = bbr["spec"]["template"]["spec"]["containers"]
    assert [e["name"] for e in container["env"]] == ["NAMESPACE"]
    role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-bbr"))
    assert role["rules"][0]["resources"] == ["configmaps"]
    cluster_role = next(
        d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-bbr")
    )
    assert all("configmaps" not in r["resources"] for r in cluster_role["rules"])


def test_istio_wiring_puts_the_router_first_on_each_named_gateway() -> None:
    docs = render("-f", str(ROOT / "tests" / "chart" / "values" / "multi-model.yaml"))
    filters = [d for d in docs if d["kind"] == "EnvoyFilter"]
    assert [(f["metadata"]["namespace"], f["spec"]["targetRefs"][0]["name"]) for f in filters] == [
        ("gateways", "inference-gateway"),
        ("gateways", "internal"),
    ]
    patch = filters[0]["spec"]["configPatches"][0]["patch"]
    assert patch["operation"] == "INSERT_FIRST"
    cluster = patch["value"]["typed_config"]["grpc_service"]["envoy_grpc"]["cluster_name"]
    assert cluster == "outbound|9004||promptcache-operator-bbr.promptcache-system.svc.cluster.local"
    assert len([d for d in docs if d["kind"] == "DestinationRule"]) == 2


def _model_list(*extra: str) -> list[dict[str, Any]]:
    return [
        d
        for d in render(
            "--set",
            "bodyBasedRouter.enabled=true",
            "--set",
            "bodyBasedRouter.modelList.enabled=true",
            "--set",
            "bodyBasedRouter.modelList.gateways[0].name=shared",
            "--set",
            "bodyBasedRouter.modelList.gateways[0].namespace=gateways",
            *extra,
        )
        if d["metadata"]["name"].startswith("promptcache-operator-models")
    ]


def test_model_list_is_off_by_default_and_with_the_router_alone() -> None:
    assert not [d for d in render() if "models" in d["metadata"]["name"]]
    docs = render("--set", "bodyBasedRouter.enabled=true")
    assert not [d for d in docs if "models" in d["metadata"]["name"]]


def test_model_list_runs_the_catalog_command_on_the_contracts_ports() -> None:
    """The responder's args parse with the real `promptcache` parser, on the contract's
    ports, reading what the operator watches; it may only read the resources."""
    from promptcache.cli import build_parser
    from promptcache.contract.router import CATALOG_HEALTH_PORT, CATALOG_PORT

    docs = _model_list()
    deployment = one(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["promptcache"]
    args = build_parser().parse_args(container["args"])
    assert args.command == "catalog"
    assert args.all_namespaces
    assert (args.port, args.health_port) == (CATALOG_PORT, CATALOG_HEALTH_PORT)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": CATALOG_PORT, "health": CATALOG_HEALTH_PORT}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert one(docs, "ClusterRole")["rules"] == [
        {
            "apiGroups": ["serving.promptcache.io"],
            "resources": ["promptcachedeployments"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    assert one(docs, "ClusterRoleBinding")["roleRef"]["name"] == "promptcache-operator-models"
    service = one(docs, "Service")
    assert service["spec"]["selector"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )


def test_model_list_reads_only_the_watched_namespaces() -> None:
    from promptcache.cli import build_parser

    docs = _model_list("--set", "watch.namespaces={team-a,team-b}")
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert build_parser().parse_args(container["args"]).namespaces == ["team-a", "team-b"]
    bindings = [d for d in docs if d["kind"] == "RoleBinding"]
    assert [b["metadata"]["namespace"] for b in bindings] == ["team-a", "team-b"]
    assert not [d for d in docs if d["kind"] == "ClusterRoleBinding"]


def test_model_list_routes_outrank_and_underrank_the_resources_routes() -> None:
    """Per Gateway, GET on the exact path (which outranks a resource's `PathPrefix /` with a
    header) and a bare `PathPrefix /` (which a resource's rule outranks by its header), both
    naming the Gateway in the contract's header; the catch-all can be left out."""
    from promptcache.contract.router import CATALOG_PORT, GATEWAY_HEADER, MODELS_PATH

    (route,) = [d for d in _model_list() if d["kind"] == "HTTPRoute"]
    assert route["metadata"]["namespace"] == "promptcache-system"
    assert route["spec"]["parentRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "shared",
         "namespace": "gateways"}
    ]  # fmt: skip
    exact, rest = route["spec"]["rules"]
    assert exact["matches"] == [{"path": {"type": "Exact", "value": MODELS_PATH}, "method": "GET"}]
    assert rest["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    for rule in (exact, rest):
        (mod,) = rule["filters"]
        assert mod["requestHeaderModifier"] == {
            "set": [{"name": GATEWAY_HEADER, "value": "gateways/shared"}]
        }
        assert rule["backendRefs"] == [
            {"name": "promptcache-operator-models", "port": CATALOG_PORT}
        ]
    (only,) = [
        d
        for d in _model_list(
            "--set",
            "bodyBasedRouter.modelList.unknownModels=false",
            "--set",
            "bodyBasedRouter.modelList.gateways[0].sectionName=https",
        )
        if d["kind"] == "HTTPRoute"
    ]
    (rule,) = only["spec"]["rules"]
    assert rule["matches"][0]["path"]["type"] == "Exact"
    assert rule["filters"][0]["requestHeaderModifier"]["set"][0]["value"] == "gateways/shared/https"
    assert only["spec"]["parentRefs"][0]["sectionName"] == "https"

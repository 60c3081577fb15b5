"""The project's CRD, applied to a real API server, accepts the examples and rejects bad input
with the exact message a user sees from `kubectl apply`.

The corpus lives in testdata/invalid-pcd/: one manifest per mistake, each naming in
`# expect:` lines every error the API server must report (schema, enum, bound, or CEL rule),
and nothing else. A rejected object must not have been created.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes.client.exceptions import ApiException

from harness import pod_template_cases
from harness.operator import wait_established
from harness.pytest_cluster import Cluster
from promptcache.api import InvalidResourceError, parse_resource
from promptcache.api.rules import default_max_loras
from promptcache.loading import load_resources
from promptcache.render import render

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "serving.promptcache.io_promptcachedeployments.yaml"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
INVALID = sorted((Path(__file__).resolve().parent / "testdata" / "invalid-pcd").glob("*.yaml"))
CRD_NAME = "promptcachedeployments.serving.promptcache.io"


@pytest.fixture(scope="module")
def crd(cluster: Cluster) -> str:
    """Install (server-side apply, as a user or the chart would) and wait for Established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    wait_established(cluster.kubectl, CRD_NAME)
    return CRD_NAME


def expected_errors(path: Path) -> list[str]:
    return [
        line.split("# expect:", 1)[1].strip()
        for line in path.read_text().splitlines()
        if line.startswith("# expect:")
    ]


def reported_errors(stderr: str) -> list[str]:
    """The individual causes in kubectl's rejection message.

    One cause:   'The PromptCacheDeployment "bad" is invalid: <cause>'
    Several:     '... is invalid: [<cause>, <cause>]' or a '* <cause>' list, per kubectl version.
    Strict decoding errors: 'Error from server (BadRequest): ... strict decoding error: ...'.
    """
    text = stderr.strip()
    if "strict decoding error:" in text:
        return [text[text.index("strict decoding error:") :].strip()]
    m = re.search(r"is invalid: (.*)\Z", text, re.S)
    assert m, f"not a validation error: {text}"
    body = m.group(1).strip()
    if body.startswith("* ") or "\n* " in body:
        return [c.strip() for c in re.split(r"^\* ", body, flags=re.M) if c.strip()]
    if body.startswith("[") and body.endswith("]"):
        return [c.strip() for c in body[1:-1].split(", spec.")]
    return [body]


def test_corpus_is_big_enough_and_covers_each_cel_rule() -> None:
    """Guards the corpus itself: >= 10 cases, and every CEL rule of the CRD has one."""
    assert len(INVALID) >= 10
    crd_doc = yaml.safe_load(CRD.read_text())
    messages: list[str] = []

    def walk(schema: dict[str, Any]) -> None:
        messages.extend(r["message"] for r in schema.get("x-kubernetes-validations", []))
        for sub in schema.get("properties", {}).values():
            walk(sub)
        if isinstance(schema.get("items"), dict):
            walk(schema["items"])

    for version in crd_doc["spec"]["versions"]:
        walk(version["schema"]["openAPIV3Schema"])
    assert messages, "the CRD has CEL rules"
    corpus = "\n".join(e for p in INVALID for e in expected_errors(p))
    uncovered = [m for m in messages if m not in corpus]
    assert uncovered == [], f"CEL rules without a corpus case: {uncovered}"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_examples_are_accepted_and_defaulted(
    cluster: Cluster, crd: str, namespace: str, example: Path
) -> None:
    doc = yaml.safe_load(example.read_text())
    doc["metadata"]["namespace"] = namespace
    cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))
    stored = cluster.get_json("promptcachedeployment", doc["metadata"]["name"], "-n", namespace)
    assert stored["spec"]["model"] == {**stored["spec"]["model"], **doc["spec"]["model"]}
    # Structural defaults from the schema are applied by the API server itself.
    assert stored["spec"]["engine"]["blockSize"] == doc["spec"].get("engine", {}).get(
        "blockSize", 16
    )
    assert stored["spec"]["isolation"]["mode"] == doc["spec"].get("isolation", {}).get(
        "mode", "PerKey"
    )
    assert stored["spec"]["front"]["enabled"] is True


def test_scale_subresource_drives_model_replicas(
    cluster: Cluster, crd: str, namespace: str
) -> None:
    doc = yaml.safe_load((ROOT / "examples" / "minimal.yaml").read_text())
    doc["metadata"]["namespace"] = namespace
    cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))
    name = doc["metadata"]["name"]
    cluster.kubectl("scale", "promptcachedeployment", name, "-n", namespace, "--replicas=5")
    stored = cluster.get_json("pcd", name, "-n", namespace)
    assert stored["spec"]["model"]["replicas"] == 5


@pytest.mark.parametrize("case", INVALID, ids=lambda p: p.stem)
def test_invalid_manifest_is_rejected_with_its_message(
    cluster: Cluster, crd: str, namespace: str, case: Path
) -> None:
    expected = expected_errors(case)
    assert expected, f"{case.name} has no '# expect:' line"
    out = cluster.kubectl("apply", "-n", namespace, "-f", str(case), check=False)
    assert out.returncode != 0, f"{case.name} was accepted:\n{out.stdout}"
    assert sorted(reported_errors(out.stderr)) == sorted(expected), out.stderr
    name = yaml.safe_load(case.read_text())["metadata"]["name"]
    missing = cluster.kubectl("get", "pcd", name, "-n", namespace, check=False)
    assert missing.returncode != 0
    assert "NotFound" in missing.stderr


_NAME_CHARS = "abcXYZ019.!#_-~`|'*+^$%& :/\"@\t"


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    header=st.text(alphabet=_NAME_CHARS, max_size=10),
    field=st.text(alphabet=_NAME_CHARS, max_size=10),
)
def test_the_api_server_and_the_cli_agree_on_header_and_field_names(
    cluster: Cluster, crd: str, namespace: str, header: str, field: str
) -> None:
    """The CRD pattern and the contract's grammar (API models, front, shim) accept the same
    names: a name `promptcache render` refuses, the API server refuses, and the reverse."""
    doc = {
        "apiVersion": "serving.promptcache.io/v1alpha1",
        "kind": "PromptCacheDeployment",
        "metadata": {"name": "names", "namespace": namespace},
        "spec": {"model": {"name": "m"}, "isolation": {"header": header, "bodyField": field}},
    }
    try:
        load_resources(json.dumps(doc), source="generated")
        cli_accepts = True
    except InvalidResourceError:
        cli_accepts = False
    out = cluster.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=json.dumps(doc), check=False
    )
    assert (out.returncode == 0) is cli_accepts, (header, field, out.stderr)


# Spellings of vLLM flags: each is refused or accepted identically by the API server (RE2 in
# CEL) and by the CLI (Python `re`), with the same messages.
EXTRA_ARG_SPELLINGS = [
    "--port",
    "--port=9000",
    "--po",
    "--no-enable-prefix-caching",
    "--no_enable_prefix_caching",
    "--enable-prefix",
    "--served_model_name=x",
    "--block-size.x",
    "-tp",
    "-tp=2",
    "-t",
    "-asc",
    "--config",
    "--model=x",
    "--disable-log-stats",
    "--max-num-batched-tokens 8",
    "--max-num-batched-tokens=8 x",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--model-impl",
    "--config-format",
    "--no-enable-chunked-prefill",
    "-pp",
    "-O3",
    "--speculative-config.num_speculative_tokens=3",
    "--port\n",
    "'",
    "\\",
]


def test_api_server_and_cli_agree_on_every_extra_arg_spelling(
    cluster: Cluster, crd: str, namespace: str
) -> None:
    for arg in EXTRA_ARG_SPELLINGS:
        doc = {
            "apiVersion": "serving.promptcache.io/v1alpha1",
            "kind": "PromptCacheDeployment",
            "metadata": {"name": "spelling", "namespace": namespace},
            "spec": {"model": {"name": "m"}, "engine": {"extraArgs": [arg]}},
        }
        try:
            parse_resource(doc)
            cli = []
        except InvalidResourceError as error:
            cli = sorted((p.path, p.message) for p in error.problems)
        try:
            cluster.custom.create_namespaced_custom_object(
                "serving.promptcache.io", "v1alpha1", namespace, "promptcachedeployments", doc,
                dry_run="All",
            )  # fmt: skip
            server = []
        except ApiException as error:
            causes = json.loads(error.body)["details"]["causes"]
            server = sorted(
                (c["field"], re.sub(r'^Invalid value: ("[a-z]+": )?', "", c["message"]))
                for c in causes
            )
        assert server == cli, arg


POD_TEMPLATE_KINDS = sorted(pod_template_cases.KINDS)


@pytest.mark.parametrize("where", ["model", "gateway"])
@pytest.mark.parametrize("kind", POD_TEMPLATE_KINDS)
def test_each_pod_template_override_is_stored_and_its_pod_accepted(
    cluster: Cluster, crd: str, namespace: str, kind: str, where: str
) -> None:
    """The API server stores the overlay as written, and accepts the Deployment the renderer
    merges it into (its own PodSpec validation: affinity, spread, volumes, ...)."""
    overlay, path, expected = pod_template_cases.KINDS[kind]
    doc = pod_template_cases.resource(where, overlay)
    doc["metadata"] = {"name": f"pt-{where}-{kind.lower()}", "namespace": namespace}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))
    stored = cluster.get_json("pcd", doc["metadata"]["name"], "-n", namespace)
    assert stored["spec"][where]["podTemplate"] == overlay
    component = "model-server" if where == "model" else "endpoint-picker"
    deployment = next(
        m for m in render(parse_resource(stored))
        if m["kind"] == "Deployment"
        and m["metadata"]["labels"]["app.kubernetes.io/component"] == component
    )  # fmt: skip
    out = cluster.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-",
                          input=json.dumps(deployment))  # fmt: skip
    node: Any = json.loads(out.stdout)["spec"]["template"]
    for key in path:
        node = node[key]
    assert node == expected or (isinstance(expected, list) and node[: len(expected)] == expected)


def _server_and_cli(cluster: Cluster, namespace: str, doc: dict[str, Any]) -> tuple[list, list]:
    """(API server causes, CLI problems) for `doc`, as (field, message) pairs."""
    try:
        parse_resource(doc)
        cli = []
    except InvalidResourceError as error:
        cli = sorted((p.path, p.message) for p in error.problems)
    try:
        cluster.custom.create_namespaced_custom_object(
            "serving.promptcache.io", "v1alpha1", namespace, "promptcachedeployments", doc,
            dry_run="All",
        )  # fmt: skip
        server = []
    except ApiException as error:
        causes = json.loads(error.body)["details"]["causes"]
        server = sorted(
            (c["field"], re.sub(r'^Invalid value: ("[a-z]+": )?', "", c["message"])) for c in causes
        )
    return server, cli


@pytest.mark.parametrize("gpus", [0, 1])
@pytest.mark.parametrize("adapters", [1, 3, 9])
def test_the_derived_lora_slots_agree_at_the_boundary(
    cluster: Cluster, crd: str, namespace: str, gpus: int, adapters: int
) -> None:
    """maxCpuLoras is checked against maxLoras's default, which depends on the adapters and
    on CPU vs GPU: CEL and Python derive the same default (accepted at it, refused below)."""
    floor = max(default_max_loras(adapters, gpus), adapters)
    for cpu, refused in ((floor, False), (floor - 1, True)):
        if cpu < 1:
            continue
        doc = {
            "apiVersion": "serving.promptcache.io/v1alpha1",
            "kind": "PromptCacheDeployment",
            "metadata": {"name": "slots", "namespace": namespace},
            "spec": {
                "model": {
                    "name": "m",
                    "resources": {"gpus": gpus},
                    "adapters": [
                        {"name": f"a{i}", "path": f"/model-cache/a{i}"} for i in range(adapters)
                    ],
                },
                "engine": {"maxCpuLoras": cpu},
            },
        }
        server, cli = _server_and_cli(cluster, namespace, doc)
        assert server == cli, (gpus, adapters, cpu)
        assert bool(server) is refused, (gpus, adapters, cpu, server)


@pytest.mark.parametrize(
    ("path", "mount", "accepted"),
    [
        ("/adapters/sql", "/adapters", True),
        ("/adapters/sql", "/adapters/", True),
        ("/adapters", "/adapters", True),
        ("/adaptersx/sql", "/adapters", False),
        ("/adapters/../etc", "/adapters", False),
        ("/model-cache/sql", "/elsewhere", True),
        ("/model-cachex/sql", "/elsewhere", False),
    ],
)
def test_adapter_paths_on_mounted_volumes_agree(
    cluster: Cluster, crd: str, namespace: str, path: str, mount: str, accepted: bool
) -> None:
    doc = {
        "apiVersion": "serving.promptcache.io/v1alpha1",
        "kind": "PromptCacheDeployment",
        "metadata": {"name": "paths", "namespace": namespace},
        "spec": {
            "model": {
                "name": "m",
                "adapters": [{"name": "a", "path": path}],
                "podTemplate": {
                    "spec": {
                        "volumes": [{"name": "ad", "emptyDir": {}}],
                        "containers": [
                            {"name": "vllm", "volumeMounts": [{"name": "ad", "mountPath": mount}]}
                        ],
                    }
                },
            }
        },
    }
    server, cli = _server_and_cli(cluster, namespace, doc)
    assert server == cli
    assert (server == []) is accepted, server

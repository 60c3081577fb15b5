"""The operator image, run as the chart runs it: what a user's cluster would execute.

Each test starts a container of `localhost/promptcache-operator:<version>` (built or reused
by `scripts/images`; scripts/test builds it before pytest) with the user, read-only root,
dropped capabilities and volumes of the chart's own Deployment (`harness.images`), and
compares what it does with what this checkout does. A missing file, a dependency left out
of an extra, an entrypoint or a permission the read-only root refuses fails here.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from harness.images import PodRun, built_image, chart_operator_pod, pod_container
from harness.net import free_port
from harness.waiting import wait_for_line
from promptcache import __version__
from promptcache.api import OperatorDefaults
from promptcache.contract import GatewayPolicyEnv, PickerTarget
from promptcache.loading import load_resources
from promptcache.render import render

pytestmark = pytest.mark.images

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
CRD = ROOT / "crds" / "serving.promptcache.io_promptcachedeployments.yaml"
STARTED_LINE = "gateway policy step listening on"


@pytest.fixture(scope="module")
def operator_pod(tmp_path_factory: pytest.TempPathFactory) -> PodRun:
    pod, container = chart_operator_pod()
    image = built_image("operator").ref
    return PodRun(image, pod, container, tmp_path_factory.mktemp("operator-pod"))


def test_the_chart_runs_it_hardened(operator_pod: PodRun) -> None:
    """What the runs below rely on: the chart's pod is the restricted one, not podman's."""
    flags = operator_pod.security_flags() + operator_pod.volume_flags()
    assert "--read-only" in flags
    assert "--read-only-tmpfs=false" in flags
    assert "--cap-drop=ALL" in flags
    assert "--security-opt=no-new-privileges" in flags
    assert any(f.startswith("--tmpfs=/tmp:") for f in flags)
    # No runAsUser in the chart: the image's numeric USER is the one that runs.
    whoami = operator_pod.run(["-u"], command=["id"], timeout=120)
    assert whoami.returncode == 0, whoami.stderr.decode()
    assert whoami.stdout.decode().strip() == "65532"


def test_version(operator_pod: PodRun) -> None:
    done = operator_pod.run(["version"], timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == __version__


def test_crd_is_byte_identical_to_crds(operator_pod: PodRun) -> None:
    done = operator_pod.run(["crd"], timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == CRD.read_bytes()


def _checkout_render(example: Path) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "operator")}
    return subprocess.run(
        [sys.executable, "-m", "promptcache.cli", "render", "-f", "-"],
        input=example.read_bytes(),
        env=env,
        capture_output=True,
        timeout=120,
        check=True,
    )


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_render_of_every_example_is_the_checkouts(operator_pod: PodRun, example: Path) -> None:
    done = operator_pod.run(["render", "-f", "-"], stdin=example.read_bytes(), timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout, "the image rendered nothing"
    assert done.stdout == _checkout_render(example).stdout


def test_gateway_policy_step_starts_and_answers_health(tmp_path: Path) -> None:
    """The EPP pod's `gateway-policy` container, from the image, as rendered for minimal.yaml
    under an operator whose default picker is llm-d-router (promptcache's has no step).

    Only what cannot be shared on one host changes: its ports (host network, free ports)
    and its upstream (nothing listens there; health does not need the picker). The salt
    Secret is mounted with the rendered mode and the pod's ownership, as the kubelet does.
    """
    (pcd,) = load_resources((ROOT / "examples" / "minimal.yaml").read_text(), source="minimal")
    router = OperatorDefaults(picker=PickerTarget.LLM_D_ROUTER)
    pod, container = pod_container(render(pcd, router), "gateway-policy")
    (salt_mount,) = container["volumeMounts"]
    listen, metrics = free_port(), free_port()
    run = PodRun(
        built_image("operator").ref,
        pod,
        container,
        tmp_path,
        files={salt_mount["name"]: {"salt-key": secrets.token_hex(32).encode()}},
        env={
            GatewayPolicyEnv.LISTEN: f"127.0.0.1:{listen}",
            GatewayPolicyEnv.METRICS_LISTEN: f"127.0.0.1:{metrics}",
            GatewayPolicyEnv.UPSTREAM: f"127.0.0.1:{free_port()}",
        },
        network="host",
    )
    log = tmp_path / "gateway-policy.log"
    proc = run.start(log)
    try:
        wait_for_line(log, STARTED_LINE, proc, within_s=120)
        # The rendered probes: a TCP connection to the gRPC port.
        with socket.create_connection(("127.0.0.1", listen), timeout=10):
            pass
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10) as r:
            assert r.status == 200
            assert b"promptcache" in r.read()
    finally:
        run.remove()
        proc.wait(timeout=60)

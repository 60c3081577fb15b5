"""promptcache's picker *from its image*, as the rendered picker pod runs it.

The container is the rendered `epp` one (`harness.epp.image`): the image's non-root user,
a read-only root, every capability dropped, its config and salt key from the rendered
ConfigMap and Secret volumes, the rendered ServiceAccount's credentials. It reads the pool
on the local control plane, routes by prefix and derives the tenant's salt as the binary
the other picker tests run does (which `tests/images/test_picker_image.py` shows is the
very same file as the image's).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.epp.extproc import chat_body
from harness.epp.image import EppFromImage
from harness.epp.launch import Launcher, routing_patch
from harness.epp.pool import PoolOnCluster
from harness.epp.scenarios import index_grows, prefixed, unique_text
from promptcache.contract import DEFAULT_ISOLATION_HEADER, PickerTarget
from promptcache.tenancy.salt import derive_salt
from tools.images import podman_env

pytestmark = [pytest.mark.epp, pytest.mark.cluster, pytest.mark.images]

KEY = DEFAULT_ISOLATION_HEADER
READY_TIMEOUT_S = 120  # podman's container start, then the picker's self-signed key


@pytest.fixture
def pool(cluster: Any, namespace: str, tmp_path: Path) -> Iterator[PoolOnCluster]:
    launcher = Launcher(cluster, namespace, tmp_path, PickerTarget.PROMPTCACHE)
    patch = routing_patch(replicas=2, with_front=True)
    patch["isolation"] = {"mode": "PerKey"}
    try:
        pool = launcher(spec_patch=patch, start_epp=False)
        run_dir = tmp_path / "epp-image"
        run_dir.mkdir()
        pool.epp = EppFromImage(
            pool.rendered, pool.salt_key, pool.service_account_kubeconfig(), run_dir
        ).start()
        pool.epp.wait_ready(READY_TIMEOUT_S)
        pool.wait_scraped()
        yield pool
    finally:
        launcher.close()


def _process_users(epp: EppFromImage) -> list[str]:
    """The user of each process in the container, by podman (no `id` in a static image)."""
    top = subprocess.run(
        ["podman", "top", epp.run.name, "huser", "args"],
        env=podman_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()[1:]
    return [line.split()[0] for line in top if line.strip()]


def test_the_picker_image_routes_by_prefix_and_salts_as_rendered(pool: PoolOnCluster) -> None:
    assert isinstance(pool.epp, EppFromImage)
    assert pool.shim is None, "promptcache's picker renders no policy step"
    # It runs as the image's non-root user (the pod sets none), never as root.
    assert _process_users(pool.epp) == ["65532"]
    system = unique_text(2400)
    with pool.client() as gateway:
        with index_grows(pool.epp):
            first = gateway.pick(
                chat_body(prefixed(system), cache_salt="forged"), headers={KEY: "a"}
            )
        assert pool.by_endpoint(first.endpoint) is not None, first.endpoint
        forwarded = json.loads(first.body)
        # The salt comes from the rendered Secret, as the fronts derive it; the client's is gone.
        assert forwarded["cache_salt"] == derive_salt(pool.salt_key, "a")
        for _ in range(4):  # the tenant's next turns follow its prefix
            pick = gateway.pick(chat_body(prefixed(system)), headers={KEY: "a"})
            assert pick.endpoint == first.endpoint, pool.epp.log_tail()

"""The picker image ships the binary every picker test runs, and nothing a shell needs.

Why byte-for-byte: the picker e2e tests (tenant routing, LoRA affinity, the body-based
router, the real-engine routing) run the binary `e2e/cluster build` caches, not a
container. The image's build stage compiles the same module with the same Go, flags and
`go.sum` (`-trimpath`, no cgo), so the two files must be one: then everything those tests
prove holds for what a user pulls. A difference (another Go, a flag, a stale cache) fails
here, naming both digests.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from harness.epp.binary import find_epp_binary, missing_reason
from harness.images import built_image
from promptcache.contract import PickerTarget
from tools.images import podman_env

pytestmark = pytest.mark.images


def _podman(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["podman", *args], env=podman_env(), capture_output=True, check=False)


def test_the_image_ships_the_binary_the_picker_tests_run(tmp_path: Path) -> None:
    tested = find_epp_binary(PickerTarget.PROMPTCACHE)
    assert tested is not None, missing_reason(PickerTarget.PROMPTCACHE)
    created = _podman("create", built_image("picker").ref)
    assert created.returncode == 0, created.stderr
    container = created.stdout.decode().strip()
    try:
        copied = _podman("cp", f"{container}:/epp", str(tmp_path / "epp"))
        assert copied.returncode == 0, copied.stderr
    finally:
        _podman("rm", container)
    shipped = hashlib.sha256((tmp_path / "epp").read_bytes()).hexdigest()
    ran = hashlib.sha256(tested.read_bytes()).hexdigest()
    assert shipped == ran, f"the image's /epp is {shipped}, the tested {tested} is {ran}"


def test_the_image_runs_as_nonroot_with_nothing_but_the_picker() -> None:
    ref = built_image("picker").ref
    user = _podman("image", "inspect", "--format", "{{.Config.User}}", ref)
    assert user.stdout.decode().strip() == "65532:65532"
    # No shell to exec into: a static base.
    shell = _podman("run", "--rm", "--entrypoint=/bin/sh", ref, "-c", "true")
    assert shell.returncode != 0
    # The entrypoint is the picker, and it starts on a read-only root with no capability.
    helped = _podman("run", "--rm", "--read-only", "--cap-drop=ALL", ref, "--help")
    assert b"--config-file" in helped.stdout + helped.stderr

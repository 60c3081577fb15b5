"""`scripts/images` itself: bad machines get one line, failed builds leave no tag, and the
release publishes exactly the targets built and tested here."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from tools.images import TARGETS, ImagesError, podman_env
from tools.images import build as images_build
from tools.images.base import ensure_base
from tools.images.host import Progress, host_ulimits

ROOT = Path(__file__).resolve().parents[2]


def test_without_apt_or_podman_it_says_so_in_one_line(tmp_path: Path) -> None:
    """A PATH with python alone: no podman to use and no apt-get to install it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    for tool in ("bash", "dirname"):  # what the script's own first lines run
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    done = subprocess.run(
        [str(ROOT / "scripts" / "images")],
        env={"PATH": str(bin_dir), "HOME": str(tmp_path), "PROMPTCACHE_CACHE_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "no apt-get" in lines[0]
    assert "podman" in lines[0]
    assert "run scripts/images again" in lines[0]


def test_ulimits_stay_within_the_hosts() -> None:
    import resource

    limits = host_ulimits()
    assert 0 < limits["nofile"] <= resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert 0 < limits["nproc"] <= resource.getrlimit(resource.RLIMIT_NPROC)[1]


def test_the_release_publishes_the_targets_built_here() -> None:
    """Same Dockerfile (the default one, context `.`), same targets: what is tested ships."""
    release = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yaml").read_text())
    job = release["jobs"]["images"]
    assert tuple(job["strategy"]["matrix"]["target"]) == TARGETS
    (build,) = [s for s in job["steps"] if s.get("uses", "").startswith("docker/build-push")]
    assert build["with"]["context"] == "."
    assert build["with"]["target"] == "${{ matrix.target }}"
    # No Dockerfile of its own and no build argument scripts/images does not pass too.
    assert "file" not in build["with"]
    assert "build-args" not in build["with"]


def test_the_context_is_what_dockerignore_lets_in() -> None:
    files = {p.relative_to(ROOT).parts[0] for p in images_build.context_files()}
    assert files == {"pyproject.toml", "README.md", "operator", "picker"}
    assert not any(p.parts[:2] == ("picker", "testvectors") for p in images_build.context_files())
    assert not any("__pycache__" in p.parts for p in images_build.context_files())


@pytest.mark.images
def test_a_failed_build_leaves_no_tag(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The build fails in its last step: neither the real tag nor the temporary one remains."""
    context = tmp_path / "context"
    context.mkdir()
    for name in (".dockerignore", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, context / name)
    (context / "operator" / "promptcache").mkdir(parents=True)
    shutil.copy(ROOT / "operator/promptcache/_version.py", context / "operator/promptcache")
    (context / "Dockerfile").write_text(
        "ARG PYTHON_IMAGE=none\nFROM ${PYTHON_IMAGE} AS operator\nRUN echo half > /half\nRUN false\n"
    )
    registry = f"localhost/promptcache-test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(images_build, "ROOT", context)
    monkeypatch.setattr(images_build, "LOCAL_REGISTRY", registry)
    progress = Progress(quiet=True)
    base = ensure_base(progress)
    with pytest.raises(ImagesError, match="failed"):
        images_build.build_target("operator", {"python": base}, images_build.PYPI_INDEX, progress)
    listed = subprocess.run(
        ["podman", "images", "--format", "{{.Repository}}:{{.Tag}}"],
        env=podman_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert registry not in listed


@pytest.mark.images
def test_a_second_run_reuses_every_image() -> None:
    """Warm: nothing is built (the cost scripts/test pays on every run after the first)."""
    progress = Progress(quiet=True)
    images_build.ensure_images(TARGETS, progress)
    again = Progress(quiet=True)
    images = images_build.ensure_images(TARGETS, again)
    assert [name for name, _ in again.durations] == []
    assert set(images) == set(TARGETS)
    for built in images.values():
        label = subprocess.run(
            [
                "podman",
                "image",
                "inspect",
                "--format",
                '{{index .Labels "io.promptcache.inputs"}}',
                built.ref,
            ],
            env=podman_env(),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert label == built.inputs


@pytest.mark.images
def test_a_podman_that_cannot_run_containers_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Podman's own default here (ulimits over the host's): the probe says so and what to do."""
    from tools.images import host

    base = ensure_base(Progress(quiet=True))
    monkeypatch.setattr(host, "STATE", tmp_path)  # a containers.conf of its own
    monkeypatch.setattr(host, "host_ulimits", lambda: {"nofile": 1 << 30, "nproc": 1 << 30})
    with pytest.raises(ImagesError) as caught:
        host.probe(base)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("podman cannot run a container here (")
    assert "rlimit" in message
    assert "then run scripts/images again" in message

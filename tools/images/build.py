"""Every image target of the `Dockerfile`, built with podman, cached by its inputs.

An image's inputs are the Dockerfile, the build context (what `.dockerignore` lets in), the
base image and the build arguments; their hash is the image's `io.promptcache.inputs`
label. A target whose tag already carries the hash of today's inputs is not built again.

A build goes to a temporary tag and gets the real one only when it succeeded, so no run
(stopped, failed or killed) leaves a tag that a later run takes for complete.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import ssl
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.images.base import ensure_base
from tools.images.host import (
    ROOT,
    STATE,
    ImagesError,
    Progress,
    ensure_tools,
    locked,
    podman,
    podman_streamed,
    probe,
)
from tools.images.picker_bases import build_mounts, ensure_go_image, ensure_static_base

# The Dockerfile's image targets, as the release workflow publishes them (a test holds the
# two to each other); each is published as promptcache-<target>.
TARGETS = ("operator", "front", "picker")
LOCAL_REGISTRY = "localhost"
INPUTS_LABEL = "io.promptcache.inputs"
TORCH_LABEL = "io.promptcache.torch-index"
PYPI_INDEX = "https://pypi.org/simple"
# The machine's CA bundle, mounted read-only into each build step that runs pip, so pip
# trusts what this machine trusts; a mount leaves nothing in the image.
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# Bumped when the way an image is built changes outside the inputs hashed below.
SCHEME = "1"


@dataclass(frozen=True)
class Built:
    """One image as built here: its local reference and what it was built from."""

    target: str
    ref: str
    inputs: str
    torch_index: str
    size_bytes: int


def version() -> str:
    text = (ROOT / "operator" / "promptcache" / "_version.py").read_text()
    match = re.search(r'^__version__ = "([^"]+)"$', text, re.MULTILINE)
    if match is None:
        raise ImagesError("operator/promptcache/_version.py names no __version__")
    return match.group(1)


def local_ref(target: str) -> str:
    return f"{LOCAL_REGISTRY}/promptcache-{target}:{version()}"


def context_files() -> list[Path]:
    """The files the build context holds: `.dockerignore`'s `!` lines, less its excludes."""
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    included = [line[1:].rstrip("/") for line in lines if line.startswith("!")]
    excluded = [line.removeprefix("**/") for line in lines if not line.startswith("!")]
    files: list[Path] = []
    for name in included:
        path = ROOT / name
        candidates = sorted(path.rglob("*")) if path.is_dir() else [path]
        for candidate in candidates:
            parts = candidate.relative_to(ROOT).parts
            if candidate.is_file() and not any(
                fnmatch.fnmatch(part, pattern)
                for part in parts
                for pattern in excluded
                if pattern != "*"
            ):
                files.append(candidate)
    return files


def build_args(target: str, bases: dict[str, str], torch_index: str) -> dict[str, str]:
    """The build arguments a target's stages read: its base images, and torch's index."""
    if target == "picker":
        return {"GO_IMAGE": bases["go"], "PICKER_BASE_IMAGE": bases["static"]}
    args = {"PYTHON_IMAGE": bases["python"]}
    if target == "front":  # the only target whose stages read TORCH_INDEX_URL
        args["TORCH_INDEX_URL"] = torch_index
    return args


def inputs_key(target: str, args: dict[str, str]) -> str:
    digest = hashlib.sha256()
    head = {"scheme": SCHEME, "target": target, **args}
    digest.update(json.dumps(head, sort_keys=True).encode())
    digest.update((ROOT / "Dockerfile").read_bytes())
    for path in context_files():
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def dockerfile_torch_index() -> str:
    match = re.search(r"^ARG TORCH_INDEX_URL=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M)
    if match is None:
        raise ImagesError("the Dockerfile has no `ARG TORCH_INDEX_URL=...` default")
    return match.group(1)


def choose_torch_index(progress: Progress) -> str:
    """The Dockerfile's (CPU) torch index when reachable, else PyPI's, said out loud."""
    chosen = os.environ.get("PROMPTCACHE_TORCH_INDEX_URL")
    if chosen:
        return chosen
    default = dockerfile_torch_index()
    try:
        context = ssl.create_default_context(cafile=str(CA_BUNDLE) if CA_BUNDLE.exists() else None)
        with urllib.request.urlopen(f"{default}/torch/", timeout=10, context=context):  # noqa: S310
            return default
    except (urllib.error.URLError, OSError, ValueError):
        progress.say(
            f"front: {default} is unreachable here, so torch comes from PyPI, whose build "
            "carries the CUDA libraries (a release uses the CPU build; README, Images)"
        )
        return PYPI_INDEX


def _label(ref: str, name: str) -> str | None:
    done = podman(
        "image", "inspect", "--format", f'{{{{index .Labels "{name}"}}}}', ref, check=False
    )
    return done.stdout.strip() if done.returncode == 0 else None


def _image_id(ref: str) -> str | None:
    done = podman("image", "inspect", "--format", "{{.Id}}", ref, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def _size(ref: str) -> int:
    return int(podman("image", "inspect", "--format", "{{.Size}}", ref).stdout.strip())


def _relabel(ref: str, key: str) -> None:
    """Give REF today's inputs label, where podman's layer cache kept yesterday's.

    Why: when a change of the inputs touches no layer of a target (the README, which the
    picker's stages never copy), every step is a cache hit and podman hands back the cached
    image with the label of the build that made it, ignoring `--label`; a later run would
    then rebuild it forever. A `LABEL` instruction on top is a new configuration, no new
    layer, and costs a second.
    """
    with tempfile.TemporaryDirectory(dir=STATE, prefix="relabel-") as tmp:
        (Path(tmp) / "Containerfile").write_text(f"FROM {ref}\nLABEL {INPUTS_LABEL}={key}\n")
        podman("build", "--pull=never", "--layers=false", "--tag", ref, tmp)


def build_target(target: str, bases: dict[str, str], torch_index: str, progress: Progress) -> Built:
    """The target's image, built unless its tag already carries today's inputs."""
    ref = local_ref(target)
    args = build_args(target, bases, torch_index)
    key = inputs_key(target, args)
    if _label(ref, INPUTS_LABEL) == key:
        progress.say(f"{target}: reusing {ref} (inputs {key})")
        return Built(target, ref, key, torch_index, _size(ref))
    temporary = f"{LOCAL_REGISTRY}/promptcache-{target}:building-{key}"
    with progress.step(f"{target}: building {ref} (inputs {key})"):
        argv = [
            "build",
            "--file",
            str(ROOT / "Dockerfile"),
            "--target",
            target,
            "--layers",
            "--pull=never",
            "--network=host",
            *(f for name, value in args.items() for f in ("--build-arg", f"{name}={value}")),
            "--label",
            f"{INPUTS_LABEL}={key}",
            "--label",
            f"org.opencontainers.image.version={version()}",
            "--tag",
            temporary,
        ]
        if target == "front":
            argv += ["--label", f"{TORCH_LABEL}={torch_index}"]
        if CA_BUNDLE.exists():
            argv += ["--volume", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"]
        if target == "picker":
            argv += build_mounts()
        previous = _image_id(ref)
        try:
            podman_streamed([*argv, str(ROOT)], STATE / "logs" / f"{target}.log", progress)
            if _label(temporary, INPUTS_LABEL) != key:
                _relabel(temporary, key)
            podman("tag", temporary, ref)
        finally:
            podman("untag", temporary, temporary, check=False)
        current = _image_id(ref)
        if previous and previous != current:
            # The superseded image, when nothing else names it: gigabytes for the front.
            podman("rmi", previous, check=False)
    return Built(target, ref, key, torch_index, _size(ref))


def save(built: Built, directory: Path, progress: Progress) -> Path:
    """An OCI archive of the image; renamed into place only when complete."""
    directory.mkdir(parents=True, exist_ok=True)
    name = built.ref.rsplit("/", 1)[1].replace(":", "-")
    archive = directory / f"{name}.oci.tar"
    stamp = directory / f".{name}.inputs"
    if archive.exists() and stamp.exists() and stamp.read_text() == built.inputs:
        progress.say(f"{built.target}: reusing {archive}")
        return archive
    with progress.step(f"{built.target}: saving {archive}"):
        partial = archive.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        podman("save", "--format", "oci-archive", "--output", str(partial), built.ref)
        partial.replace(archive)
        stamp.write_text(built.inputs)
    return archive


def push(built: Built, registry: str, progress: Progress, *, tls_verify: bool = True) -> str:
    """Push the image as REGISTRY/promptcache-<target>:<version>; return that reference."""
    remote = f"{registry.rstrip('/')}/{built.ref.rsplit('/', 1)[1]}"
    with progress.step(f"{built.target}: pushing {remote}"):
        podman("push", f"--tls-verify={str(tls_verify).lower()}", built.ref, f"docker://{remote}")
    return remote


def ensure_images(
    targets: Sequence[str] = TARGETS, progress: Progress | None = None
) -> dict[str, Built]:
    """Every requested image, built or reused; the entry point of scripts/images and tests."""
    progress = progress or Progress()
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown:
        raise ImagesError(f"unknown image target {unknown}: the targets are {list(TARGETS)}")
    with locked("base"):
        ensure_tools(progress)
        bases = {"python": ensure_base(progress)}
        probe(bases["python"])
        if "picker" in targets:
            bases["go"] = ensure_go_image(bases["python"], progress)
            bases["static"] = ensure_static_base(progress)
    torch_index = choose_torch_index(progress) if "front" in targets else PYPI_INDEX
    images: dict[str, Built] = {}
    for target in (t for t in TARGETS if t in targets):
        with locked(target):
            images[target] = build_target(target, bases, torch_index, progress)
    return images

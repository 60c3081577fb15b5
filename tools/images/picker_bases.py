"""The two images the Dockerfile's `picker` target starts from, made here.

Why: the release builds the picker on a registry's Go image (`GO_IMAGE`) and ships it on
distroless's static non-root image (`PICKER_BASE_IMAGE`); this machine reaches no registry.
Both are stand-ins for exactly what the target needs of them, so the Dockerfile, its
stages and its build command are the release's:

- the Go image: the project's Debian base (`/bin/sh` for `RUN`) with this machine's Go
  toolchain at `/usr/local/go`, as the official image lays it out. Its tag names the Go
  version, and the target's `go.mod` asks for no newer one.
- the static base: what distroless's `static-debian12:nonroot` holds that a static Go
  binary can use: `/etc/passwd` and `/etc/group` naming `nonroot` (65532), the CA bundle,
  `nsswitch.conf`, a sticky `/tmp`, the user's home; no shell, no package manager,
  `USER 65532:65532`.

The Go modules and the compile cache come from this machine's Go caches, mounted only while
the target builds (`build_mounts`), so an image costs the seconds a warm `go build` does,
and leaves no cache in the image.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from tools.images.host import (
    CACHE,
    STATE,
    ImagesError,
    Progress,
    podman,
    reusable,
    tagged_when_done,
)

GO_REPOSITORY = "localhost/promptcache-go"
STATIC_REPOSITORY = "localhost/promptcache-static"
NONROOT = 65532
GOPROXY_MOUNT = "/var/cache/promptcache-goproxy"
GOCACHE_IN_BUILD = "/root/.cache/go-build"
"""Where the Go image's root user keeps its compile cache (`go env GOCACHE` there)."""
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def go_root() -> Path:
    """This machine's Go toolchain (the one that builds the control plane and the picker)."""
    go = shutil.which("go")
    if go is None:
        raise ImagesError("no `go` on PATH: the picker image is built with this machine's Go")
    done = subprocess.run([go, "env", "GOROOT"], capture_output=True, text=True, check=False)
    root = Path(done.stdout.strip())
    if done.returncode != 0 or not (root / "bin" / "go").is_file():
        raise ImagesError(f"`go env GOROOT` names no toolchain ({done.stderr.strip()})")
    return root


def go_version(root: Path) -> str:
    """`go1.26.8`: the first line of the toolchain's VERSION file."""
    return (root / "VERSION").read_text().splitlines()[0].strip()


def ensure_go_image(base: str, progress: Progress) -> str:
    """The Go build image: the Debian base plus this machine's toolchain."""
    root = go_root()
    key = hashlib.sha256(f"{base}\0{go_version(root)}".encode()).hexdigest()[:12]
    ref = f"{GO_REPOSITORY}:{go_version(root).removeprefix('go')}-{key}"
    if reusable(ref, "go image", progress):
        return ref
    with progress.step(f"go image {ref} ({root})"):
        STATE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=STATE, prefix="go-") as tmp:
            shutil.copytree(root, Path(tmp) / "go", symlinks=True)
            (Path(tmp) / "Containerfile").write_text(
                f"FROM {base}\n"
                "COPY go /usr/local/go\n"
                "ENV PATH=/usr/local/go/bin:/root/go/bin:$PATH GOTOOLCHAIN=local\n"
            )
            _build_tagged(ref, ["--pull=never", tmp])
    return ref


def _static_tree() -> bytes:
    """The static base's files, as a tar archive owned as distroless's are."""
    files: dict[str, tuple[bytes, int, int]] = {
        "etc/passwd": (
            (
                "root:x:0:0:root:/root:/sbin/nologin\n"
                "nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n"
                f"nonroot:x:{NONROOT}:{NONROOT}:nonroot:/home/nonroot:/sbin/nologin\n"
            ).encode(),
            0o644,
            0,
        ),
        "etc/group": (
            f"root:x:0:\nnobody:x:65534:\nnonroot:x:{NONROOT}:\n".encode(),
            0o644,
            0,
        ),
        "etc/nsswitch.conf": (b"hosts: files dns\n", 0o644, 0),
        "etc/ssl/certs/ca-certificates.crt": (
            CA_BUNDLE.read_bytes() if CA_BUNDLE.exists() else b"",
            0o644,
            0,
        ),
    }
    dirs = {
        "etc": (0o755, 0),
        "etc/ssl": (0o755, 0),
        "etc/ssl/certs": (0o755, 0),
        "tmp": (0o1777, 0),
        "home": (0o755, 0),
        "home/nonroot": (0o700, NONROOT),
        "root": (0o700, 0),
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, (mode, owner) in dirs.items():
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, mode, owner, owner
            tar.addfile(info)
        for name, (data, mode, owner) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid = len(data), mode, owner, owner
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def ensure_static_base(progress: Progress) -> str:
    """The picker's runtime base: no shell, the non-root user, certificates."""
    tree = _static_tree()
    ref = f"{STATIC_REPOSITORY}:{hashlib.sha256(tree).hexdigest()[:12]}"
    if reusable(ref, "static base", progress):
        return ref
    with progress.step(f"static base {ref}"):
        STATE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=STATE, prefix="static-") as tmp:
            tarball = Path(tmp) / "static.tar"
            tarball.write_bytes(tree)
            with tagged_when_done(ref) as temporary:
                podman("import", "--change", f"USER {NONROOT}:{NONROOT}", str(tarball), temporary)
    return ref


def _build_tagged(ref: str, argv: list[str]) -> None:
    try:
        with tagged_when_done(ref) as temporary:
            podman("build", "--tag", temporary, *argv)
    except subprocess.CalledProcessError as error:
        raise ImagesError(f"building {ref} failed: {error.stderr or error}") from error


def build_mounts() -> list[str]:
    """`podman build` flags that lend the picker's build this machine's Go caches.

    The module cache's download tree is a Go module proxy on disk (`GOPROXY=file://...`,
    read-only): `go mod download` in the image copies from it what `go.sum` pins, and
    still checks every module against `go.sum`. The compile cache is lent read-write: it
    is a cache, safe for concurrent builds, and an unchanged GIE compiles in seconds.
    """
    gomod = Path(os.environ.get("GOMODCACHE", CACHE / "go" / "mod"))
    gocache = Path(os.environ.get("GOCACHE", CACHE / "go" / "build"))
    flags: list[str] = []
    download = gomod / "cache" / "download"
    if download.is_dir():
        flags += ["--volume", f"{download}:{GOPROXY_MOUNT}:ro"]
        flags += ["--build-arg", f"GOPROXY=file://{GOPROXY_MOUNT},https://proxy.golang.org"]
    gocache.mkdir(parents=True, exist_ok=True)
    flags += ["--volume", f"{gocache}:{GOCACHE_IN_BUILD}"]
    return flags

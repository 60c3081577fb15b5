"""The base image the Dockerfile's `PYTHON_IMAGE` points at here, made with `mmdebstrap`.

Why: this machine reaches Debian's archive but no image registry. What the Dockerfile
needs of its base: `python` on PATH, `venv`, and `useradd`/`groupadd` (passwd). The variant
is `minbase` (Priority: required, as in `debian:bookworm-slim`, which the release's
`python:3.12-slim-bookworm` is built on), not the smaller `essential`: that one lacks
libstdc++, which grpcio (the gateway policy step) and torch load. Docs, man pages and
locales are left out (the images never read them).

Cached by its inputs: the tag is a hash of everything below, so a changed package list makes
a new base, and an unchanged one costs one `podman image exists`.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tempfile

from tools.images.host import (
    STATE,
    ImagesError,
    Progress,
    last_line,
    podman,
    reusable,
    tagged_when_done,
)

SUITE = "bookworm"
SOURCES = (
    f"deb http://deb.debian.org/debian {SUITE} main",
    f"deb http://deb.debian.org/debian {SUITE}-updates main",
    f"deb http://deb.debian.org/debian-security {SUITE}-security main",
)
PACKAGES = ("python3", "python3-venv", "python-is-python3", "passwd")
EXCLUDED = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*", "/usr/share/info/*")
VARIANT = "minbase"
REPOSITORY = "localhost/promptcache-base"


def base_key() -> str:
    recipe = {
        "suite": SUITE,
        "sources": SOURCES,
        "packages": PACKAGES,
        "excluded": EXCLUDED,
        "variant": VARIANT,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def ensure_base(progress: Progress) -> str:
    """The base image's reference, made first when no image of these inputs exists."""
    ref = f"{REPOSITORY}:{base_key()}"
    if reusable(ref, "base", progress):
        return ref
    with progress.step(f"base {ref} (mmdebstrap {SUITE}: {', '.join(PACKAGES)})"):
        STATE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=STATE, prefix="base-") as tmp:
            tarball = f"{tmp}/base.tar"
            argv = [
                "mmdebstrap",
                f"--variant={VARIANT}",
                f"--include={','.join(PACKAGES)}",
                *(f"--dpkgopt=path-exclude={pattern}" for pattern in EXCLUDED),
                "--format=tar",
                SUITE,
                tarball,
                *SOURCES,
            ]
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise ImagesError(
                    f"mmdebstrap failed ({last_line(done.stderr)}): Debian's archive must be "
                    "reachable; fix that, then run scripts/images again"
                )
            with tagged_when_done(ref) as temporary:
                podman("import", "--change", 'CMD ["/bin/bash"]', tarball, temporary)
    return ref

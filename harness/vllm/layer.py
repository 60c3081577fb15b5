"""Where the engine's virtualenv is: `scripts/engine` installs it once per machine and pin set."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENGINE_DIR_ENV = "PROMPTCACHE_ENGINE_DIR"
"""Set by scripts/test after it ran scripts/engine, so tests and their children need not ask."""


@functools.cache
def engine_dir() -> Path:
    """The engine virtualenv, installing it first when absent (minutes, with progress)."""
    given = os.environ.get(ENGINE_DIR_ENV)
    if given:
        return Path(given)
    out = subprocess.run(
        [str(ROOT / "scripts" / "engine")], check=True, stdout=subprocess.PIPE, text=True
    ).stdout.strip()
    return Path(out.splitlines()[-1])


def engine_python() -> Path:
    return engine_dir() / "bin" / "python"


def engine_unavailable() -> str | None:
    """Why the engine cannot run here, or None. On a machine like the CI's it always can:
    a None answer is what every engine test expects, and they fail rather than skip."""
    try:
        python = engine_python()
    except subprocess.CalledProcessError as error:
        return f"scripts/engine failed: {error}"
    if not python.exists():
        return f"no engine virtualenv at {python.parent.parent}"
    return None

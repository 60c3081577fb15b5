"""The `promptcache` CLI as a user runs it: a fresh process, its exit code and its output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run_cli(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m promptcache.cli ARGS` in `cwd`, capturing text; never raises on exit code."""
    return subprocess.run(
        [sys.executable, "-m", "promptcache.cli", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

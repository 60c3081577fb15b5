"""Where the Endpoint Picker binary lives, so tests, benches and CI agree.

The binary is built outside the clone into the shared cache
(`$CACHE/bin/epp-<version>/epp`, see the cache convention). Tests skip with a
clear reason when it is absent; `PROMPTCACHE_EPP_BIN` points at another build.
"""

from __future__ import annotations

import os
from pathlib import Path

EPP_MODULE = "github.com/llm-d/llm-d-router"
"""The Go module the Endpoint Picker comes from (formerly llm-d-inference-scheduler)."""

EPP_VERSION = "v0.10.0"
"""The llm-d-router release the renderer targets (docs/endpoint-picker.md was verified on it)."""

EPP_BIN_ENV = "PROMPTCACHE_EPP_BIN"


def cache_dir() -> Path:
    """The shared cache root: `$PROMPTCACHE_CACHE_DIR`, else `~/.cache/promptcache`."""
    root = os.environ.get("PROMPTCACHE_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "promptcache"


def default_epp_path(version: str = EPP_VERSION) -> Path:
    """Where `e2e/cluster build` (or a hand build) puts the Endpoint Picker."""
    return cache_dir() / "bin" / f"epp-{version}" / "epp"


def find_epp_binary() -> Path | None:
    """The Endpoint Picker to run, or None when none is built yet."""
    override = os.environ.get(EPP_BIN_ENV)
    candidate = Path(override) if override else default_epp_path()
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return candidate
    return None


def missing_reason() -> str:
    """The skip message a test shows when the binary cannot be found."""
    override = os.environ.get(EPP_BIN_ENV)
    where = override if override else str(default_epp_path())
    return (
        f"Endpoint Picker binary not found at {where}: build {EPP_MODULE}/cmd/epp "
        f"{EPP_VERSION} there (CGO_ENABLED=0) or set {EPP_BIN_ENV}"
    )

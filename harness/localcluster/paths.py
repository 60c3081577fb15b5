"""Where things live: the wrapper Go modules in the checkout, and the shared cache outside it.

The cache (binaries, Go module and build caches, cluster dirs) is shared by every checkout,
helper and CI job on a machine: `$PROMPTCACHE_CACHE_DIR`, else `~/.cache/promptcache`.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The checkout (this file is harness/localcluster/paths.py)."""
E2E = ROOT / "e2e"
"""The checkout's e2e/ directory: wrapper modules live in e2e/controlplane and e2e/tools/*."""
CLI = E2E / "cluster"
"""The command-line launcher (the cluster's watcher re-runs it as `_watch`)."""
CACHE = Path(os.environ.get("PROMPTCACHE_CACHE_DIR") or Path.home() / ".cache" / "promptcache")
BIN_ROOT = CACHE / "bin"
CLUSTERS_ROOT = CACHE / "clusters"

"""`python -m harness.localcluster ARGS` is `e2e/cluster ARGS` (the launcher runs this)."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())

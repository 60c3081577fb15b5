"""The errors a user reads, and the progress line every part prints."""

from __future__ import annotations

import sys
import time


def say(msg: str) -> None:
    """Progress goes to stderr so `env` output stays eval-able."""
    print(f"[cluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class ClusterError(RuntimeError):
    """A failure the user should read, without a traceback."""


class ComponentExitedError(ClusterError):
    """A control-plane process died while `up` waited for it."""

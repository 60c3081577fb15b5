"""The cache front as a real process, for tests that need its command line, its signals and
its `--workers` children.

It starts in a session of its own, so a test ends it and everything it spawned with one
signal to the group, whatever state a failed assertion left it in. Its log goes to a file,
not a pipe: a pipe nobody reads fills up and blocks the front's logging, and asyncio's
`Process.wait()` does not return until every inherited copy of a pipe is closed, so a
child that outlived the front would hang the test instead of failing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import aiohttp

from harness.waiting import eventually, log_tail

READY_WITHIN_S: Final[float] = 120.0
REAP_WITHIN_S: Final[float] = 30.0


async def start_front(
    args: Sequence[str], env: Mapping[str, str], log_path: Path
) -> asyncio.subprocess.Process:
    """`python -m promptcache.front ARGS`, its stderr in `log_path`."""
    with log_path.open("ab") as log:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "promptcache.front", *args,
            env=dict(env), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=log, start_new_session=True,
        )  # fmt: skip


def _exited(proc: asyncio.subprocess.Process | subprocess.Popen[Any]) -> str | None:
    code = proc.poll() if isinstance(proc, subprocess.Popen) else proc.returncode
    return None if code is None else f"the front exited {code} at start-up"


async def wait_ready(
    base: str,
    proc: asyncio.subprocess.Process | subprocess.Popen[Any],
    log_path: Path,
    within_s: float = READY_WITHIN_S,
) -> None:
    """Until the front's /readyz says 200; fails at once if the front exits (started here or
    from its image, `harness.images.PodRun`), and after `within_s`, with its log's tail."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:

        async def readyz() -> int:
            async with http.get(base + "/readyz") as resp:
                return resp.status

        await eventually(
            readyz,
            f"the front's /readyz at {base} answering 200",
            until=lambda status: status == 200,
            within_s=within_s,
            interval_s=0.25,
            retry_on=(aiohttp.ClientError, TimeoutError),
            fail_if=lambda: _exited(proc),
            detail=lambda: f"log tail:\n{log_tail(log_path)}",
        )


async def end_front(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the front's whole process group (a no-op once it is gone) and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    await asyncio.wait_for(proc.wait(), REAP_WITHIN_S)

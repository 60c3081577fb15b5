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
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import aiohttp

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


def log_tail(log_path: Path, lines: int = 30) -> str:
    """The end of the front's log, for an assertion's message."""
    if not log_path.exists():
        return "(no log)"
    return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])


async def wait_ready(
    base: str, proc: asyncio.subprocess.Process, log_path: Path, within_s: float = READY_WITHIN_S
) -> None:
    """Until /readyz says 200; fails at once if the front exits, and after `within_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        while loop.time() < deadline:
            assert proc.returncode is None, f"the front exited at start-up:\n{log_tail(log_path)}"
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with http.get(base + "/readyz") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise AssertionError(f"the front was not ready in {within_s:g} s:\n{log_tail(log_path)}")


async def end_front(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the front's whole process group (a no-op once it is gone) and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    await asyncio.wait_for(proc.wait(), REAP_WITHIN_S)

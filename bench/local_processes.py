"""The benches' own processes (the stand-in vLLM, the cache front): start one as a pod
would run it, and wait until it answers, failing at once if it exits instead."""

from __future__ import annotations

import asyncio
import os
import sys

import aiohttp


async def start(*args: str, cpus: frozenset[int] | None = None) -> asyncio.subprocess.Process:
    """`python ARGS` without the caller's PROMPTCACHE_* settings (a process is configured by
    its arguments here), pinned to `cpus` when given (taskset execs: the pid is python's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTCACHE_")}
    pin = ["taskset", "-c", ",".join(map(str, sorted(cpus)))] if cpus is not None else []
    return await asyncio.create_subprocess_exec(
        *pin,
        sys.executable,
        *args,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        env=env,
    )


async def wait_ok(http: aiohttp.ClientSession, url: str, proc: asyncio.subprocess.Process) -> None:
    """Until `url` answers 200 (up to a minute); the process exiting first ends the bench."""
    for _ in range(600):
        if proc.returncode is not None:
            raise SystemExit(f"{url}: process exited with {proc.returncode}")
        try:
            async with http.get(url) as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.1)
    raise SystemExit(f"{url} never answered")

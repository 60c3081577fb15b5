"""A real front process under memory-amplification requests: its peak RSS stays bounded.

The front runs as a pod runs it (`python -m promptcache.front`, its own process)
in front of the recording stand-in; this test reads the kernel's peak RSS of
that process (`VmHWM`) before and after the attacks of `amplification.py`. The
growth must stay under the configured memory budget plus a fixed margin (the
interpreter's own allocations: aiohttp buffers, one body being read, the
prompt-embeds cache entry the set-up upload stores). Before the budget, each
attack alone grew the process by hundreds of MB to GBs.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from harness.amplification import JSON, Attack, attacks, dense_payload
from harness.front_app import SECRET
from harness.net import free_port
from harness.standin import StandinUpstream
from promptcache.contract import IsolationMode

MAX_BODY = 16 << 20
BUDGET = 96 << 20
MARGIN = 96 << 20
"""Allowance above the budget: aiohttp's buffers for bodies being received (not
charged until read), transient copies in json and torch, allocator slack."""


def peak_rss(pid: int) -> int:
    """The process's peak resident set size, in bytes (VmHWM)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


pytestmark = pytest.mark.slow  # about a minute: scripts/check leaves it to scripts/test
MODES = [IsolationMode.SHARED, IsolationMode.PER_KEY, IsolationMode.REQUIRED]
KEYED = {"x-prompt-cache-isolation-key": "tenant-a"}


@pytest.fixture(params=MODES, ids=[m.value for m in MODES])
async def front_process(
    request: pytest.FixtureRequest, standin: tuple[StandinUpstream, str], tmp_path: Path
) -> AsyncIterator[tuple[str, int]]:
    mode: IsolationMode = request.param
    salt = tmp_path / "salt-key"
    salt.write_bytes(SECRET)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTCACHE_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "promptcache.front",
        "--upstream",
        standin[1],
        "--listen",
        f"127.0.0.1:{port}",
        "--max-body-bytes",
        str(MAX_BODY),
        "--max-in-flight-bytes",
        str(BUDGET),
        "--prompt-embeds-cache-gib",
        "0.25",
        "--isolation-mode",
        mode.value,
        "--salt-key-file",
        str(salt),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        for _ in range(300):
            try:
                async with http.get(url + "/healthz") as resp:
                    if resp.status == 200:
                        break
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.1)
    yield url, proc.pid
    proc.terminate()
    await proc.wait()


async def _send(http: aiohttp.ClientSession, url: str, attack: Attack) -> int:
    headers = {**attack.headers, **KEYED}
    async with http.post(url + attack.path, data=attack.body, headers=headers) as resp:
        await resp.read()
        return resp.status


async def test_amplification_requests_stay_within_the_memory_budget(
    front_process: tuple[str, int], http: aiohttp.ClientSession
) -> None:
    url, pid = front_process
    # warm up: torch loaded, one payload verified and forwarded (what every embeds pod does)
    warm = {"model": "m", "prompt_embeds": dense_payload(64, 1024), "max_tokens": 1}
    async with http.post(url + "/v1/completions", json=warm, headers=KEYED) as resp:
        assert resp.status == 200
    before = peak_rss(pid)
    for attack in attacks(MAX_BODY):
        for body in attack.setup:
            headers = {**JSON, **KEYED}
            async with http.post(url + "/v1/completions", data=body, headers=headers) as resp:
                assert resp.status == 200, attack.name

        statuses = await asyncio.gather(*(_send(http, url, attack) for _ in range(4)))
        # 429: the four come from one client, over its share of the budget
        assert set(statuses) <= attack.refused | {503, 429}, (attack.name, statuses)
        assert set(statuses) & attack.refused, (attack.name, statuses)
    growth = peak_rss(pid) - before
    assert growth < BUDGET + MARGIN, f"peak RSS grew {growth >> 20} MiB"

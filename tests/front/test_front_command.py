"""`promptcache front`: flags over env, refusals at start, and the real process end to end."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from harness.front_process import end_front, start_front, wait_ready
from harness.net import free_port
from harness.standin import StandinUpstream
from harness.waiting import eventually, log_tail
from promptcache.contract import FrontEnv, IsolationMode
from promptcache.contract.front import FRONT_SETTINGS
from promptcache.front.command import add_arguments, register, run, settings_from
from promptcache.front.settings import FrontSettings, SettingsError
from promptcache.tenancy.salt import derive_salt


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_flag_wins_over_env_and_env_over_default() -> None:
    env = {
        FrontEnv.UPSTREAM: "http://127.0.0.1:9000",
        FrontEnv.ISOLATION_MODE: "PerKey",
        FrontEnv.MAX_BODY_BYTES: "4096",
        FrontEnv.SESSION_FROM_USER: "false",
        "SG_PROMPT_EMBEDS_CACHE_GIB": "0.5",
    }
    settings = settings_from(_parse(["--upstream", "http://127.0.0.1:9100"]), env)
    assert settings.upstream == "http://127.0.0.1:9100"
    assert settings.isolation_mode is IsolationMode.PER_KEY
    assert settings.max_body_bytes == 4096
    assert settings.session_from_user is False
    assert settings.cache_capacity_bytes == 1 << 29
    assert settings_from(_parse([]), {}) == FrontSettings()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {FrontEnv.ISOLATION_MODE: "perkey"},
            "PROMPTCACHE_ISOLATION_MODE='perkey' is not one of Shared, PerKey, Required",
        ),
        (
            {FrontEnv.MAX_BODY_BYTES: "32MiB"},
            "PROMPTCACHE_MAX_BODY_BYTES='32MiB' is not an integer",
        ),
        (
            {FrontEnv.HONOR_MAX_LEN: "maybe"},
            "PROMPTCACHE_HONOR_PROMPT_CACHE_MAX_LEN='maybe' is not a boolean; use true or false",
        ),
        (
            {"SG_PROMPT_EMBEDS_CACHE_GIB": "-1"},
            "SG_PROMPT_EMBEDS_CACHE_GIB='-1' is not a valid prompt-embeds cache size: expected a "
            "number of GiB from 0 to 1024 such as 2 or 0.5 (0 disables the cache)",
        ),
        (
            {FrontEnv.UPSTREAM: "127.0.0.1:8001"},
            "upstream '127.0.0.1:8001' must be an http URL, e.g. http://127.0.0.1:8001",
        ),
        (
            {FrontEnv.TURBOQUANT_DTYPE: "int8"},
            "PROMPTCACHE_TURBOQUANT_DTYPE='int8' is not one of auto, float32, float16, bfloat16",
        ),
    ],
)
def test_bad_settings_are_refused_with_a_message(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as info:
        settings_from(_parse([]), env)
    assert str(info.value) == message


def test_register_adds_the_front_subcommand() -> None:
    parser = argparse.ArgumentParser(prog="promptcache")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["front", "--listen", "127.0.0.1:1", "--workers", "2"])
    assert args.func is run
    assert settings_from(args, {}).workers == 2


def _env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PROMPTCACHE_") and k != "SG_PROMPT_EMBEDS_CACHE_GIB"
    }


async def test_salting_mode_without_secret_refuses_to_start(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "promptcache.front",
        "--isolation-mode",
        "PerKey",
        "--salt-key-file",
        str(missing),
        "--listen",
        f"127.0.0.1:{free_port()}",
        env=_env(),
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert err.decode().strip().splitlines()[-1] == (
        f"promptcache front: isolation mode PerKey needs the salt key, but {missing} does not "
        "exist; mount the salt Secret there or point --salt-key-file at it"
    )


async def test_short_secret_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "salt-key"
    key.write_bytes(b"short")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "promptcache.front",
        "--isolation-mode",
        "Required",
        "--salt-key-file",
        str(key),
        env=_env(),
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert err.decode().strip().splitlines()[-1] == (
        f"promptcache front: the salt key in {key} has 5 bytes; isolation mode Required needs "
        "at least 16 random bytes"
    )


@pytest.mark.parametrize("workers", [1, 2])
async def test_real_process_serves_and_stops_on_sigterm(
    tmp_path: Path, standin: tuple[StandinUpstream, str], workers: int
) -> None:
    upstream, upstream_url = standin
    secret = b"k" * 32
    (tmp_path / "salt-key").write_bytes(secret + b"\n")
    port = free_port()
    env = {
        **_env(),
        FrontEnv.ISOLATION_MODE: "PerKey",
        FrontEnv.SALT_KEY_FILE: str(tmp_path / "salt-key"),
        "SG_PROMPT_EMBEDS_CACHE_GIB": "0.01",
    }
    log = tmp_path / "front.log"
    proc = await start_front(
        ["--upstream", upstream_url, "--listen", f"127.0.0.1:{port}", "--workers", str(workers)],
        env, log,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(base, proc, log)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            for _ in range(2 * workers):  # new connections: each may reach another process
                async with (
                    aiohttp.ClientSession() as fresh,
                    fresh.post(
                        base + "/v1/chat/completions",
                        json={"model": "m", "messages": [], "prompt_cache_isolation_key": "t"},
                    ) as resp,
                ):
                    assert resp.status == 200
                    assert resp.headers["dashflow-prompt-tokens"] == "42"
            async with http.get(base + "/metrics") as resp:
                text = await resp.text()
            # dense bodies, decided in each process's JSON workers (12 new connections: every
            # process gets some), which must stop with it
            dense = {"model": "m", "messages": [], "prompt_cache_isolation_key": "t"}
            for _ in range(12 if workers > 1 else 1):
                async with (
                    aiohttp.ClientSession() as fresh,
                    fresh.post(
                        base + "/v1/chat/completions", json={**dense, "pad": [0] * 20_000}
                    ) as resp,
                ):
                    assert resp.status == 200
        spawned = _descendants(proc.pid)
        assert len(spawned) > workers - 1  # the front's processes and their JSON workers
        assert json.loads(upstream.requests[-1].body)["cache_salt"] == derive_salt(secret, "t")
        assert "vllm:num_requests_running" in text
        capacity = next(
            line
            for line in text.splitlines()
            if line.startswith("promptcache_front_prompt_embeds_cache_capacity_bytes ")
        )
        assert float(capacity.split()[1]) == int(0.01 * (1 << 30))
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 60)
        # every process it started ended with it (a JSON worker left waiting for a stop
        # sentinel kept a --workers child, and so the whole front, from exiting)
        await eventually(
            lambda: _still_running(spawned),
            "_still_running(spawned) == []",
            until=lambda got: got == [],
            within_s=10,
        )
    finally:
        await end_front(proc)
    assert proc.returncode == 0, log_tail(log)


async def test_workers_exit_when_the_first_process_is_killed(
    tmp_path: Path, standin: tuple[StandinUpstream, str]
) -> None:
    """A SIGKILL of the front's first process (no lame duck, no terminate for its workers)
    still ends every process it started: outside a pod's PID namespace nothing else would,
    and a worker left serving the port would hold it from the next front."""
    port = free_port()
    log = tmp_path / "front.log"
    proc = await start_front(
        ["--upstream", standin[1], "--listen", f"127.0.0.1:{port}", "--workers", "2",
         "--lame-duck-seconds", "0"],
        _env(), log,
    )  # fmt: skip
    try:
        await wait_ready(f"http://127.0.0.1:{port}", proc, log)
        spawned = _descendants(proc.pid)
        assert spawned, "no --workers child"
        proc.kill()
        await asyncio.wait_for(proc.wait(), 30)
        await eventually(
            lambda: _still_running(spawned),
            "_still_running(spawned) == []",
            until=lambda got: got == [],
            within_s=60,
        )
        assert "supervising process is gone" in log.read_text()
    finally:
        await end_front(proc)


def _descendants(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            found += [int(child), *_descendants(int(child))]
    return found


def _still_running(pids: list[int]) -> list[int]:
    """Those of `pids` that are still processes (neither gone nor zombies)."""
    running = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state != "Z":
            running.append(pid)
    return running


def test_every_front_env_variable_has_a_flag() -> None:
    names = {value for key, value in vars(FrontEnv).items() if key.isupper()}

    assert names <= {opt.env for opt in FRONT_SETTINGS}
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    help_text = parser.format_help()
    assert all(name in help_text for name in names)


def test_empty_header_env_switches_the_header_off() -> None:
    env = {FrontEnv.PROMPT_TOKENS_HEADER: "", FrontEnv.SESSION_HEADER: "", FrontEnv.UPSTREAM: ""}
    settings = settings_from(_parse([]), env)
    assert settings.prompt_tokens_header == ""
    assert settings.session_header == ""
    assert settings.upstream == FrontSettings().upstream  # empty means unset elsewhere


async def _connects(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 2)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


LAME_DUCK_S = 5  # long enough for a request to arrive in it on a busy machine
STOPS_WITHIN_S = 60  # what a stopping front does within a second, given the CPU


@pytest.mark.parametrize("workers", [1, 2])
async def test_sigterm_serves_through_the_lame_duck_then_drains_streams(
    tmp_path: Path, standin: tuple[StandinUpstream, str], workers: int
) -> None:
    """What a pod's stop needs from the front (issue 24, changing adapters by rolling update):
    after SIGTERM a stream in flight is answered whole, a request that arrives during the
    lame duck is still served (with `Connection: close`) while /readyz says 503; then the
    port refuses, and the lifecycle socket the vllm preStop waits on closes only when the
    process has exited, after the stream's last byte.

    Every step waits for an event, not for a time: the stream is held open by the stand-in
    until the test has seen the port close, and the lame duck is long enough that a request
    sent once /readyz says 503 arrives inside it."""
    upstream, upstream_url = standin
    upstream.chunks = 30
    upstream.hold_streams = held = asyncio.Event()
    port, lifecycle = free_port(), free_port()
    log = tmp_path / "front.log"
    proc = await start_front(
        ["--upstream", upstream_url, "--listen", f"127.0.0.1:{port}",
         "--workers", str(workers), "--lifecycle-listen", f"127.0.0.1:{lifecycle}",
         "--lame-duck-seconds", str(LAME_DUCK_S)],
        _env(), log,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    body = {"model": "m", "messages": [], "stream": True}
    try:
        await wait_ready(base, proc, log)
        assert await _connects("127.0.0.1", lifecycle)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:

            async def stream() -> tuple[int, str]:
                async with http.post(base + "/v1/chat/completions", json=body) as resp:
                    return resp.status, await resp.text()

            upstream.started.clear()
            in_flight = asyncio.create_task(stream())
            await asyncio.wait_for(upstream.started.wait(), 60)
            proc.send_signal(signal.SIGTERM)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as fresh:

                async def readiness() -> int:
                    async with fresh.get(base + "/readyz") as resp:
                        return resp.status

                await eventually(
                    readiness,
                    "/readyz 503 while stopping",
                    until=lambda status: status == 503,
                    within_s=STOPS_WITHIN_S,
                    detail=lambda: log_tail(log),
                )
                upstream.chunks = 3  # the stream in flight keeps its 30
                async with fresh.post(
                    base + "/v1/chat/completions", json={**body, "stream": False}
                ) as resp:
                    assert resp.status == 200, "a request in the lame duck is served"
                    assert resp.headers.get("Connection", "").lower() == "close"
            await eventually(
                lambda: _connects("127.0.0.1", port),
                "stopped listening after the lame duck",
                until=lambda connects: not connects,
                within_s=STOPS_WITHIN_S,
                detail=lambda: log_tail(log),
            )
            assert not in_flight.done(), "the held stream ended before it was released"
            assert await _connects("127.0.0.1", lifecycle), "alive while draining"
            held.set()
            status, text = await in_flight
            assert status == 200
            assert "tok29" in text, text[-200:]
            assert text.rstrip().endswith("data: [DONE]"), text[-200:]
            await asyncio.wait_for(proc.wait(), 60)
            assert not await _connects("127.0.0.1", lifecycle), "closed once the process exited"
    finally:
        await end_front(proc)
    assert proc.returncode == 0, log_tail(log)

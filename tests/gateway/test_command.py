"""`promptcache gateway-policy`: flags over environment, the messages a user sees, the
process's start-up line and graceful stop, and the CLI without the `gateway` extra."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.extproc_gateway import TIMEOUT
from harness.waiting import wait_for_line
from promptcache.cli import build_parser
from promptcache.contract import EPP_EXT_PROC_PORT, EPP_LOCAL_GRPC_PORT, GatewayPolicyEnv
from promptcache.gateway.command import settings_from
from promptcache.gateway.settings import GatewayPolicySettings, SettingsError


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["gateway-policy", *argv])


def test_defaults_are_the_rendered_pod_shape() -> None:
    settings = settings_from(parse(), {})
    assert settings == GatewayPolicySettings()
    assert settings.listen == f"0.0.0.0:{EPP_EXT_PROC_PORT}"
    assert settings.upstream == f"127.0.0.1:{EPP_LOCAL_GRPC_PORT}"
    assert settings.session_header == "x-session-affinity"
    assert settings.user_field == "user"


def test_environment_then_flags_win() -> None:
    env = {
        GatewayPolicyEnv.LISTEN: "127.0.0.1:7000",
        GatewayPolicyEnv.UPSTREAM: "127.0.0.1:7001",
        GatewayPolicyEnv.SESSION_HEADER: "X-Session-Id",
        GatewayPolicyEnv.MAX_BODY_BYTES: "1000",
        GatewayPolicyEnv.MAX_BUFFERED_BYTES: "5000",
        GatewayPolicyEnv.DRAIN_SECONDS: "2.5",
        GatewayPolicyEnv.USER_FIELD: "session",
    }
    from_env = settings_from(parse(), env)
    assert from_env == GatewayPolicySettings(
        listen="127.0.0.1:7000",
        upstream="127.0.0.1:7001",
        session_header="x-session-id",
        user_field="session",
        max_body_bytes=1000,
        max_buffered_bytes=5000,
        drain_seconds=2.5,
    )
    flagged = settings_from(parse("--listen", "[::1]:7100", "--max-body-bytes", "2000"), env)
    assert flagged.listen == "[::1]:7100"
    assert flagged.max_body_bytes == 2000
    assert flagged.upstream == "127.0.0.1:7001"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--listen", "9002"], {}, "--listen='9002' is not HOST:PORT (e.g. 0.0.0.0:8000)"),
        ([], {GatewayPolicyEnv.UPSTREAM: "epp"},
         "PROMPTCACHE_GATEWAY_POLICY_UPSTREAM='epp' is not HOST:PORT (e.g. 0.0.0.0:8000)"),
        (["--upstream", "127.0.0.1:99999"], {},
         "--upstream='127.0.0.1:99999' is not HOST:PORT (e.g. 0.0.0.0:8000)"),
        (["--session-header", "x session"], {},
         "--session-header='x session' is not an HTTP header name: use lower-case letters, "
         "digits and !#$%&'*+-.^_`|~ (at most 256 characters) (empty: do not read one)"),
        (["--max-body-bytes", "lots"], {}, "--max-body-bytes='lots' is not an integer"),
        ([], {GatewayPolicyEnv.MAX_BODY_BYTES: "1e6"},
         "PROMPTCACHE_GATEWAY_POLICY_MAX_BODY_BYTES='1e6' is not an integer"),
        (["--max-body-bytes", "0"], {}, "--max-body-bytes=0 must be at least 1"),
        (["--max-body-bytes", "100", "--max-buffered-bytes", "10"], {},
         "--max-buffered-bytes=10 must be at least --max-body-bytes=100"),
        (["--drain-seconds", "-1"], {}, "--drain-seconds=-1.0 must be in [0, 3600]"),
        (["--drain-seconds", "soon"], {}, "--drain-seconds='soon' is not a number"),
        (["--user-field", "1user"], {}, "--user-field='1user' is not a body field name: use "
         "letters, digits and _, not starting with a digit (at most 128 characters) (empty: "
         "do not read one)"),
        (["--isolation-mode", "Strict"], {},
         "--isolation-mode='Strict' is not one of Shared, PerKey, Required"),
        (["--workers", "0"], {}, "--workers=0 must be in [1, 64]"),
        ([], {GatewayPolicyEnv.WORKERS: "two"},
         "PROMPTCACHE_GATEWAY_POLICY_WORKERS='two' is not an integer"),
        (["--workers", "2", "--listen", "127.0.0.1:0"], {},
         "--workers=2 needs a fixed --listen port (port 0 would give each worker a port of "
         "its own)"),
        (["--workers", "4", "--max-body-bytes", "100", "--max-buffered-bytes", "300"], {},
         "--max-buffered-bytes=300 is shared by --workers=4: each share must be at least "
         "--max-body-bytes=100; raise it to 400 or more"),
    ],
)  # fmt: skip
def test_bad_settings_name_the_setting(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        settings_from(parse(*argv), env)
    assert str(caught.value) == message


def _cli(*argv: str, env: dict[str, str] | None = None, prelude: str = "") -> list[str]:
    code = f"import sys; {prelude}from promptcache.cli import main; sys.exit(main({list(argv)!r}))"
    return [sys.executable, "-c", code]


def test_bad_setting_exits_2_with_one_line() -> None:
    proc = subprocess.run(
        _cli("gateway-policy", "--listen", "nowhere"),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr == (
        "promptcache gateway-policy: --listen='nowhere' is not HOST:PORT (e.g. 0.0.0.0:8000)\n"
    )


def test_cli_works_without_the_gateway_extra() -> None:
    """With grpc missing, other commands run and the shim says what to install."""
    hide = "sys.modules['grpc'] = None; "
    help_proc = subprocess.run(
        _cli("--help", prelude=hide), capture_output=True, text=True, timeout=60, check=False
    )
    assert help_proc.returncode == 0
    assert "gateway-policy" in help_proc.stdout
    version = subprocess.run(
        _cli("version", prelude=hide), capture_output=True, text=True, timeout=60, check=False
    )
    assert version.returncode == 0, version.stderr
    shim = subprocess.run(
        _cli("gateway-policy", prelude=hide),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shim.returncode == 3
    assert shim.stderr == (
        "promptcache gateway-policy: needs 'grpc'; install the gateway extra: "
        "pip install 'promptcache[gateway]'\n"
    )


def test_process_logs_its_setup_and_stops_on_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "shim.log"
    env = {
        **os.environ,
        GatewayPolicyEnv.LISTEN: "127.0.0.1:0",
        GatewayPolicyEnv.UPSTREAM: "127.0.0.1:9",
        GatewayPolicyEnv.DRAIN_SECONDS: "5",
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "promptcache.cli", "gateway-policy"],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        try:
            started = wait_for_line(
                log, "gateway policy step listening on 127.0.0.1:0", proc, within_s=TIMEOUT
            )
            assert "relaying ext_proc to the Endpoint Picker at 127.0.0.1:9" in started
            assert (
                "session header 'x-session-affinity' from prompt_cache_key or body field 'user'"
                in started
            )
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=TIMEOUT) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    assert "gateway policy step stopped" in log.read_text()


def test_port_in_use_exits_1(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "promptcache.cli", "gateway-policy",
             "--listen", f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert f"gateway policy step cannot start: cannot listen on 127.0.0.1:{port}" in proc.stderr

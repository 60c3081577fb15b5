"""The main job, end to end: local control plane, CRDs, operator, real engines, the cache working.

    e2e/demo          build (warm: seconds) and start the `demo` cluster, install the CRDs,
                      start the operator in the background, then show the cache working on
                      real engines (e2e/demo_traffic.py): apply a resource for the local
                      tiny model with 2 replicas, run each model-server pod the operator
                      rendered as processes (the real cache front in front of a real
                      `vllm serve`, vLLM's CPU build), wait until the resource is Ready by
                      the pods' own probes, and route a short multi-tenant multi-turn chat
                      workload through the rendered gateway policy step and the real
                      Endpoint Picker, first load-only, then with the generated prefix-aware
                      config; prints `kubectl get pcd` as the real hit ratio rises and what
                      prefix-aware routing saved in TTFT and prefill tokens. The engines
                      stop with the workload; the cluster and the operator keep running.
                      Needs the engine layer (`scripts/engine`; scripts/demo runs it).
    e2e/demo --no-traffic   apply examples/minimal.yaml instead (kwok pods, no engines) and
                      stop once it is Ready.
    e2e/demo down     stop the operator and the cluster.

The operator runs with the Python that has promptcache installed: $PROMPTCACHE_PYTHON,
else this interpreter if it can import promptcache, else the project's dev venv.

`e2e/demo` is a launcher that runs this module (`python -m e2e.demo_main`, the checkout root
on PYTHONPATH, as `e2e/cluster` runs `harness.localcluster`: its docstring says why). Like
the cluster tool it needs only the standard library, so any `python3` starts it; what needs
promptcache (the operator, `e2e.demo_traffic`) runs in the interpreter that has it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

from harness.localcluster.crds import kubectl_getter, wait_established
from harness.localcluster.paths import CACHE, CLI, CLUSTERS_ROOT, ROOT
from harness.localcluster.targets import binary_path

CLUSTER = [sys.executable, str(CLI)]
NAME = "demo"
STATE = CLUSTERS_ROOT / NAME
EXAMPLE = ROOT / "examples" / "minimal.yaml"
HEALTH_PORT, METRICS_PORT = 18080, 19090


def say(msg: str) -> None:
    print(f"[demo] {msg}", file=sys.stderr, flush=True)


def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=True, text=True, **kw)  # type: ignore[call-overload,no-any-return]


def checkout_env(**extra: str) -> dict[str, str]:
    """The environment of the demo's Python children: this checkout's package and harness
    first on the path. The cached venv is shared by every checkout on the machine and its
    editable install names whichever one bootstrapped it last; the demo runs its own code."""
    path = [str(ROOT / "operator"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), **extra}


def python_with_promptcache() -> str:
    candidates = [
        os.environ.get("PROMPTCACHE_PYTHON"),
        sys.executable,
        str(CACHE / "devvenv" / "bin" / "python"),
    ]
    for exe in candidates:
        if (
            exe
            and subprocess.run(
                [exe, "-c", "import promptcache.controller.main"],
                capture_output=True,
                check=False,
                env=checkout_env(),
            ).returncode
            == 0
        ):
            return exe
    sys.exit("no Python with promptcache installed: pip install -e . (or set PROMPTCACHE_PYTHON)")


def kubectl_argv(kubeconfig: str) -> list[str]:
    return [str(binary_path("kubectl")), "--kubeconfig", kubeconfig]


def kubectl(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run([*kubectl_argv(kubeconfig), *args], capture_output=True)


def stop_group(pgid: int, grace_s: float = 30.0) -> None:
    """SIGTERM the operator's process group and wait until it has gone (SIGKILL after
    `grace_s`), so that `down` returns with nothing of the demo left running: kopf takes
    seconds to finish its handlers and close its watches after SIGTERM."""
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    say(f"the operator did not stop within {grace_s:g} s of SIGTERM: killing it")
    os.killpg(pgid, signal.SIGKILL)


def down() -> int:
    pid_file = STATE / "operator.pid"
    if pid_file.exists():
        try:
            stop_group(int(pid_file.read_text()))
            say("operator stopped")
        except (ProcessLookupError, ValueError):
            pass
        pid_file.unlink(missing_ok=True)
    subprocess.run([*CLUSTER, "down", "--name", NAME], check=False)
    return 0


def up(traffic: bool = True) -> int:
    run([*CLUSTER, "build"])
    status = subprocess.run(
        [*CLUSTER, "status", "--name", NAME, "--json"], capture_output=True, text=True, check=False
    )
    if status.returncode != 0:  # absent, or some component dead: start afresh
        subprocess.run([*CLUSTER, "down", "--name", NAME], check=False, capture_output=True)
        (STATE / "operator.pid").unlink(missing_ok=True)
        run([*CLUSTER, "up", "--name", NAME])
    kubeconfig = json.loads(
        run([*CLUSTER, "status", "--name", NAME, "--json"], capture_output=True).stdout
    )["kubeconfig"]
    say("installing the PromptCacheDeployment CRD")
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    wait_established(
        kubectl_getter(kubectl_argv(kubeconfig)), ["promptcachedeployments.serving.promptcache.io"]
    )
    pid_file, log_file = STATE / "operator.pid", STATE / "logs" / "operator.log"
    if not pid_file.exists():
        say(f"starting the operator (log: {log_file})")
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("ab") as log:
            proc = subprocess.Popen(
                [
                    python_with_promptcache(),
                    "-m",
                    "promptcache.cli",
                    "run",
                    "--all-namespaces",
                    "--no-leader-election",
                    "--bind-address",
                    "127.0.0.1",
                    "--health-port",
                    str(HEALTH_PORT),
                    "--metrics-port",
                    str(METRICS_PORT),
                    "--resync-seconds",
                    "3",  # the demo wants to see the hit ratio move
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=checkout_env(KUBECONFIG=kubeconfig),
            )
        pid_file.write_text(str(proc.pid))
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{HEALTH_PORT}/healthz", timeout=2):
                break
        except OSError:
            if time.monotonic() > deadline:
                sys.exit(f"the operator did not become healthy; see {log_file}")
            time.sleep(0.5)
    if traffic:
        # The real-engine half is promptcache code (the renderer, the real front, the
        # harness's pods): it runs as the e2e package's module, in the interpreter that has
        # promptcache, from the checkout. It applies its own resource (the local tiny model).
        run(
            [
                python_with_promptcache(),
                "-m",
                "e2e.demo_traffic",
                "--kubeconfig",
                kubeconfig,
                "--workdir",
                str(STATE / "traffic"),
            ],
            cwd=ROOT,
            env=checkout_env(),
        )
        name = "tiny-demo"
    else:
        say(f"applying {EXAMPLE.relative_to(ROOT)}")
        kubectl(kubeconfig, "apply", "-f", str(EXAMPLE))
        say("waiting for Ready")
        name = "qwen-small"
        kubectl(
            kubeconfig,
            "wait",
            "--for=condition=Ready",
            "--timeout=180s",
            f"promptcachedeployment/{name}",
            "-n",
            "default",
        )
        print(kubectl(kubeconfig, "get", "promptcachedeployments", "-A").stdout)
    print(
        kubectl(kubeconfig, "get", "pcd", name, "-n", "default", "-o", "jsonpath={.status}").stdout
    )
    engines = (
        "\nThe model-server processes stopped with the workload; their pods now say not Ready."
        if traffic
        else ""
    )
    print(f"""
The cluster and the operator keep running.{engines}
  export KUBECONFIG={kubeconfig}
  kubectl get pcd,deploy,svc,inferencepool -A       # the resource and its children
  curl -s http://127.0.0.1:{METRICS_PORT}/metrics | grep promptcache_
Stop everything with: e2e/demo down""")
    return 0


def main(argv: list[str]) -> int:
    if argv == ["down"]:
        return down()
    return up(traffic="--no-traffic" not in argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What each subcommand of `e2e/cluster` does and prints; `cli` only parses arguments.

Output contract (scripts, pytest_cluster and docs rely on it): progress on stderr; stdout
carries only the answer (`env` exports, `which` paths, `build` name/version/path lines,
`status` text or JSON). Exit codes: 0 ok, 1 failure, 3 no such cluster (`status`, `env`).
"""

from __future__ import annotations

import json
from pathlib import Path

from . import crds, lifecycle, targets
from .errors import say
from .state import State
from .supervise import pid_alive


def print_env(state: State) -> None:
    paths = targets.current_bin_dirs()
    print(f"export KUBECONFIG={state.kubeconfig}")
    print(f"export PROMPTCACHE_POD_CIDR={state.pod_cidr}")
    print(f"export PROMPTCACHE_CLUSTER_DIR={state.dir}")
    if paths:
        print(f"export PATH={':'.join(paths)}:$PATH")


def build(only: list[str] | None, for_tests: bool = False) -> int:
    targets.build(only or None, for_tests=for_tests)
    return 0


def which(binary: str) -> int:
    if binary in ("crds", "monitoring-crds"):
        for f in crds.gateway_crd_files() if binary == "crds" else crds.monitoring_crd_files():
            print(f)
        return 0
    path = targets.binary_path(binary)
    if not path.is_file():
        say(f"{binary} is not built yet; run `e2e/cluster build --only {binary}`")
        return 1
    print(path)
    return 0


def up(opts: lifecycle.UpOptions, d: Path) -> int:
    print_env(lifecycle.up(opts, d))
    return 0


def down(d: Path, keep: bool) -> int:
    state = State.load(d)
    if state is None:
        say(f"no cluster in {d}")
        return 0
    lifecycle.down(state, keep=keep)
    say(f"cluster {state.name} down")
    return 0


def status(d: Path, as_json: bool) -> int:
    state = State.load(d)
    if state is None:
        print(f"no cluster in {d}")
        return 3
    comps = {c: pid_alive(p, state.dir) for c, p in state.pids.items()}
    if as_json:
        out = dict(state.__dict__)
        out["kubeconfig"] = str(state.kubeconfig)
        out["alive"] = comps
        print(json.dumps(out, indent=2))
    else:
        print(f"cluster:    {state.name} ({state.mode})")
        print(f"dir:        {state.dir}")
        print(f"kubeconfig: {state.kubeconfig}")
        print(f"pod CIDR:   {state.pod_cidr}")
        print(f"nodes:      {', '.join(state.nodes)}")
        print(f"gateway CRDs: {'installed' if state.gateway_crds else 'not installed'}")
        port_names = {
            "kube-apiserver": "apiserver",
            "kube-controller-manager": "kcm",
            "kube-scheduler": "scheduler",
        }
        for c, alive in comps.items():
            port = state.ports.get(port_names.get(c, c))
            where = f" port {port}" if port else ""
            print(f"  {c:<24} pid {state.pids[c]:<8} {'running' if alive else 'DEAD'}{where}")
    return 0 if comps and all(comps.values()) else 1


def env(d: Path) -> int:
    state = State.load(d)
    if state is None:
        say(f"no cluster in {d}; run `e2e/cluster up` first")
        return 3
    print_env(state)
    return 0


def watch(d: Path, pid: int) -> int:
    lifecycle.watch(d, pid)
    return 0

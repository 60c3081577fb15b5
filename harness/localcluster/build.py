"""Building binaries from Go modules, once per version: go.mod versions, stamps, `go build`.

Why from Go modules: these machines reach the Go module proxy but not dl.k8s.io or GitHub
releases, and have no container engine. Each target is a small wrapper module (go.mod +
go.sum committed under e2e/) that pins one upstream module; its binaries go to
`$CACHE/bin/<tool>-<version>/` with a `.stamp` recording what built them, so a warm build
is a stamp check and anything that changes the binaries (go.mod, go.sum, the Go toolchain,
the recipe, the binary list, build tags) rebuilds them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .errors import ClusterError, say
from .paths import BIN_ROOT, CACHE, E2E

BUILD_RECIPE = "2"
"""Bump when the way binaries are built changes (flags, layout) so stale stamps rebuild."""
STAMP = ".stamp"


def gomod_version(gomod: Path, module: str) -> str:
    """The version go.mod requires for `module` (direct or `// indirect`, in a block or not)."""
    for line in gomod.read_text().splitlines():
        parts = line.strip().removeprefix("require").split()
        if len(parts) >= 2 and parts[0] == module and parts[1].startswith("v"):
            return parts[1]
    raise ClusterError(f"{gomod} does not require {module}")


def go_bin() -> str:
    # /usr/local/go is where the Go distribution installs itself; CI shells may lack it on PATH.
    go = shutil.which("go") or shutil.which("go", path="/usr/local/go/bin")
    if go is None:
        raise ClusterError("the `go` command is not on PATH; install Go 1.26+ to build binaries")
    return go


_GO_VERSION: str | None = None


def go_version() -> str:
    """`go version` output (asked once per process): a new toolchain rebuilds everything."""
    global _GO_VERSION  # noqa: PLW0603 - one `go version` per process
    if _GO_VERSION is None:
        out = subprocess.run([go_bin(), "version"], capture_output=True, text=True, check=True)
        _GO_VERSION = out.stdout.strip()
    return _GO_VERSION


def go_env() -> dict[str, str]:
    """Caches live outside the clone, shared by every helper and CI (see docs)."""
    env = dict(os.environ)
    env.setdefault("GOMODCACHE", str(CACHE / "go" / "mod"))
    env.setdefault("GOCACHE", str(CACHE / "go" / "build"))
    # go.sum is committed and -mod=readonly makes it authoritative; the checksum database
    # itself is unreachable from these machines, so asking it would only hang.
    env.setdefault("GOSUMDB", "off")
    env.setdefault("GOTOOLCHAIN", "local")
    env["GOFLAGS"] = (env.get("GOFLAGS", "") + " -buildvcs=false -mod=readonly").strip()
    return env


def module_sources(module_dir: Path) -> list[Path]:
    """The module's own Go sources (tests aside): none in a wrapper module; the picker
    (`picker/`) is a module of this repository's own code, so its sources key its stamp."""
    return sorted(
        p for p in module_dir.rglob("*.go") if p.is_file() and not p.name.endswith("_test.go")
    )


def stamp_key(
    module_dir: Path, binaries: dict[str, str], tags: str, go: str, recipe: str = BUILD_RECIPE
) -> str:
    """Everything that changes the binaries: module files and own sources, Go version,
    recipe, list, tags."""
    h = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        h.update((module_dir / name).read_bytes())
    for src in module_sources(module_dir):  # none in a wrapper: its stamps stay valid
        h.update(src.relative_to(module_dir).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(src.read_bytes()).digest())
    h.update(go.encode())
    h.update(recipe.encode())
    h.update(json.dumps(binaries, sort_keys=True).encode())
    h.update(tags.encode())  # empty for most targets: their stamps stay valid
    return h.hexdigest()


def write_stamp(out_dir: Path, key: str, go: str) -> None:
    (out_dir / STAMP).write_text(json.dumps({"key": key, "go": go}) + "\n")


def stamp_matches(out_dir: Path, key: str, binaries: Iterable[str]) -> bool:
    """The stamp says `key` and every binary is there (a half-finished build is not current)."""
    stamp = out_dir / STAMP
    if not stamp.is_file():
        return False
    try:
        data = json.loads(stamp.read_text())
    except ValueError:
        return False
    return data.get("key") == key and all((out_dir / b).is_file() for b in binaries)


def _kubernetes_ldflags(v: str) -> str:
    major, minor = v.lstrip("v").split(".")[:2]
    pkg = "k8s.io/component-base/version"
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return " ".join(
        [
            f"-X {pkg}.gitVersion={v}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            # The module proxy does not say which commit a tag is; claim none.
            f"-X {pkg}.gitCommit=",
            f"-X {pkg}.buildDate={date}",
        ]
    )


def prometheus_release(module_version: str) -> str:
    """Module v0.316.0 is Prometheus 3.16.0: the 3.x releases are tagged v0.3xx.y for Go."""
    minor, patch = module_version.lstrip("v").split(".")[1:3]
    return f"{int(minor) // 100}.{int(minor) % 100}.{patch}"


@dataclass(frozen=True)
class Target:
    """One cache entry: binaries built from one wrapper module at one version of one module."""

    tool: str  # cache directory prefix: $CACHE/bin/<tool>-<version>/
    module_dir: str  # wrapper module, relative to e2e/
    module: str  # the module whose version keys the cache directory
    binaries: dict[str, str]  # binary name -> Go package
    cgo: bool = False
    optional: bool = False  # built only when asked for (`build --only <binary>`)
    tags: str = ""  # Go build tags (comma-separated)
    control_plane: bool = True  # `up` needs it (the Endpoint Picker is for tests, not `up`)
    e2e_dir: Path = E2E  # where module_dir is (a test points it at a scratch module)
    bin_root: Path = BIN_ROOT  # where out_dir is

    def module_path(self) -> Path:
        return self.e2e_dir / self.module_dir

    def version(self) -> str:
        return gomod_version(self.module_path() / "go.mod", self.module)

    def out_dir(self) -> Path:
        return self.bin_root / f"{self.tool}-{self.version()}"

    def ldflags(self) -> str:
        v = self.version()
        if self.tool == "kubernetes":
            return _kubernetes_ldflags(v)
        if self.tool == "helm":
            return f"-X helm.sh/helm/v4/internal/version.version={v}"
        if self.tool == "prometheus":
            return f"-X github.com/prometheus/common/version.Version={prometheus_release(v)}"
        if self.tool == "actionlint":
            return f"-X github.com/rhysd/actionlint.version={v}"
        # etcd and kwok carry their version as a constant of the module itself.
        return ""

    def stamp_key(self, go: str | None = None) -> str:
        return stamp_key(self.module_path(), self.binaries, self.tags, go or go_version())

    def is_current(self, go: str | None = None) -> bool:
        return stamp_matches(self.out_dir(), self.stamp_key(go), self.binaries)


def go_default_name(pkg: str) -> str:
    """The file name `go build -o DIR/` gives a main package: its last path element, or the
    one before a major-version suffix (`.../server/v3` -> `server`)."""
    parts = pkg.rstrip("/").split("/")
    last = parts[-1]
    if len(parts) > 1 and last.startswith("v") and last[1:].isdigit():
        return parts[-2]
    return last


def build_groups(binaries: dict[str, str]) -> list[dict[str, str]]:
    """The `go build` invocations for one target: every binary whose name is the one Go
    gives its package goes into one invocation (one package-graph load, links in parallel
    under `-p`); a binary named otherwise is built on its own with `-o FILE`."""
    together = {n: p for n, p in binaries.items() if go_default_name(p) == n}
    alone = [{n: p} for n, p in binaries.items() if n not in together]
    if len(together) == 1:
        return [together, *alone]
    return ([together] if together else []) + alone


def _go_build(t: Target, group: dict[str, str], out: Path, env: dict[str, str]) -> None:
    """One `go build` of `group`'s packages into `out`, each binary replaced atomically."""
    cmd = [go_bin(), "build", "-p", os.environ.get("PROMPTCACHE_BUILD_P", "2"), "-trimpath"]
    if t.tags:
        cmd += ["-tags", t.tags]
    cmd += ["-ldflags", f"-s -w {t.ldflags()}".strip()]
    staging = out / ".tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    if len(group) == 1:
        ((name, pkg),) = group.items()
        cmd += ["-o", str(staging / name), pkg]
    else:
        cmd += ["-o", f"{staging}/", *group.values()]
    proc = subprocess.run(cmd, cwd=t.module_path(), env=env, check=False)
    if proc.returncode != 0:
        raise ClusterError(
            f"go build of {', '.join(group.values())} failed (exit {proc.returncode})"
        )
    for name in group:
        built = staging / name
        if not built.is_file():
            raise ClusterError(f"go build made no {name} in {staging}")
        built.replace(out / name)
    shutil.rmtree(staging, ignore_errors=True)


def target_env(t: Target, env: dict[str, str] | None = None) -> dict[str, str]:
    """The Go environment for `t` (cgo on only where it needs it), on `env` (default
    `go_env()`): the same for its build and its module prefetch, so both load one build
    list."""
    return dict(env or go_env(), CGO_ENABLED="1" if t.cgo else "0")


def build_target(t: Target, index: int, total: int, t0: float) -> None:
    out = t.out_dir()
    label = f"({index}/{total}) {t.tool} {t.version()}"
    if t.is_current():
        say(f"{label}: cached in {out}")
        return
    out.mkdir(parents=True, exist_ok=True)
    env = target_env(t)
    for group in build_groups(t.binaries):
        start = time.monotonic()
        names = ", ".join(group)
        say(f"{label}: building {names}; elapsed {time.monotonic() - t0:.0f}s")
        _go_build(t, group, out, env)
        say(f"{label}: {names} done in {time.monotonic() - start:.0f}s")
    write_stamp(out, t.stamp_key(), go_version())


PREFETCH_WORKERS = 3
"""How many targets' modules download at once beside the compile: downloads wait on the
network, not the two cores, so a few at a time overlap the compiles without slowing them."""


def _prefetch(t: Target, env: dict[str, str]) -> None:
    """Download the module zips `t`'s packages need, by loading them (`go list -deps`): what
    `go build` would download itself, and no more (`go mod download` fetches the whole
    graph: several times the bytes for Kubernetes). Best effort: a failure here costs
    nothing, since `go build` downloads whatever is missing and reports its own errors."""
    cmd = [go_bin(), "list", "-deps", "-f", "{{.ImportPath}}"]
    if t.tags:
        cmd += ["-tags", t.tags]
    cmd += list(t.binaries.values())
    subprocess.run(
        cmd,
        cwd=t.module_path(),
        env=env,
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def prefetch_modules(targets: Iterable[Target]) -> ThreadPoolExecutor:
    """Start downloading every target's modules now, `PREFETCH_WORKERS` targets at a time,
    while the builds (one at a time: each already spends both cores) compile in turn.

    Why: on a cold machine each `go build` otherwise downloads its modules and only then
    compiles, so the nine targets' downloads (mostly waiting on the proxy) add up in series
    with the compiles. The caller shuts the pool down when its builds end."""
    env = go_env()
    pool = ThreadPoolExecutor(max_workers=PREFETCH_WORKERS, thread_name_prefix="go-prefetch")
    todo = list(targets)
    if todo:
        tools = ", ".join(t.tool for t in todo)
        say(f"downloading the modules of {tools} beside the builds, {PREFETCH_WORKERS} at a time")
    for t in todo:
        pool.submit(_prefetch, t, target_env(t, env))
    return pool


@contextlib.contextmanager
def build_lock(bin_root: Path = BIN_ROOT) -> Iterator[None]:
    """Serialise builds: helpers and CI share the cache, and two concurrent builds would
    both spend the machine's two cores on the same work."""
    bin_root.mkdir(parents=True, exist_ok=True)
    with open(bin_root / ".build.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("another build holds the lock; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield

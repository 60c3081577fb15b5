"""The machine the images are built on: its tools, podman's settings for it, progress output.

Facts of machines like this one that podman's defaults trip over (each checked again by
`probe`, so a machine where they differ gets a one-line error, not a stack of podman's):

- crun refuses a hybrid cgroup layout ("cgroups in hybrid mode not supported"): runc works;
- podman asks for ulimits above the host's (`nofile` 1048576), which the kernel refuses
  ("error setting rlimit type 7"): the host's own limits work;
- neither needs an edit of /etc: one `containers.conf` named by `CONTAINERS_CONF`.
"""

from __future__ import annotations

import fcntl
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("PROMPTCACHE_CACHE_DIR", Path.home() / ".cache" / "promptcache"))
STATE = CACHE / "images"
# Debian package -> the command that shows it is installed.
TOOLS = {
    "podman": "podman",
    "buildah": "buildah",
    "mmdebstrap": "mmdebstrap",
    "runc": "runc",
    "skopeo": "skopeo",
    "umoci": "umoci",
}
# mmdebstrap checks the archive's signatures with it (present on Debian, not elsewhere).
KEYRING_PACKAGE = "debian-archive-keyring"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
# pid_max caps what podman hands runc for nproc here, whatever the hard limit says.
PID_MAX = Path("/proc/sys/kernel/pid_max")


class ImagesError(Exception):
    """A problem the user can act on: one line saying what is wrong and what to do."""


@dataclass
class Progress:
    """Prints `== [elapsed] step: detail` lines and keeps each step's duration for a summary."""

    started: float = field(default_factory=time.monotonic)
    durations: list[tuple[str, float]] = field(default_factory=list)
    quiet: bool = False

    def say(self, message: str) -> None:
        if not self.quiet:
            print(f"== [{time.monotonic() - self.started:6.1f}s] {message}", flush=True)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        begun = time.monotonic()
        self.say(f"{name} ...")
        try:
            yield
        finally:
            took = time.monotonic() - begun
            self.durations.append((name, took))
            self.say(f"{name}: {took:.1f}s")

    def summary(self) -> str:
        width = max((len(name) for name, _ in self.durations), default=0)
        lines = [f"  {name.ljust(width)}  {took:7.1f}s" for name, took in self.durations]
        lines.append(f"  {'total'.ljust(width)}  {time.monotonic() - self.started:7.1f}s")
        return "\n".join(lines)


def ensure_tools(progress: Progress) -> None:
    """Install podman and friends with apt when any is missing (`apt-get update` once first)."""
    missing = [pkg for pkg, command in TOOLS.items() if shutil.which(command) is None]
    if not KEYRING.exists():
        missing.append(KEYRING_PACKAGE)
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise ImagesError(
            f"scripts/images needs {', '.join(missing)} and this machine has no apt-get to "
            "install them: install them with the system's package manager (podman >= 4 with "
            "runc), then run scripts/images again"
        )
    if os.geteuid() != 0:
        raise ImagesError(
            f"scripts/images needs {', '.join(missing)}: install them as root "
            f"(apt-get update && apt-get install {' '.join(missing)}), then run it again"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with progress.step(f"apt-get install {' '.join(missing)}"):
        for argv in (
            ["apt-get", "update", "-q"],
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
        ):
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
                raise ImagesError(
                    f"`{' '.join(argv)}` failed ({tail[0]}): fix apt's sources or network, "
                    "then run scripts/images again"
                )


def host_ulimits() -> dict[str, int]:
    """The highest `nofile` and `nproc` a container may ask for here: the host's own."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    if PID_MAX.exists():
        pid_max = int(PID_MAX.read_text().strip())
        nproc = pid_max if nproc == resource.RLIM_INFINITY else min(nproc, pid_max)
    if nofile == resource.RLIM_INFINITY:
        nofile = 1 << 20
    return {"nofile": nofile, "nproc": nproc}


def containers_conf() -> Path:
    """Write (when changed) the `containers.conf` podman reads through `CONTAINERS_CONF`."""
    limits = host_ulimits()
    text = (
        "# Written by scripts/images (tools/images/host.py); podman reads it through\n"
        "# CONTAINERS_CONF, so nothing under /etc changes. Why each line: host.py's docstring.\n"
        "[containers]\n"
        f'default_ulimits = ["nofile={limits["nofile"]}:{limits["nofile"]}", '
        f'"nproc={limits["nproc"]}:{limits["nproc"]}"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
    )
    path = STATE / "containers.conf"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path


def podman_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment every podman call here runs with."""
    env = dict(os.environ if base is None else base)
    env["CONTAINERS_CONF"] = str(containers_conf())
    return env


def podman(
    *args: str, check: bool = True, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """`podman ARGS` with this machine's settings, output captured."""
    done = subprocess.run(
        ["podman", *args],
        env=podman_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    if check and done.returncode != 0:
        raise ImagesError(
            f"`podman {' '.join(args[:3])} ...` failed: {last_line(done.stderr or done.stdout)}"
        )
    return done


def podman_streamed(args: Sequence[str], log: Path, progress: Progress) -> None:
    """`podman ARGS` with its output in LOG and its `STEP` lines as progress."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as sink:
        proc = subprocess.Popen(
            ["podman", *args],
            env=podman_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        tail: list[str] = []
        for line in proc.stdout:
            sink.write(line)
            tail = [*tail[-19:], line.rstrip()]
            if "STEP " in line:
                progress.say("  " + line.strip()[:150])
        code = proc.wait()
    if code != 0:
        shown = "\n".join("    " + t for t in tail)
        print(shown, file=sys.stderr)
        raise ImagesError(f"`podman {args[0]}` failed (exit {code}); full output in {log}")


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def probe(image: str) -> None:
    """Fail in one line when podman cannot run a container here."""
    done = podman("run", "--rm", "--network=none", image, "true", check=False, timeout=120)
    if done.returncode != 0:
        raise ImagesError(
            f"podman cannot run a container here ({last_line(done.stderr)}): it needs runc "
            "(crun refuses hybrid cgroups), ulimits within the host's, and root or working "
            f"rootless podman; make `CONTAINERS_CONF={containers_conf()} podman run --rm "
            f"{image} true` succeed, then run scripts/images again"
        )


@contextmanager
def locked(name: str) -> Iterator[None]:
    """One build of NAME (the base, or a target) at a time on this machine: scripts/test and
    a developer may overlap, and a test that needs only the operator image must not wait
    for the front's build."""
    STATE.mkdir(parents=True, exist_ok=True)
    with (STATE / f"{name}.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def reusable(ref: str, what: str, progress: Progress) -> bool:
    """Whether an image of these inputs is already here (its tag names them), said so."""
    if podman("image", "exists", ref, check=False).returncode == 0:
        progress.say(f"{what}: reusing {ref}")
        return True
    return False


@contextmanager
def tagged_when_done(ref: str) -> Iterator[str]:
    """A temporary tag to build REF under, given REF only when the block succeeded: a run
    stopped half-way leaves no tag a later run would take for complete."""
    temporary = f"{ref}-building"
    try:
        yield temporary
        podman("tag", temporary, ref)
    finally:
        podman("untag", temporary, temporary, check=False)

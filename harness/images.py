"""The project's images, run with podman the way their pods run them.

Why translate the pod spec instead of writing podman flags by hand: the smoke tests must
prove the *rendered* container (the chart's, or the renderer's) works on the image, so
the user, the read-only root, the dropped capabilities, the writable emptyDirs and the
mounted Secrets all come from the manifest, as a kubelet would apply them:

- user: the container's `runAsUser`/`runAsGroup`, else the pod's, else the image's own
  USER (which `runAsNonRoot` requires to be numeric and not 0, as the kubelet checks);
- `readOnlyRootFilesystem`: a read-only root with *no* tmpfs of podman's own (a pod has
  only the emptyDirs it declares);
- `capabilities.drop: [ALL]`, `allowPrivilegeEscalation: false`: the same in podman;
- emptyDir mounts: tmpfs of the declared size limit; Secret and ConfigMap mounts: the files
  the test gives, owned by root and the pod's `fsGroup` with the volume's `defaultMode`,
  read-only, like the kubelet writes them; `fsGroup` is a supplementary group.

The images come from `tools.images.ensure_images` (built or reused: seconds when warm).
"""

from __future__ import annotations

import base64
import functools
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tools.images import Built, ensure_images, podman_env
from tools.images.host import Progress

ROOT = Path(__file__).resolve().parent.parent
CHART_RENDER = ROOT / "tests" / "chart" / "golden" / "default.yaml"
DEFAULT_EMPTYDIR_SIZE = "1Gi"  # no sizeLimit: unbounded in a pod; a tmpfs needs one


@functools.cache
def built_image(target: str) -> Built:
    """The TARGET image, built or reused (scripts/test builds them all before pytest)."""
    return ensure_images((target,), Progress(quiet=True))[target]


def chart_operator_pod() -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod spec, operator container) of the chart's default render (tests/chart/golden)."""
    for doc in yaml.safe_load_all(CHART_RENDER.read_text()):
        if (
            doc
            and doc["kind"] == "Deployment"
            and doc["metadata"]["name"] == "promptcache-operator"
        ):
            spec = doc["spec"]["template"]["spec"]
            (container,) = (c for c in spec["containers"] if c["name"] == "operator")
            return spec, container
    raise AssertionError(f"no operator Deployment in {CHART_RENDER}")


def pod_container(
    manifests: Sequence[Mapping[str, Any]], container: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod spec, container) of the one rendered workload that has a container so named."""
    found = [
        (dict(m["spec"]["template"]["spec"]), dict(c))
        for m in manifests
        if m["kind"] in ("Deployment", "StatefulSet")
        for c in m["spec"]["template"]["spec"]["containers"]
        if c["name"] == container
    ]
    assert len(found) == 1, f"{len(found)} rendered workloads have a container {container!r}"
    return found[0]


def _quantity_bytes(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "k": 1000, "M": 10**6, "G": 10**9}
    for unit, factor in units.items():
        if quantity.endswith(unit):
            return int(quantity[: -len(unit)]) * factor
    return int(quantity)


def image_user(image: str) -> str:
    done = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Config.User}}", image],
        env=podman_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@dataclass
class PodRun:
    """One container of a pod spec, run from IMAGE with podman as its pod would run it.

    `files`: volume name -> {file name: bytes} for the Secret/ConfigMap volumes it mounts;
    `env`: values that replace the rendered ones (ports on a shared host, paths);
    `fields`: what `valueFrom.fieldRef` resolves to (default: the container's name as the
    pod's, namespace `default`).
    """

    image: str
    pod: Mapping[str, Any]
    container: Mapping[str, Any]
    workdir: Path
    files: Mapping[str, Mapping[str, bytes]] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    fields: Mapping[str, str] = field(default_factory=dict)
    network: str = "none"
    mounts: Mapping[str, Path] = field(default_factory=dict)
    """Container path -> host directory, read-only, beyond the pod's own volumes (what a
    cluster would hand the pod otherwise: a kubeconfig in place of a ServiceAccount token)."""
    name: str = field(default_factory=lambda: f"promptcache-smoke-{uuid.uuid4().hex[:8]}")

    def security_flags(self) -> list[str]:
        pod_ctx = self.pod.get("securityContext", {})
        ctx = self.container.get("securityContext", {})
        flags: list[str] = []
        user = ctx.get("runAsUser", pod_ctx.get("runAsUser"))
        group = ctx.get("runAsGroup", pod_ctx.get("runAsGroup"))
        if user is not None:
            flags.append(f"--user={user}" + (f":{group}" if group is not None else ""))
        elif ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")):
            # The kubelet's check: without a runAsUser, the image's USER must be numeric, not 0.
            declared = image_user(self.image).split(":")[0]
            assert declared.isdigit(), f"{self.image} declares USER {declared!r}: not numeric"
            assert int(declared) != 0, f"{self.image} runs as root: runAsNonRoot refuses it"
        if "fsGroup" in pod_ctx:
            flags.append(f"--group-add={pod_ctx['fsGroup']}")
        if ctx.get("readOnlyRootFilesystem"):
            flags += ["--read-only", "--read-only-tmpfs=false"]
        caps = ctx.get("capabilities", {})
        flags += [f"--cap-drop={cap}" for cap in caps.get("drop", [])]
        flags += [f"--cap-add={cap}" for cap in caps.get("add", [])]
        if ctx.get("allowPrivilegeEscalation") is False:
            flags.append("--security-opt=no-new-privileges")
        return flags

    def volume_flags(self) -> list[str]:
        volumes = {v["name"]: v for v in self.pod.get("volumes", [])}
        fs_group = self.pod.get("securityContext", {}).get("fsGroup", 0)
        flags: list[str] = []
        for mount in self.container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            if "emptyDir" in volume:
                size = _quantity_bytes(volume["emptyDir"].get("sizeLimit", DEFAULT_EMPTYDIR_SIZE))
                flags.append(f"--tmpfs={mount['mountPath']}:rw,size={size},mode=1777")
                continue
            # A projected volume is the API server's ServiceAccount token (`kube-api-access-*`),
            # which none of these containers reads: mounted with the files the test gives.
            source = volume.get("secret") or volume.get("configMap") or volume.get("projected")
            assert source is not None, (
                f"volume {mount['name']}: only emptyDir/Secret/ConfigMap/projected"
            )
            directory = self.workdir / "volumes" / mount["name"]
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(0o1777)  # the kubelet's volume directory: anyone may look up
            mode = source.get("defaultMode", 0o644)
            for name, content in self.files.get(mount["name"], {}).items():
                path = directory / name
                path.write_bytes(content)
                os.chown(path, 0, fs_group)
                path.chmod(mode)
            flags.append(f"--volume={directory}:{mount['mountPath']}:ro")
        flags += [f"--volume={host}:{path}:ro" for path, host in self.mounts.items()]
        return flags

    def env_flags(self) -> list[str]:
        flags: list[str] = []
        for var in self.container.get("env", []):
            name = var["name"]
            if name in self.env:
                continue
            if "valueFrom" not in var:  # the API server drops an empty `value`
                flags.append(f"--env={name}={var.get('value', '')}")
            else:
                ref = var["valueFrom"]["fieldRef"]["fieldPath"]
                known = {"metadata.name": self.name, "metadata.namespace": "default", **self.fields}
                flags.append(f"--env={name}={known[ref]}")
        flags += [f"--env={name}={value}" for name, value in self.env.items()]
        return flags

    def argv(
        self,
        args: Sequence[str] | None = None,
        *,
        interactive: bool = False,
        command: Sequence[str] | None = None,
    ) -> list[str]:
        """`podman run ...`; ARGS replace the container's args, COMMAND its command."""
        command = command or self.container.get("command")
        argv = ["podman", "run", "--rm", f"--name={self.name}", f"--network={self.network}"]
        if interactive:
            argv.append("--interactive")
        argv += self.security_flags() + self.volume_flags() + self.env_flags()
        if command:
            argv.append(f"--entrypoint={json.dumps(command)}")
        argv.append(self.image)
        argv += list(self.container.get("args", []) if args is None else args)
        return argv

    def run(
        self,
        args: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float = 300,
        command: Sequence[str] | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        """Run to completion; stdout and stderr captured as bytes."""
        return subprocess.run(
            self.argv(args, interactive=stdin is not None, command=command),
            input=stdin,
            env=podman_env(),
            capture_output=True,
            timeout=timeout,
            check=False,
        )

    def start(self, log: Path) -> subprocess.Popen[bytes]:
        """Start in the background with its container args; output to LOG."""
        with log.open("wb") as sink:
            return subprocess.Popen(
                self.argv(), env=podman_env(), stdout=sink, stderr=subprocess.STDOUT
            )

    def remove(self) -> None:
        subprocess.run(
            ["podman", "rm", "--force", "--time=5", self.name],
            env=podman_env(),
            capture_output=True,
            check=False,
        )
        shutil.rmtree(self.workdir / "volumes", ignore_errors=True)


def embedded_kubeconfig(admin: Path, out: Path) -> Path:
    """A kubeconfig (the admin's, or a ServiceAccount's) with its certificate files inlined
    (the container sees no pki/), readable by the image's user."""
    config: dict[str, Any] = yaml.safe_load(admin.read_text())
    for entry, fields in (("clusters", ("certificate-authority",)),
                          ("users", ("client-certificate", "client-key"))):  # fmt: skip
        for item in config[entry]:
            body = item["cluster" if entry == "clusters" else "user"]
            for name in fields:
                if name in body:
                    data = Path(body.pop(name)).read_bytes()
                    body[f"{name}-data"] = base64.b64encode(data).decode()
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o755)
    path = out / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o644)  # readable by the image's user, like a projected token
    return path

"""The picker pod's `epp` container run from promptcache's picker image, as rendered.

Why beside `EppProcess`: every other picker test runs the binary the build cached, which
proves the plugins but not the image a user pulls: its user, a root it cannot write, no
capability, its config and salt key where the rendered volumes put them. This one runs the
rendered container with podman (`harness.images.PodRun`), and is otherwise an
`EppProcess`: the same ports, health, client and log, so a pool's tests run on it as on the
binary. What one host cannot share changes, and only that: the ports (host network, free
ports) and a kubeconfig for the rendered ServiceAccount in place of its mounted token.
"""

from __future__ import annotations

from pathlib import Path

from harness.images import PodRun, built_image, embedded_kubeconfig
from tools.images import podman_env

from .process import EppProcess
from .rendered import Rendered

KUBECONFIG_DIR = "/var/run/promptcache-test"


def _volume(pod: dict[str, object], kind: str) -> str:
    """The name of the pod's one volume of this kind (`configMap`, `secret`)."""
    volumes = pod.get("volumes", [])
    assert isinstance(volumes, list)
    names = [v["name"] for v in volumes if kind in v]
    assert len(names) == 1, f"the picker pod has {len(names)} {kind} volumes: {names}"
    return str(names[0])


class EppFromImage(EppProcess):
    """`EppProcess` whose process is `podman run` of the rendered `epp` container."""

    def __init__(
        self, rendered: Rendered, salt_key: bytes, kubeconfig: Path, workdir: Path
    ) -> None:
        super().__init__(
            Path("/epp"),  # replaced below: the image's entrypoint
            rendered.epp_config_text,
            workdir,
            pool_name=None,
            extra_args=rendered.epp_args,  # less the ports and config path it sets itself
        )
        pod = rendered.epp_deployment["spec"]["template"]["spec"]
        container = rendered.epp_container
        config_volume = _volume(pod, "configMap")
        config_mount = next(
            m["mountPath"] for m in container["volumeMounts"] if m["name"] == config_volume
        )
        # The harness's own flags point at files on this host: here they are the pod's.
        args = [
            f"--config-file={config_mount}/config.yaml" if a.startswith("--config-file") else a
            for a in self.args[1:]
        ]
        self.run = PodRun(
            built_image("picker").ref,
            pod,
            container,
            workdir,
            files={
                config_volume: {"config.yaml": rendered.epp_config_text.encode()},
                _volume(pod, "secret"): {"salt-key": salt_key},
            },
            env={"KUBECONFIG": f"{KUBECONFIG_DIR}/kubeconfig"},
            fields={"metadata.namespace": rendered.namespace},
            network="host",
            mounts={KUBECONFIG_DIR: embedded_kubeconfig(kubeconfig, workdir / "kube").parent},
        )
        self.args = self.run.argv(args)
        self.env = podman_env()

    def stop(self, timeout_s: float = 20.0) -> int | None:
        code = super().stop(timeout_s)
        self.run.remove()  # what `--rm` leaves when podman itself was killed
        return code

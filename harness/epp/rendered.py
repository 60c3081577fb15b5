"""What `promptcache render` produced for one example, picked apart for the harness.

The harness must run the Endpoint Picker exactly as the rendered Deployment
would: the ConfigMap's `EndpointPickerConfig` and the container's args. This
module renders through the public CLI (the same path users take) and finds
those pieces by structure, not by names the renderer might change.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from promptcache.contract import (
    PREDICTED_MATCH_PLUGIN,
    PROFILES,
    TENANT_SALT_PARSER,
    Command,
    PickerTarget,
    PredictedMatchParam,
    TenantSaltParam,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def example_files() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yaml"))


def deep_merge(base: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """`patch` into `base` as a JSON merge patch (RFC 7386, what `kubectl patch --type=merge`
    does): mappings merge, `None` removes the key, anything else replaces."""
    for key, value in patch.items():
        if value is None:
            base.pop(key, None)
        elif isinstance(value, Mapping):
            # A mapping merges into what is there, or into an empty one: its `None`s are
            # removals even where the base had no such mapping (RFC 7386), never values.
            if not isinstance(base.get(key), dict):
                base[key] = {}
            deep_merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)


def render_resource(resource: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Run `promptcache render -f` on a resource; the CLI's stderr on failure."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(dict(resource), f)
        path = f.name
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "promptcache.cli", "render", "-f", path],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        Path(path).unlink(missing_ok=True)
    if proc.returncode != 0:
        raise RuntimeError(f"promptcache render failed ({proc.returncode}):\n{proc.stderr}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def load_example(
    path: Path, namespace: str | None = None, spec_patch: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """An example resource, moved to `namespace` and with `spec_patch` merged in."""
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    if namespace is not None:
        doc["metadata"]["namespace"] = namespace
    if spec_patch:
        deep_merge(doc.setdefault("spec", {}), spec_patch)
    return doc


def _flag(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


@dataclass
class Rendered:
    """The rendered objects of one PromptCacheDeployment."""

    objects: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o.get("kind") == kind]

    @property
    def pool(self) -> dict[str, Any]:
        (pool,) = self.of_kind("InferencePool")
        return pool

    @property
    def epp_deployment(self) -> dict[str, Any]:
        """The Deployment whose container runs with `--pool-name` (the Endpoint Picker)."""
        for dep in self.of_kind("Deployment"):
            for c in dep["spec"]["template"]["spec"]["containers"]:
                if _flag(list(c.get("args", [])), "--pool-name") is not None:
                    return dep
        raise LookupError("no Endpoint Picker Deployment (a container with --pool-name)")

    @property
    def epp_container(self) -> dict[str, Any]:
        for c in self.epp_deployment["spec"]["template"]["spec"]["containers"]:
            if _flag(list(c.get("args", [])), "--pool-name") is not None:
                return dict(c)
        raise LookupError("no Endpoint Picker container")

    @property
    def epp_args(self) -> list[str]:
        return [str(a) for a in self.epp_container.get("args", [])]

    @property
    def epp_grpc_port(self) -> int:
        """The ext_proc port the rendered EPP serves (`--grpc-port`)."""
        port = _flag(self.epp_args, "--grpc-port")
        if port is None:
            raise LookupError("the rendered EPP has no --grpc-port")
        return int(port)

    @property
    def gateway_policy_container(self) -> dict[str, Any] | None:
        """The EPP pod's container that runs `promptcache gateway-policy`, if any."""
        for c in self.epp_deployment["spec"]["template"]["spec"]["containers"]:
            if list(c.get("args", []))[:1] == [Command.GATEWAY_POLICY]:
                return dict(c)
        return None

    policy_step_container = gateway_policy_container

    @property
    def picker(self) -> PickerTarget:
        """Which Endpoint Picker the config is for (each target has its own apiVersion)."""
        if self.tenant_salt_plugin is not None:
            return PickerTarget.PROMPTCACHE  # GIE's apiVersion, with our parser
        version = self.epp_config["apiVersion"]
        for target, profile in PROFILES.items():
            if target is PickerTarget.PROMPTCACHE:
                continue
            if profile.config_api_version == version:
                return target
        raise LookupError(f"no picker target renders config apiVersion {version!r}")

    @property
    def tenant_salt_plugin(self) -> dict[str, Any] | None:
        """The config's tenant-salt parser (promptcache's picker), if it names one."""
        for plugin in self.epp_config.get("plugins", []):
            if plugin.get("type") == TENANT_SALT_PARSER:
                return dict(plugin)
        return None

    def epp_config_text_with_salt_key(self, salt_key_file: Path) -> str:
        """The config as rendered, with the tenant-salt parser and the predicted-match plugin
        reading `salt_key_file` (the harness's copy of the pool's salt Secret) instead of
        the pod's mount path."""
        if self.tenant_salt_plugin is None:
            return self.epp_config_text
        config = copy.deepcopy(self.epp_config)
        for plugin in config["plugins"]:
            params = plugin.get("parameters") or {}
            if plugin.get("type") == TENANT_SALT_PARSER and TenantSaltParam.SALT_KEY_FILE in params:
                params[TenantSaltParam.SALT_KEY_FILE] = str(salt_key_file)
            if plugin.get("type") == PREDICTED_MATCH_PLUGIN:
                params[PredictedMatchParam.SALT_KEY_FILE] = str(salt_key_file)
        return yaml.safe_dump(config, sort_keys=False)

    @property
    def model_deployment(self) -> dict[str, Any]:
        epp = self.epp_deployment["metadata"]["name"]
        (dep,) = [d for d in self.of_kind("Deployment") if d["metadata"]["name"] != epp]
        return dep

    @property
    def epp_config_text(self) -> str:
        """The ConfigMap entry the EPP's `--config-file` points at, through its volume mount."""
        config_file = _flag(self.epp_args, "--config-file")
        if config_file is None:
            text = _flag(self.epp_args, "--config-text")
            if text is None:
                raise LookupError("the EPP has neither --config-file nor --config-text")
            return text
        pod = self.epp_deployment["spec"]["template"]["spec"]
        for mount in self.epp_container.get("volumeMounts", []):
            prefix = mount["mountPath"].rstrip("/") + "/"
            if config_file.startswith(prefix):
                key = config_file[len(prefix) :]
                (volume,) = [v for v in pod.get("volumes", []) if v["name"] == mount["name"]]
                cm_name = volume["configMap"]["name"]
                (cm,) = [c for c in self.of_kind("ConfigMap") if c["metadata"]["name"] == cm_name]
                return str(cm["data"][key])
        raise LookupError(f"no volume mount holds {config_file}")

    @property
    def epp_config(self) -> dict[str, Any]:
        doc: dict[str, Any] = yaml.safe_load(self.epp_config_text)
        return doc

    @property
    def pool_name(self) -> str:
        return str(self.pool["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.pool["metadata"]["namespace"])

    @property
    def target_port(self) -> int:
        return int(self.pool["spec"]["targetPorts"][0]["number"])

    @property
    def selector(self) -> dict[str, str]:
        return dict(self.pool["spec"]["selector"]["matchLabels"])

    @property
    def label_selector(self) -> str:
        """`selector` as the API server's `labelSelector` query (and kubectl's `-l`) reads it."""
        return ",".join(f"{k}={v}" for k, v in self.selector.items())

    @property
    def service_account(self) -> str:
        return str(self.epp_deployment["spec"]["template"]["spec"]["serviceAccountName"])

    @property
    def replicas(self) -> int:
        return int(self.model_deployment["spec"]["replicas"])

    @property
    def has_front(self) -> bool:
        """True when a container other than vLLM owns the pool's target port (the cache front)."""
        containers = self.model_deployment["spec"]["template"]["spec"]["containers"]
        return len(containers) > 1

"""The parts of each rendered pod a `podTemplate` overlay may not touch."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from promptcache.contract.names import (
    API_GROUP,
    SALT_KEY_MOUNT_DIR,
    SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR,
)


class Container(StrEnum):
    """The containers the operator renders: the renderer names them, the operator finds
    them in pod statuses, the harness finds them in rendered pods, the API refuses an
    overlay naming one it may not."""

    VLLM = "vllm"
    CACHE_FRONT = "cache-front"
    EPP = "epp"
    GATEWAY_POLICY = "gateway-policy"
    """The policy step beside the Endpoint Picker (it was the session shim)."""


class Command(StrEnum):
    """The `promptcache` sub-commands containers run (their first argument): the rendered
    pods' and the operator chart's. The CLI registers each under this name."""

    FRONT = "front"
    GATEWAY_POLICY = "gateway-policy"
    RUN = "run"
    """The operator (the chart's Deployment)."""
    CATALOG = "catalog"
    """The model-list responder (the chart's `model-list.yaml`)."""


@dataclass(frozen=True)
class OwnedPodParts:
    """What the operator renders into one pod; a user's `podTemplate` adds around it.

    The renderer's tests check every name it writes is listed here, so the API can refuse an
    overlay that would replace one (strategic merge would silently win otherwise)."""

    container: str
    """The one container an overlay may extend (env, volumeMounts)."""
    other_containers: tuple[str, ...]
    """Containers the overlay may not name at all."""
    volumes: tuple[str, ...]
    mount_paths: tuple[str, ...]
    env: tuple[str, ...]


OPERATOR_POD_LABELS: Final[tuple[str, ...]] = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "llm-d.ai/engine-type",
)
"""Pod labels the operator sets: the Deployment's selector and the InferencePool match them."""

OPERATOR_ANNOTATION_PREFIX: Final[str] = f"{API_GROUP}/"
"""Pod annotations under this prefix are the operator's (e.g. the Endpoint Picker's config
hash, which rolls its pods out when the config changes)."""

MODEL_CACHE_MOUNT_PATH: Final[str] = "/model-cache"
"""Where the vllm container mounts the model cache (`HF_HOME`; a claim when
`model.modelCache.claimName` names one): adapters may live there too."""

MODEL_SERVER_POD: Final[OwnedPodParts] = OwnedPodParts(
    container=Container.VLLM.value,
    other_containers=(Container.CACHE_FRONT.value,),
    volumes=("dshm", "model-cache", "tmp", "salt-key"),
    mount_paths=("/dev/shm", MODEL_CACHE_MOUNT_PATH, "/tmp"),
    env=("HF_HOME", "HOME", "VLLM_NO_USAGE_STATS", "HF_TOKEN", SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR),
)
GO_MEMORY_LIMIT_ENV: Final[str] = "GOMEMLIMIT"
"""The Go runtime's soft memory limit, which the renderer sets on promptcache's picker."""
GO_GC_PERCENT_ENV: Final[str] = "GOGC"
"""The Go collector's heap growth between collections, which the renderer sets on
promptcache's picker beside its memory limit."""
ENDPOINT_PICKER_POD: Final[OwnedPodParts] = OwnedPodParts(
    container=Container.EPP.value,
    other_containers=(Container.GATEWAY_POLICY.value,),
    volumes=("config", "salt-key"),
    mount_paths=("/config", SALT_KEY_MOUNT_DIR),
    env=("NAMESPACE", "POD_NAME", GO_MEMORY_LIMIT_ENV, GO_GC_PERCENT_ENV),
)

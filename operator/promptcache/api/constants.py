"""Identity of the resource and the pinned defaults every other module reads."""

from __future__ import annotations

from typing import Final

from promptcache._version import __version__
from promptcache.contract.names import API_GROUP, DEFAULT_IMAGE_REGISTRY

GROUP: Final[str] = API_GROUP
VERSION: Final[str] = "v1alpha1"
API_VERSION: Final[str] = f"{GROUP}/{VERSION}"
KIND: Final[str] = "PromptCacheDeployment"
PLURAL: Final[str] = "promptcachedeployments"
SINGULAR: Final[str] = "promptcachedeployment"
SHORT_NAMES: Final[tuple[str, ...]] = ("pcd",)
CATEGORIES: Final[tuple[str, ...]] = ("promptcache",)
CRD_NAME: Final[str] = f"{PLURAL}.{GROUP}"

DEFAULT_VLLM_IMAGE: Final[str] = "vllm/vllm-openai:v0.33.0"
"""Pinned, never `latest`: a model server that changes under a rollout is an outage."""
OPERATOR_IMAGE_REPOSITORY: Final[str] = "promptcache-operator"
FRONT_IMAGE_REPOSITORY: Final[str] = "promptcache-front"
DEFAULT_FRONT_IMAGE: Final[str] = f"{DEFAULT_IMAGE_REGISTRY}/{FRONT_IMAGE_REPOSITORY}:{__version__}"
"""The cache-front image the Dockerfile's `front` target publishes, tagged with this version."""
DEFAULT_GATEWAY_POLICY_IMAGE: Final[str] = (
    f"{DEFAULT_IMAGE_REGISTRY}/{OPERATOR_IMAGE_REPOSITORY}:{__version__}"
)
"""The Endpoint Picker's gateway policy step runs from the operator image (its `gateway` extra):
no torch, and one image less to publish and pin."""

DEFAULT_MODEL_SERVER_USER: Final[int] = 1000
"""UID the vLLM container runs as unless configured: the upstream image declares no user."""

DEFAULT_BLOCK_SIZE_TOKENS: Final[int] = 64
"""`prefixCache.blockSizeTokens` (and a tier's) when empty: always written into the picker's
config, so a picker's own default (GIE's is 16) never applies."""

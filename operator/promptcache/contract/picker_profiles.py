"""One row per Endpoint Picker: what each picker is, has and cannot do, written once.

Beside the enum it describes (`contract.picker`), so everything that names a picker finds
its facts here: the API's rules (what the API server refuses for a picker), the renderer
(its image, config dialect, session plugin, flags, whether the gateway's policy step fronts
it), the status (the block size and index capacity it really uses), the docs table and the
test harness all read `PROFILES`; none of them names a picker by its string or repeats one
of these numbers. A fourth picker is one more row.

    >>> PROFILES[PickerTarget.LLM_D_ROUTER].effective_block_size(16)
    64
    >>> Feature.SESSION_AFFINITY in PROFILES[PickerTarget.GIE].features
    False
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from promptcache._version import __version__
from promptcache.contract.names import DEFAULT_IMAGE_REGISTRY
from promptcache.contract.picker import PickerTarget
from promptcache.contract.session import SESSION_AFFINITY_PLUGIN

__all__ = [
    "DEFAULT_LRU_CAPACITY_PER_SERVER",
    "PROFILES",
    "SESSION_FILTER",
    "Feature",
    "PickerProfile",
    "lacking",
    "profile_of",
]

DEFAULT_LRU_CAPACITY_PER_SERVER: Final[int] = 31250
"""The approximate prefix producer's own per-pod capacity (both GIE v1.5.0 and
llm-d-router), and so `prefixCache.lruCapacityPerServer` when empty."""
PICKER_IMAGE_REPOSITORY: Final[str] = "promptcache-picker"

LLM_D_ROUTER_CONFIG_API_VERSION: Final[str] = "llm-d.ai/v1alpha1"
GIE_CONFIG_API_VERSION: Final[str] = "inference.networking.x-k8s.io/v1alpha1"
"""The only config apiVersion GIE v1.5.0 decodes (llm-d-router's is refused there)."""
SESSION_FILTER: Final[str] = "session-affinity-filter"
"""llm-d-router's session plugin (an Alpha plugin: `--allow-experimental-plugins`)."""


class Feature(StrEnum):
    """What a picker may have; the API refuses a field whose feature the picker lacks."""

    SESSION_AFFINITY = "session affinity"
    """A session-affinity plugin (`sessionAffinity.enabled`)."""
    PREFIX_TIERS = "prefix tiers"
    """One prefix attribute per producer, so tiers do not overwrite each other
    (`prefixCache.tiers`)."""
    TOKEN_PRODUCER = "token producer"  # noqa: S105 - a feature name
    """A token-producer plugin, so the prefix producer can hash vLLM's tokens
    (`prefixCache.tokenProducer: VllmRender`)."""
    LRU_CAPACITY = "LRU capacity"
    """The per-pod index honours `prefixCache.lruCapacityPerServer` (without it: its own
    default, or `num_gpu_blocks` under autoTune)."""
    TENANT_SALT = "tenant salt"
    """Derives the tenant's salt itself (promptcache's tenant-salt parser)."""
    PREDICTED_MATCH = "predicted match"
    """Signs its predicted prefix match for the chosen pod (issue 39)."""
    BODY_BOUNDS = "body bounds"
    """Bounds request bodies with the front's limits (`PickerFlag`)."""
    EXPERIMENTAL_FLAG = "experimental flag"
    """Loads Alpha plugins only with `--allow-experimental-plugins`."""


@dataclass(frozen=True)
class PickerProfile:
    """One Endpoint Picker release: its image, its prefix-cache numbers, its plugins."""

    picker: PickerTarget
    about: str
    """How messages and docs name it beside its value."""
    image: str
    """The pinned release `gateway.eppImage` defaults to."""
    config_api_version: str
    """The `EndpointPickerConfig` apiVersion it decodes (its config dialect)."""
    min_block_size_tokens: int
    """Block sizes below this are raised to it, configured or auto-tuned (1: no floor)."""
    default_lru_capacity: int
    """Per-pod index capacity it uses when it does not take the configured one."""
    features: frozenset[Feature]
    session_plugin: str | None
    """The plugin type it pins sessions with (None: no session plugin; the row has
    `Feature.SESSION_AFFINITY` exactly when it has one)."""
    policy_step: bool
    """Whether the gateway's policy step fronts it (when isolation derives salts or the body
    names sessions): it cannot derive the tenant's salt itself."""

    def __post_init__(self) -> None:
        if (self.session_plugin is not None) != (Feature.SESSION_AFFINITY in self.features):
            raise ValueError(f"{self.picker}: a session plugin exactly with session affinity")

    @property
    def name(self) -> str:
        return self.picker.value

    @property
    def gie_based(self) -> bool:
        """GIE v1.5.0's picker underneath: its config dialect, plugins and limits."""
        return self.config_api_version == GIE_CONFIG_API_VERSION

    def effective_block_size(self, requested: int) -> int:
        """The block size the picker uses for `requested` tokens."""
        return max(requested, self.min_block_size_tokens)

    def block_size(self, *, auto_tune: bool, configured: int, scraped: int | None) -> int:
        """autoTune off: the configured size; on: the pods' size once seen, else the
        configured one; either way after the floor."""
        chosen = scraped if auto_tune and scraped is not None and scraped > 0 else configured
        return self.effective_block_size(chosen)

    def index_capacity(self, *, auto_tune: bool, configured: int, gpu_blocks: int | None) -> int:
        """Blocks the picker's approximate index keeps per pod: under autoTune the pods'
        `num_gpu_blocks` when reported, else the configured capacity (if the picker honours
        it, else its own default)."""
        if auto_tune and gpu_blocks is not None and gpu_blocks > 0:
            return gpu_blocks
        return configured if Feature.LRU_CAPACITY in self.features else self.default_lru_capacity

    @property
    def honours_lru_capacity(self) -> bool:
        return Feature.LRU_CAPACITY in self.features


_GIE_FEATURES: Final = frozenset[Feature]()
"""GIE v1.5.0's picker: none of the optional features (one shared prefix attribute, no
token producer, its own LRU, no session plugin)."""

PROFILES: Final[dict[PickerTarget, PickerProfile]] = {
    p.picker: p
    for p in (
        PickerProfile(
            picker=PickerTarget.LLM_D_ROUTER,
            about="llm-d-router v0.10.0",
            image="ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.10.0",
            # the release the generated EndpointPickerConfig is verified against
            config_api_version=LLM_D_ROUTER_CONFIG_API_VERSION,
            min_block_size_tokens=64,  # raises smaller prefix block sizes to 64 (#1158)
            default_lru_capacity=DEFAULT_LRU_CAPACITY_PER_SERVER,
            features=frozenset(
                {
                    Feature.SESSION_AFFINITY,
                    Feature.PREFIX_TIERS,
                    Feature.TOKEN_PRODUCER,
                    Feature.LRU_CAPACITY,
                    Feature.EXPERIMENTAL_FLAG,
                }
            ),
            session_plugin=SESSION_FILTER,
            policy_step=True,
        ),
        PickerProfile(
            picker=PickerTarget.GIE,
            about="the upstream GIE v1.5.0 picker",
            image="registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0",  # its chart's
            config_api_version=GIE_CONFIG_API_VERSION,
            min_block_size_tokens=1,
            default_lru_capacity=DEFAULT_LRU_CAPACITY_PER_SERVER,
            features=_GIE_FEATURES,
            session_plugin=None,
            policy_step=True,
        ),
        PickerProfile(
            picker=PickerTarget.PROMPTCACHE,
            about="promptcache's build of GIE v1.5.0's picker",
            # `picker/`, the Dockerfile's `picker` target, tagged with this version
            image=f"{DEFAULT_IMAGE_REGISTRY}/{PICKER_IMAGE_REPOSITORY}:{__version__}",
            config_api_version=GIE_CONFIG_API_VERSION,
            min_block_size_tokens=1,
            default_lru_capacity=DEFAULT_LRU_CAPACITY_PER_SERVER,
            features=_GIE_FEATURES
            | {
                Feature.SESSION_AFFINITY,
                Feature.TENANT_SALT,
                Feature.PREDICTED_MATCH,
                Feature.BODY_BOUNDS,
            },
            session_plugin=SESSION_AFFINITY_PLUGIN,
            policy_step=False,
        ),
    )
}
"""Every picker `spec.gateway.picker` may name (a test holds the keys to the enum)."""


def profile_of(picker: PickerTarget | str) -> PickerProfile:
    """The row of `picker` (its enum member or value)."""
    return PROFILES[PickerTarget(picker)]


def lacking(feature: Feature) -> tuple[PickerTarget, ...]:
    """The pickers without `feature`, in the enum's order: those the API refuses it for."""
    return tuple(p for p in PickerTarget if feature not in PROFILES[p].features)

"""The observed state of a PromptCacheDeployment, written only by the operator.

Condition types and reasons are named constants so the controller, the tests
and users' alerting agree on spelling.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field

from promptcache.api.base import ApiModel
from promptcache.api.spec import MAX_ADAPTERS


class ConditionType:
    READY: Final[str] = "Ready"
    PROGRESSING: Final[str] = "Progressing"
    DEGRADED: Final[str] = "Degraded"
    GATEWAY_READY: Final[str] = "GatewayReady"
    MONITORING_READY: Final[str] = "MonitoringReady"
    """Present only while monitoring is enabled (spec.monitoring.enabled or the default)."""
    DEPRECATED_FIELDS: Final[str] = "DeprecatedFields"
    """Retired: the API has no deprecated names left. Only so the operator removes the
    condition where an older one wrote it; never set."""
    CACHE_DELIVERING: Final[str] = "CacheDelivering"
    """Present only while the ladder has a sample (`status.cache`): False when the engines
    deliver far less of the prompt from cache than the picker predicted."""


class Reason:
    """CamelCase reasons, as Kubernetes conditions require."""

    AVAILABLE: Final[str] = "Available"
    RECONCILED: Final[str] = "Reconciled"
    ROLLING_OUT: Final[str] = "RollingOut"
    REPLICAS_NOT_READY: Final[str] = "ReplicasNotReady"
    SCALED_TO_ZERO: Final[str] = "ScaledToZero"
    SECRET_NOT_FOUND: Final[str] = "SecretNotFound"  # noqa: S105 - a reason, not a secret
    INSUFFICIENT_GPUS: Final[str] = "InsufficientGPUs"
    NAME_TOO_LONG: Final[str] = "NameTooLong"
    INVALID_SPEC: Final[str] = "InvalidSpec"
    APPLY_FAILED: Final[str] = "ApplyFailed"
    CRD_NOT_INSTALLED: Final[str] = "CRDNotInstalled"
    NO_ROUTE: Final[str] = "NoRoute"
    AS_EXPECTED: Final[str] = "AsExpected"
    # Why model-server pods are not ready, read from the pods (controller/diagnose.py).
    IMAGE_PULL_BACK_OFF: Final[str] = "ImagePullBackOff"
    CRASH_LOOP_BACK_OFF: Final[str] = "CrashLoopBackOff"
    CONTAINER_CONFIG_ERROR: Final[str] = "CreateContainerConfigError"
    UNSCHEDULABLE: Final[str] = "Unschedulable"
    LOADING_WEIGHTS: Final[str] = "LoadingWeights"
    CONTAINERS_NOT_READY: Final[str] = "ContainersNotReady"
    PODS_STARTING: Final[str] = "PodsStarting"
    # GatewayReady from the Gateway controller's own verdict (controller/gateway_status.py).
    ACCEPTED: Final[str] = "Accepted"
    ROUTE_NOT_ACCEPTED: Final[str] = "RouteNotAccepted"
    ROUTE_REFS_NOT_RESOLVED: Final[str] = "RouteRefsNotResolved"
    ROUTE_PENDING: Final[str] = "RoutePending"
    POOL_NOT_ACCEPTED: Final[str] = "PoolNotAccepted"
    POOL_REFS_NOT_RESOLVED: Final[str] = "PoolRefsNotResolved"
    POOL_PENDING: Final[str] = "PoolPending"
    # MonitoringReady.
    POD_MONITORS_APPLIED: Final[str] = "PodMonitorsApplied"
    PROMETHEUS_OPERATOR_NOT_INSTALLED: Final[str] = "PrometheusOperatorNotInstalled"
    # CacheDelivering (controller/ladder.py).
    AS_PREDICTED: Final[str] = "AsPredicted"
    DELIVERED_BELOW_PREDICTED: Final[str] = "DeliveredBelowPredicted"


class AdapterReason:
    """Why an adapter is, or is not, served (`status.adapters[].reason`), CamelCase."""

    SERVED: Final = "Served"
    """Every ready pod lists it in its `/v1/models`, loaded from the source the spec names."""
    NOT_ON_EVERY_POD: Final = "NotOnEveryPod"
    """Some ready pods do not serve it as the spec names it (a rollout that adds or replaces
    it is under way)."""
    PENDING: Final = "Pending"
    """No ready pod yet, and no pod said it failed on this adapter."""
    NOT_FOUND: Final = "AdapterNotFound"
    """vLLM found no adapter at the path, or could not download the repository."""
    RANK_OVER_LIMIT: Final = "RankOverLimit"
    """The adapter's rank is above `engine.maxLoraRank`."""
    LOAD_FAILED: Final = "LoadFailed"
    """vLLM refused the adapter for another reason (its message is in the status)."""


AdapterReasonName = Literal[
    "Served", "NotOnEveryPod", "Pending", "AdapterNotFound", "RankOverLimit", "LoadFailed"
]
"""The values of `AdapterReason` (a test keeps the two equal)."""


class Condition(ApiModel):
    """A standard Kubernetes condition (metav1.Condition)."""

    type: Annotated[str, Field(min_length=1, max_length=316)]
    status: Literal["True", "False", "Unknown"]
    reason: Annotated[
        str,
        Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"),
    ]
    message: Annotated[str, Field(max_length=32768)] = ""
    last_transition_time: str
    observed_generation: Annotated[int, Field(ge=0)] | None = None


class PromptEmbedsStatus(ApiModel):
    """The real memory ceiling of the prompt-embeds caches (spec/000: one cache per process)."""

    per_pod_bytes: int = 0
    total_bytes: int = 0
    per_pod: str = "0"
    """Human-readable per-pod ceiling, e.g. `8Gi`."""


class PrefixCacheStatus(ApiModel):
    """What the pods report about their prefix caches (from `vllm:*` metrics), and what the
    Endpoint Picker makes of the spec and those reports."""

    block_size: int | None = None
    """`block_size` of `vllm:cache_config_info` (the most common across ready pods)."""
    num_gpu_blocks: int | None = None
    """`num_gpu_blocks` of `vllm:cache_config_info` (smallest across ready pods)."""
    effective_block_size_tokens: int | None = None
    """The block size the Endpoint Picker uses: `prefixCache.blockSizeTokens` without autoTune;
    with it the pods' `blockSize` once scraped; either raised to the picker's floor (64 for
    llm-d-router)."""
    index_capacity_per_pod: int | None = None
    """Blocks the Endpoint Picker's prefix index keeps per pod: `numGpuBlocks` under autoTune
    once scraped, else `prefixCache.lruCapacityPerServer`."""
    hit_ratio: Annotated[float, Field(ge=0, le=1)] | None = None
    """`vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total` over ready pods,
    since each pod started (lifetime)."""
    recent_hit_ratio: Annotated[float, Field(ge=0, le=1)] | None = None
    """The same ratio over the last `recentWindowSeconds` only: counter increases between the
    operator's scrapes (one per resync) inside a 5-minute window. Absent when no prefix-cache
    query happened in the window."""
    recent_window_seconds: int | None = None
    """The span `recentHitRatio` really covers (up to 5 minutes plus one resync period)."""
    scraped_pods: int = 0


Ratio = Annotated[float, Field(ge=0, le=1)]
LossName = Literal["None", "Workload", "Capacity", "Routing", "Delivery"]
"""The rung a loss is charged to (`CacheLadderStatus.largestLoss`)."""


class CacheLadderStatus(ApiModel):
    """Why the hit ratio is what it is: four rungs, each a share of the prompt tokens of the
    last `windowSeconds` (from the cache fronts' counters, issue 39), each at most the one
    before it in a working pool; the largest step down is the loss, named in `message`."""

    workload: Ratio | None = None
    """What a perfect, infinitely large cache could have served: the prefix was seen before
    in the window, in the pool, in the same isolation scope (the picker's window)."""
    capacity: Ratio | None = None
    """What a cache of the pods' real KV size could have served (the picker's LRU
    simulation of the pool)."""
    routing: Ratio | None = None
    """What the picker predicted the chosen pod holds (its prefix index)."""
    delivered: Ratio | None = None
    """What the engines served from their prefix cache (vLLM's `cached_tokens`)."""
    prompt_tokens: int = 0
    """The prompt tokens the rungs are shares of (requests the picker predicted)."""
    window_seconds: int | None = None
    largest_loss: LossName = "None"
    message: Annotated[str, Field(max_length=2048)] = ""
    """One sentence: the rungs, the largest loss and what to change."""


class AdapterStatus(ApiModel):
    """Where one `model.adapters[]` entry is served, and why not where it is not."""

    name: Annotated[str, Field(min_length=1, max_length=256)]
    ready_replicas: Annotated[int, Field(ge=0)] = 0
    """Ready model-server pods whose `/v1/models` lists the adapter's name (during a rollout
    that replaces it, some may still serve its older source)."""
    reason: AdapterReasonName = "Pending"
    message: Annotated[str, Field(max_length=2048)] = ""


class GatewayStatus(ApiModel):
    """Where clients reach the model, as the parent Gateways report it."""

    addresses: Annotated[list[Annotated[str, Field(max_length=253)]], Field(max_length=16)] = Field(
        default_factory=list
    )
    """`status.addresses[].value` of the Gateways the HTTPRoute attaches to."""


class PromptCacheDeploymentStatus(ApiModel):
    """Filled by the operator."""

    observed_generation: int | None = None
    conditions: Annotated[list[Condition], Field(max_length=16)] = Field(default_factory=list)
    replicas: int = 0
    ready_replicas: int = 0
    selector: str = ""
    """Label selector of the model-server pods, for the scale subresource."""
    prompt_embeds: PromptEmbedsStatus = Field(default_factory=PromptEmbedsStatus)
    prefix_cache: PrefixCacheStatus = Field(default_factory=PrefixCacheStatus)
    cache: CacheLadderStatus | None = None
    """The hit-ratio ladder over the recent window, once the fronts have counted requests
    the picker predicted (promptcache's picker, a salting isolation mode)."""
    gateway: GatewayStatus | None = None
    """Present once a parent Gateway reports an address."""
    adapters: Annotated[list[AdapterStatus], Field(max_length=MAX_ADAPTERS)] | None = None
    """Present only with `model.adapters`: one entry per adapter, in its order, saying on how
    many ready pods it is served and, where it is not, why (read from the pods'
    `/v1/models` and from what vLLM said when it stopped)."""

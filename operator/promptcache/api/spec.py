"""The desired state of a PromptCacheDeployment: one model per concern.

Every default, bound and enum a user can meet lives here; the CRD schema, the
docs table and the renderer all derive from these classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, Strict, model_validator

from promptcache._version import __version__
from promptcache.api.base import (
    ApiModel,
    DnsLabel,
    HeaderName,
    ImageRef,
    ObjectName,
    OptionalBodyField,
    OptionalHeaderName,
    Quantity,
)
from promptcache.api.constants import DEFAULT_BLOCK_SIZE_TOKENS, DEFAULT_VLLM_IMAGE
from promptcache.api.podtemplate import GatewayPodTemplate, ModelPodTemplate
from promptcache.api.rules import default_max_loras, enforce_rules
from promptcache.contract import (
    DEFAULT_CACHED_PROMPT_TOKENS_HEADER,
    DEFAULT_ISOLATION_FIELD,
    DEFAULT_ISOLATION_HEADER,
    DEFAULT_LRU_CAPACITY_PER_SERVER,
    DEFAULT_PROMPT_TOKENS_HEADER,
    DEFAULT_SESSION_HEADER,
    MAX_CACHE_GIB,
    PROFILES,
    SALT_KEY_SECRET_KEY,
    IsolationMode,
    PickerTarget,
    needs_salt_key,
)
from promptcache.contract.engine import (
    VLLM_DEFAULT_BLOCK_SIZE,
    VLLM_DEFAULT_MAX_LORA_RANK,
    VLLM_LORA_RANKS,
)
from promptcache.contract.front import (
    DEFAULT_ALLOW_CLIENT_PRIORITY,
    DEFAULT_ALLOW_ENGINE_STATE,
    DEFAULT_BODY_TIMEOUT_SECONDS,
    DEFAULT_FAIR_SHARE_BYTES_PER_SECOND,
    DEFAULT_HEADER_TIMEOUT_SECONDS,
    DEFAULT_IDENTITY_BEARER,
    DEFAULT_IDENTITY_HEADER,
    DEFAULT_IDENTITY_REQUIRED,
    DEFAULT_MAX_BODY_READS,
    DEFAULT_MAX_PROMPT_EMBEDS_REFERENCES,
    DEFAULT_SEND_BUFFER_BYTES,
    DEFAULT_TENANT_SHARE_PERCENT,
    DEFAULT_WRITE_TIMEOUT_SECONDS,
    MIN_MAX_BODY_BYTES,
    MIN_SEND_BUFFER_BYTES,
)

IsolationModeName = Annotated[IsolationMode, Strict(False)]
"""The contract's enum; lax so YAML's plain string `PerKey` is accepted."""
FailureMode = Literal["FailOpen", "FailClose"]
PickerName = Annotated[PickerTarget, Strict(False)]
"""The contract's enum, like the isolation mode; lax so YAML's plain string is accepted."""
PullPolicy = Literal["Always", "IfNotPresent", "Never"]


class SecretKeyRef(ApiModel):
    """A key inside a Secret in the resource's namespace."""

    name: ObjectName
    """Name of the Secret."""
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")] = "token"
    """Key inside the Secret."""


class SaltSecretRef(SecretKeyRef):
    """The Secret holding the HMAC key that turns isolation keys into salts."""

    key: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")] = (
        SALT_KEY_SECRET_KEY
    )
    """Key inside the Secret."""


class Toleration(ApiModel):
    """A pod toleration, as in core/v1."""

    key: str | None = None
    """Taint key; empty with `Exists` tolerates everything."""
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None
    """How long a `NoExecute` taint is tolerated."""


GpuVendor = Literal["nvidia", "amd"]


class Resources(ApiModel):
    """Compute resources of one model-server pod."""

    gpus: Annotated[int, Field(ge=0, le=64)] = 1
    """GPUs per pod, requested as the vendor's device-plugin resource (`nvidia.com/gpu`,
    `amd.com/gpu`). Above 1, vLLM shards the model over them (`--tensor-parallel-size`).
    0 runs on CPU (tests, tiny models)."""
    gpu_vendor: GpuVendor | None = None
    """Whose GPUs: `nvidia` (NVIDIA device plugin; the default) or `amd` (ROCm device plugin;
    needs a ROCm build of vLLM in model.image). The pods tolerate the vendor's
    `<vendor>.com/gpu:NoSchedule` taint."""

    @property
    def vendor(self) -> GpuVendor:
        return self.gpu_vendor or "nvidia"

    gpu_product: Annotated[str, Field(min_length=1, max_length=63)] | None = None
    """A GPU model to schedule on, as the vendor's node labeller names it: NVIDIA GPU Feature
    Discovery's `nvidia.com/gpu.product` (e.g. `NVIDIA-H100-80GB-HBM3`) or the ROCm node
    labeller's `amd.com/gpu.product-name` (e.g. `AMD_Instinct_MI300X_OAM`)."""
    requests: dict[str, Quantity] = Field(default_factory=dict)
    """Extra resource requests, e.g. `cpu: "8"`, `memory: 64Gi`."""
    limits: dict[str, Quantity] = Field(default_factory=dict)
    """Extra resource limits. The GPU limit is set from `gpus`."""


class ModelCache(ApiModel):
    """Where model weights are cached, mounted at `HF_HOME`."""

    claim_name: ObjectName | None = None
    """An existing PersistentVolumeClaim to keep weights across restarts. Empty: an emptyDir."""
    size_limit: Quantity | None = None
    """Size limit of the emptyDir when no claim is named."""


AdapterName = Annotated[
    str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9][-A-Za-z0-9._:/@+]*$")
]
"""What clients put in `model`: it also becomes a header value and a metric label."""
MaxLoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
"""The ranks `--max-lora-rank` accepts: `contract.engine.VLLM_LORA_RANKS` (a test keeps the two
equal, and that one equal to vLLM's own)."""
MAX_ADAPTERS = 32


class LoraAdapter(ApiModel):
    """A LoRA adapter of the model, served by the same pods under a name of its own.

    vLLM loads it at start (`--lora-modules`); clients select it with `model: <name>`."""

    name: AdapterName
    """Name clients put in `model`; unique across model.servedModelName (else model.name) and
    the other adapters, and, behind a shared Gateway, across every resource on it."""
    path: Annotated[str, Field(min_length=2, max_length=1024, pattern=r"^/\S*$")] | None = None
    """Directory of the adapter (PEFT `adapter_config.json` and weights) inside the vllm
    container: under /model-cache (the model cache; a claim when modelCache.claimName is set)
    or under a volumeMount that model.podTemplate adds. Exactly one of path and
    huggingFaceRepo."""
    hugging_face_repo: (
        Annotated[
            str,
            Field(
                min_length=3,
                max_length=96,
                pattern=r"^[A-Za-z0-9][-A-Za-z0-9._]*/[A-Za-z0-9][-A-Za-z0-9._]*$",
            ),
        ]
        | None
    ) = None
    """A Hugging Face repository id (`org/name`) vLLM downloads at start into the model cache,
    with model.hfTokenSecretRef's token when set (vLLM reads one HF_TOKEN for the model and
    every adapter; for an adapter needing another token, put it on a volume and use path)."""
    rank: Annotated[int, Field(ge=1, le=max(VLLM_LORA_RANKS))] | None = None
    """The adapter's LoRA rank (`r` in its adapter_config.json). Only sizes the default of
    engine.maxLoraRank and checks a set one; vLLM refuses to load an adapter above it."""

    @model_validator(mode="after")
    def _rules(self) -> LoraAdapter:
        return enforce_rules(self, "adapter")

    @property
    def source(self) -> str:
        """What vLLM is given as the adapter's path: the directory or the repository id."""
        return self.path or self.hugging_face_repo or ""


class ModelSpec(ApiModel):
    """The model to serve and the pods that serve it."""

    name: Annotated[str, Field(min_length=1, max_length=512)]
    """Model to load: a Hugging Face id (`org/model`) or a URI/path `vllm serve` accepts."""
    served_model_name: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    """Name clients put in `model`. Defaults to `name`."""
    image: ImageRef = DEFAULT_VLLM_IMAGE
    """vLLM image. Pinned by default; pin yours too."""
    image_pull_policy: PullPolicy = "IfNotPresent"
    """When the kubelet pulls the vLLM image."""
    replicas: Annotated[int, Field(ge=0, le=1000)] = 1
    """Model-server pods. Also the scale subresource: `kubectl scale pcd/NAME --replicas N`."""
    resources: Resources = Field(default_factory=Resources)
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels the model-server pods require, e.g. a GPU product."""
    tolerations: Annotated[list[Toleration], Field(max_length=32)] = Field(default_factory=list)
    """Taints the model-server pods tolerate, e.g. a dedicated GPU pool's."""
    hf_token_secret_ref: SecretKeyRef | None = None
    """Secret holding a Hugging Face token, exposed as `HF_TOKEN`."""
    model_cache: ModelCache = Field(default_factory=ModelCache)
    pod_template: ModelPodTemplate | None = None
    """Merged onto each model-server pod (strategic merge): labels, annotations, affinity,
    topology spread, pull secrets, priority/runtime class, scheduler, volumes, and env and
    volumeMounts of the `vllm` container. The operator's parts cannot be overridden."""

    adapters: Annotated[list[LoraAdapter], Field(max_length=MAX_ADAPTERS)] = Field(
        default_factory=list
    )
    """LoRA adapters of the model, served by the same pods (`--enable-lora`); the engine's
    LoRA limits (engine.maxLoras, maxLoraRank, maxCpuLoras) default from this list, and the
    Endpoint Picker scores pods by the adapters they have loaded (`lora-affinity-scorer`)."""

    @model_validator(mode="after")
    def _rules(self) -> ModelSpec:
        return enforce_rules(self, "model")

    @property
    def effective_served_name(self) -> str:
        return self.served_model_name or self.name


class EnvVar(ApiModel):
    """A plain environment variable for the vLLM container."""

    name: Annotated[
        str, Field(min_length=1, max_length=256, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    ]
    value: str = ""


class EngineSpec(ApiModel):
    """vLLM engine settings that matter for caching."""

    api_server_count: Annotated[int, Field(ge=1, le=64)] = 1
    """vLLM API server processes per pod (`--api-server-count`). Each keeps its own caches."""
    block_size: Literal[8, 16, 32, 64, 128] = VLLM_DEFAULT_BLOCK_SIZE
    """KV-cache block size in tokens (`--block-size`); the Endpoint Picker tunes to it."""
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    """Fraction of GPU memory vLLM may use (`--gpu-memory-utilization`)."""
    max_model_len: Annotated[int, Field(ge=1)] | None = None
    """Context length cap (`--max-model-len`). Empty: the model's own."""
    max_num_seqs: Annotated[int, Field(ge=1, le=65536)] | None = None
    """Sequences vLLM runs at once (`--max-num-seqs`); more wait in its queue. Empty: vLLM's
    default, 256. The cache front's concurrency cap follows it unless
    `front.maxConcurrency` is set."""
    extra_args: Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=64)] = (
        Field(default_factory=list)
    )
    """Extra `vllm serve` arguments, appended last, one argv word per item. Flags the operator
    sets or relies on (port, host, prefix caching, block size, API-server count, served model
    name, tensor parallelism, ...) are refused in every spelling vLLM accepts."""
    env: Annotated[list[EnvVar], Field(max_length=64)] = Field(default_factory=list)
    """Extra environment for the vLLM container."""
    max_loras: Annotated[int, Field(ge=1, le=256)] | None = None
    """Adapters one batch can use at once (`--max-loras`); only with model.adapters. Empty:
    the number of adapters, at most 8 on GPUs; on CPU (resources.gpus 0) one more than the
    adapters, since vLLM's CPU build can give a base-model request the output of the adapter
    in the last slot while that slot is in use."""
    max_lora_rank: MaxLoraRank | None = None
    """Largest adapter rank the engine accepts (`--max-lora-rank`); only with model.adapters.
    Empty: the smallest allowed value at or above every model.adapters[].rank, else vLLM's 16."""
    max_cpu_loras: Annotated[int, Field(ge=1, le=1024)] | None = None
    """Adapters kept loaded in CPU memory (`--max-cpu-loras`); only with model.adapters. At
    least maxLoras and the number of adapters, so every listed adapter stays loaded. Empty:
    the larger of the two."""

    @model_validator(mode="after")
    def _rules(self) -> EngineSpec:
        return enforce_rules(self, "engine")


class PromptEmbedsSpec(ApiModel):
    """Prompt embeddings, and the cache that lets clients send them by identifier."""

    enabled: bool = False
    """Accept prompt embeddings (`--enable-prompt-embeds`)."""
    cache_gib: Annotated[float, Field(ge=0, le=MAX_CACHE_GIB, alias="cacheGiB")] = 1.0
    """Cache per serving process, in GiB (`SG_PROMPT_EMBEDS_CACHE_GIB`); 0 disables it.
    The real ceiling is `apiServerCount` x this per pod."""

    @property
    def effective_cache_gib(self) -> float:
        """What each front process is told: the size, or 0 when prompt embeds are off."""
        return self.cache_gib if self.enabled else 0.0


class IdentitySpec(ApiModel):
    """Isolation by account (spec/004: "separate caches for each account"): the cache scope
    follows who the caller is, not only the key it sends (docs/isolation.md).

    The gateway's policy step reads the account behind the gateway's authentication and
    signs it for the cache front; the front believes nothing else, so a client that
    reaches a pod directly with a forged header gets no account's scope. With an account,
    the salt derives from the account, and from the account and the key when a key is sent
    too (one account can still keep several scopes apart); without one, isolation is by key
    as before, in a scope no account shares."""

    header: OptionalHeaderName = DEFAULT_IDENTITY_HEADER
    """Header the gateway's authentication sets to the caller's user or tenant id (e.g.
    `x-user-id` written by a JWT or API-key filter from a verified claim). That filter must
    run before the Endpoint Picker's ext_proc filter and replace any copy a client sent.
    Empty: the account is not read from a header."""
    bearer_token: bool = DEFAULT_IDENTITY_BEARER
    """Name the account by the HMAC of the request's bearer token (`Authorization: Bearer
    ...`): whoever holds a token is its account. Used when `header` is empty or absent."""
    required: bool = DEFAULT_IDENTITY_REQUIRED
    """Refuse a request without an account with HTTP 401 (`identity_required`), at the
    gateway and at the front alike."""

    @property
    def enabled(self) -> bool:
        """Whether the deployment isolates by account at all."""
        return bool(self.header) or self.bearer_token


class IsolationSpec(ApiModel):
    """Tenant isolation of cached prompts by salt (spec/004 and spec/000)."""

    mode: IsolationModeName = IsolationMode.PER_KEY
    """`Shared`: one cache for all. `PerKey`: a key, when sent, isolates; requests without one
    share. `Required`: a request without a key is refused with HTTP 400. An empty key
    (header or field) counts as no key in every mode."""
    header: OptionalHeaderName = DEFAULT_ISOLATION_HEADER
    """Request header carrying the isolation key; empty to not read one."""
    body_field: OptionalBodyField = DEFAULT_ISOLATION_FIELD
    """Request body field carrying the isolation key; empty to not read one."""
    identity: IdentitySpec = Field(default_factory=IdentitySpec)
    """Isolation by account, beside (or instead of) the key."""
    salt_secret_ref: SaltSecretRef | None = None
    """Secret holding the salt HMAC key. Empty: the operator generates `<name>-salt` once."""
    honor_prompt_cache_max_len: bool | None = None
    """Honour `prompt_cache_max_len` from requests (0 makes a request uncacheable). The cache
    front does it, so empty means true with the front and false without; true without the
    front is refused (nothing would honour it)."""

    @model_validator(mode="after")
    def _rules(self) -> IsolationSpec:
        return enforce_rules(self, "isolation")


class SessionAffinitySpec(ApiModel):
    """Route requests of one session to one replica (spec/004 'cache locality').

    Rendered as llm-d-router's `session-affinity-filter` with `strategy: session_id`, or as
    the `promptcache` picker's own `promptcache-session-affinity` filter: a bound session is
    pinned to its replica whatever the load scorers say, until the replica leaves the pool.
    The upstream `gie-v1.5` picker has none (refused there)."""

    enabled: bool = False
    """Pin sessions to replicas (the Endpoint Picker's session-affinity filter)."""
    header: HeaderName = DEFAULT_SESSION_HEADER
    """Header carrying the session identifier."""
    use_user_field: bool = True
    """Also take the session from the body's `user` field when the header and
    `prompt_cache_key` name none."""
    ttl_seconds: Annotated[int, Field(ge=1, le=86400)] = 300
    """How long an idle session stays bound to its replica (each request renews it)."""


class ScorerWeights(ApiModel):
    """Weights of the Endpoint Picker's scorers (the llm-d defaults)."""

    prefix: Annotated[float, Field(ge=0, le=100)] = 3.0
    """Prefix-cache affinity: route to the pod most likely to hold the prompt's prefix."""
    queue: Annotated[float, Field(ge=0, le=100)] = 2.0
    """Queue depth: prefer pods with fewer waiting requests."""
    kv_cache: Annotated[float, Field(ge=0, le=100)] = 2.0
    """KV-cache utilisation: prefer pods with free cache."""
    lora_affinity: Annotated[float, Field(ge=0, le=100)] = 1.0
    """LoRA affinity (`lora-affinity-scorer`, from `vllm:lora_requests_info`): prefer pods with
    the request's adapter loaded, then pods with a free adapter slot. Used only when
    model.adapters is not empty."""


class PrefixCacheTier(ApiModel):
    """An extra named prefix-cache producer with its own scorer (spec/002's tiered example)."""

    name: DnsLabel
    """Names the tier's producer `<name>-producer` and scorer `<name>-scorer`."""
    auto_tune: bool = False
    """Tune this tier from pod metrics too (usually off: a tier exists to differ)."""
    block_size_tokens: Annotated[int, Field(ge=1, le=65536)] = DEFAULT_BLOCK_SIZE_TOKENS
    """Block size of this tier (llm-d-router raises it to 64 when smaller)."""
    lru_capacity_per_server: Annotated[int, Field(gt=0)] = DEFAULT_LRU_CAPACITY_PER_SERVER
    """Blocks this tier remembers per pod."""
    weight: Annotated[float, Field(ge=0, le=100)] = 1.0
    """Weight of this tier's scorer."""


TokenProducerName = Literal["Estimate", "VllmRender"]


class AffinityFilterSpec(ApiModel):
    """The Endpoint Picker's `prefix-cache-affinity-filter` (spec/002, both pickers): before
    the scorers, keep only the pods whose prefix match for the request reaches `threshold`
    (all pods when none does), so a prompt whose prefix a pod holds goes there and load
    only chooses among those pods."""

    enabled: bool = False
    threshold: Annotated[float, Field(ge=0, le=1)] = 0.8
    """Prefix-match share (0-1) at which a pod is kept (`affinityThreshold`)."""
    exploration_probability: Annotated[float, Field(ge=0, le=1)] = 0.01
    """Share of requests for which the filter keeps every pod, so other pods warm up too
    (`explorationProbability`)."""


class PrefixCacheSpec(ApiModel):
    """The Endpoint Picker's approximate prefix-cache routing (spec/002)."""

    auto_tune: bool = True
    """Take block size and per-pod capacity from the pods' `vllm:cache_config_info`."""
    block_size_tokens: Annotated[int, Field(ge=1, le=65536)] = DEFAULT_BLOCK_SIZE_TOKENS
    """Block size when not auto-tuned. llm-d-router raises anything below 64 to 64 (tuned
    sizes too); GIE v1.5 uses it as given. The generated config shows the effective value."""
    max_prefix_tokens_to_match: Annotated[int, Field(ge=0)] = 131072
    """Prefix tokens hashed per request; wins when > 0. 0: use `maxPrefixBlocksToMatch`."""
    max_prefix_blocks_to_match: Annotated[int, Field(ge=0)] = 2048
    """Prefix blocks hashed per request when `maxPrefixTokensToMatch` is 0."""
    lru_capacity_per_server: Annotated[int, Field(gt=0)] = DEFAULT_LRU_CAPACITY_PER_SERVER
    """Blocks remembered per pod when not auto-tuned."""
    weights: ScorerWeights = Field(default_factory=ScorerWeights)
    tiers: Annotated[list[PrefixCacheTier], Field(max_length=8)] = Field(default_factory=list)
    """Extra producer tiers, each with its own scorer."""
    token_producer: TokenProducerName | None = None
    """How the picker turns a prompt into the tokens its prefix producer hashes (spec/002's
    `token-producer`; llm-d-router only, GIE v1.5 hashes characters and has none).
    `Estimate`: the tokenizer-free estimate (about 4 bytes a token), what the picker does
    when nothing is configured. `VllmRender`: vLLM's own `/render` endpoints on the model
    servers (through the model Service and the cache front): real tokens, so blocks line
    up with vLLM's, at one more round trip per request. Empty: the picker's default (the
    estimate)."""
    affinity_filter: AffinityFilterSpec = Field(default_factory=AffinityFilterSpec)

    @model_validator(mode="after")
    def _rules(self) -> PrefixCacheSpec:
        return enforce_rules(self, "prefixCache")


class ParentRef(ApiModel):
    """A Gateway the HTTPRoute attaches to."""

    name: ObjectName
    """Name of the Gateway."""
    namespace: ObjectName | None = None
    """Namespace of the Gateway; the resource's own when empty."""
    section_name: DnsLabel | None = None
    """A listener of the Gateway."""


class RouteSpec(ApiModel):
    """The HTTPRoute in front of the InferencePool. No parent refs: no route."""

    parent_refs: Annotated[list[ParentRef], Field(max_length=32)] = Field(default_factory=list)
    hostnames: Annotated[list[Annotated[str, Field(max_length=253)]], Field(max_length=16)] = Field(
        default_factory=list
    )
    route_by_model: bool = False
    """Share the Gateway with other resources, told apart by the request's `model`: the route
    matches only requests whose `X-Gateway-Base-Model-Name` header is this resource's served
    model, as the body-based router sets it for the model and for its adapters (from the
    ConfigMap rendered beside the route). Needs the router in front of the Gateway (the chart's
    `bodyBasedRouter`; docs/multi-model.md). Off: the route takes every request on its
    Gateway and hostnames."""


class GatewaySizingSpec(ApiModel):
    """What the Endpoint Picker pod is sized for: its containers' CPU requests and the policy
    step's worker processes follow from the rate and the request size, by the CPU each
    request costs the picker and the step (measured: docs/endpoint-picker.md, 'Sizing')."""

    requests_per_second: Annotated[int, Field(ge=1, le=100_000)] = 100
    """Requests per second the pool's gateway routes at peak."""
    request_kib: Annotated[int, Field(ge=1, le=4 * 1024**2, alias="requestKiB")] = 8
    """Typical request body in KiB (the prompt: the picker hashes it, the step parses it)."""


def _epp_image_description() -> str:
    """`gateway.eppImage`'s description, naming each picker's pinned image from its row
    (this project's own without the tag: it is this release's)."""
    tag = f":{__version__}"
    images = [
        f"this release's\n`{p.image.removesuffix(tag)}`"
        if p.image.endswith(tag)
        else f"`{p.image}`"
        for p in PROFILES.values()
    ]
    listed = ",\n".join(images[:-1]) + ", or " + images[-1]
    return f"Endpoint Picker image. Empty: the pinned release of `picker`\n({listed})."


class GatewaySpec(ApiModel):
    """The InferencePool and its Endpoint Picker."""

    picker: PickerName | None = None
    """Which Endpoint Picker the generated config and Deployment are for: `promptcache`
    (promptcache's own build of GIE v1.5.0's picker: it derives the tenant's salt and pins
    sessions itself, so no gateway policy step runs in front of it; no prefix tiers),
    `llm-d-router` (v0.10.0, with the policy step in front) or `gie-v1.5` (the upstream
    Gateway API Inference Extension EPP v1.5.0, with the policy step in front; no session
    affinity and no prefix tiers). Empty: the operator's default (the chart's
    `defaultPicker`, flag `--picker`; `promptcache` unless changed)."""
    epp_image: Annotated[ImageRef | None, Field(description=_epp_image_description())] = None
    replicas: Annotated[int, Field(ge=1, le=5)] = 1
    """Endpoint Picker replicas; above 1 they elect a leader (approximate prefix indexes are
    per replica, so active-active would split them): more replicas add availability, not
    throughput (`sizing` does that)."""
    sizing: GatewaySizingSpec = Field(default_factory=GatewaySizingSpec)
    """The peak request rate and typical request size the Endpoint Picker pod is sized for."""
    failure_mode: FailureMode = "FailClose"
    """What the gateway does when the Endpoint Picker is unreachable."""
    extra_flags: Annotated[list[str], Field(max_length=32)] = Field(default_factory=list)
    """Extra Endpoint Picker flags, appended last (e.g. `-v=4`)."""
    gateway_policy_image: ImageRef | None = None
    """Image of the gateway's policy step, the Endpoint Picker pod's second container in
    front of `llm-d-router` and `gie-v1.5` when isolation is not `Shared` or sessions are on
    (it puts the tenant's salt and the session into the request before the Endpoint Picker
    routes; `promptcache`, the default, does that itself and has no step); the operator
    image runs it. Empty:
    the operator's default (the chart's `defaultImages.gatewayPolicy`, else the operator
    image of this release)."""

    route: RouteSpec = Field(default_factory=RouteSpec)
    pod_template: GatewayPodTemplate | None = None
    """Merged onto each Endpoint Picker pod, like model.podTemplate (the `epp` container)."""
    network_policy: bool = True
    """Render a NetworkPolicy that admits only the picker pod's served ports from any
    source: with `promptcache` (the default) ext_proc 9002, gRPC health 9003 and metrics
    9090; when the policy step fronts the picker also the step's metrics port, so the
    picker's inner ext_proc port (9012, plaintext, no bind-address flag on either picker)
    cannot be dialled from other pods, bypassing the policy step. NetworkPolicies add up: turn
    this off when a policy of your own already restricts ingress to the picker pods (ours
    would admit those ports from anywhere). Needs a CNI that enforces NetworkPolicy."""

    @model_validator(mode="after")
    def _rules(self) -> GatewaySpec:
        return enforce_rules(self, "gateway")


class UsageHeadersSpec(ApiModel):
    """Prompt and cached-prompt token counts on completion and chat answers (spec/004): response
    headers, or SSE comment lines before `data: [DONE]` when streaming."""

    enabled: bool = True
    prompt_tokens_header: HeaderName = DEFAULT_PROMPT_TOKENS_HEADER
    """Response header with the prompt's token count."""
    cached_prompt_tokens_header: HeaderName = DEFAULT_CACHED_PROMPT_TOKENS_HEADER
    """Response header with how many prompt tokens came from the cache."""


class FrontSpec(ApiModel):
    """The cache front: a small proxy in each model-server pod that applies the per-request
    rules (isolation salts, prompt embeds by reference, usage headers) before vLLM."""

    enabled: bool = True
    """Run the cache front; off serves vLLM directly (needs Shared isolation, no embeds cache,
    no usage headers)."""
    image: ImageRef | None = None
    """Cache-front image (the Dockerfile's `front` target). Empty: the operator's default
    (the chart's `defaultImages.front`, else the front image of this release)."""
    max_request_bytes: Annotated[int, Field(ge=MIN_MAX_BODY_BYTES, le=4 * 1024**3)] = 256 * 1024**2
    """Largest request body accepted (vLLM itself has no limit); larger gets HTTP 413."""
    max_concurrency: Annotated[int, Field(ge=1, le=65536)] | None = None
    """Requests one front process forwards to vLLM at once; more get HTTP 503
    (`front_overloaded`). Empty: `engine.maxNumSeqs` (vLLM's 256 when that is empty), so the
    front never refuses what vLLM would run or queue."""
    memory_budget_bytes: Annotated[int, Field(ge=1024**2, le=256 * 1024**3)] | None = None
    """Working memory one front process may hold for requests in flight: bodies as read,
    parsed JSON, verified and densified prompt embeds (TurboQuant sized from its header
    before decoding), every reference to a cached payload at its full size, forwarded
    copies. Beyond it requests get HTTP 503 (`memory_budget_exhausted`); one client gets at
    most `tenantSharePercent` of it while other clients hold some (429 beyond), and one
    request that could never fit in
    that share gets 413. Empty: max(1 GiB, 4 x 5 x maxRequestBytes, 5 x maxRequestBytes x
    100 / tenantSharePercent): four maximal requests, one within a client's share. The
    container's derived memory limit includes it."""
    max_concurrent_body_reads: Annotated[int, Field(ge=1, le=65536)] = DEFAULT_MAX_BODY_READS
    """Request bodies one front process receives at once, apart from `maxConcurrency`, so
    slow senders cannot take the slots of requests ready to run; more get HTTP 503
    (`body_reads_saturated`)."""
    header_timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = DEFAULT_HEADER_TIMEOUT_SECONDS
    """Time a connection has to deliver a request's headers, and how long an idle
    keep-alive connection stays open."""
    body_timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = DEFAULT_BODY_TIMEOUT_SECONDS
    """Time a request has to deliver its whole body; after it, HTTP 408 (`body_timeout`)."""
    write_timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = DEFAULT_WRITE_TIMEOUT_SECONDS
    """Longest the front waits for a client to read more of its answer (a stream or a large
    body); then the connection is cut and its concurrency slot freed, so clients that stop
    reading cannot hold `maxConcurrency`."""
    send_buffer_bytes: Annotated[int, Field(ge=MIN_SEND_BUFFER_BYTES, le=64 * 1024**2)] = (
        DEFAULT_SEND_BUFFER_BYTES
    )
    """Answer bytes the front queues per connection, beyond the kernel's socket buffer,
    before it waits for the client to read."""
    max_prompt_embeds_references: Annotated[int, Field(ge=1, le=1_000_000)] = (
        DEFAULT_MAX_PROMPT_EMBEDS_REFERENCES
    )
    """Prompt-embeds payloads and identifiers one request may carry; more get HTTP 400."""
    allow_client_priority: bool = DEFAULT_ALLOW_CLIENT_PRIORITY
    """Let clients set vLLM's scheduling priority (header `X-Vllm-Priority`, body `priority`).
    It only matters with `--scheduling-policy priority` in `engine.extraArgs`, where it lets a
    client's requests overtake other tenants' in vLLM's queue. Off: the front removes the
    header and refuses a non-zero `priority` (HTTP 400 `priority_not_allowed`)."""
    allow_engine_state: bool = DEFAULT_ALLOW_ENGINE_STATE
    """Let clients send the request fields that reach the model server's state beyond their
    own request (`previous_response_id`, `kv_transfer_params`, `vllm_xargs`, `session_id`):
    another stored response, remote KV blocks, plugin arguments, a session identity. Off:
    the front and the gateway's policy step refuse a non-null one (HTTP 400
    `field_not_allowed`). Turn on only where every client is trusted, or the deployment has
    one tenant."""
    fair_share_bytes_per_second: Annotated[int, Field(ge=0, le=64 * 1024**3)] = (
        DEFAULT_FAIR_SHARE_BYTES_PER_SECOND
    )
    """Each client's share of the work its request bodies cost, while other clients are
    active: what parsing its bodies materialises (about 50 bytes per JSON value; a text
    prompt about twice its length), per second, per front process and per gateway policy
    step process. A client over its share waits before its next body is read (at most
    10 s); past 16 waiting requests it gets HTTP 429 (`fair_share_exceeded`). A client
    alone is never slowed. Clients are told apart by the isolation header, else the
    Authorization header (in the policy step, first by the account header of
    `isolation.identity`): the share is as strong as that identity. 0: unmetered."""
    tenant_share_percent: Annotated[int, Field(ge=1, le=100)] = DEFAULT_TENANT_SHARE_PERCENT
    """The most one client may hold, in percent, while other clients hold some, of what
    each cache-front process and each gateway policy step worker bounds: concurrency slots
    (`maxConcurrency`), bodies being received (`maxConcurrentBodyReads`) and working memory
    (`memoryBudgetBytes`; the step's budget for bodies). A client alone may take all but
    the reserve below, and keeps what it took until those requests end; once another
    client holds something, a client over its share gets no more until it is back under
    it. A sixteenth of each is kept for clients holding little: a client
    holding h gets more only while min(h, that sixteenth) stays free, so a client asking
    for its first slot goes before one asking for its hundredth. Over it the client gets
    HTTP 429 (`tenant_share_exceeded`, with `Retry-After`); other clients are not refused
    for it. Clients are told apart by account (`isolation.identity`), else isolation key,
    else Authorization header, else connection source: a share is as strong as that
    identity. The derived memory budgets keep one maximal request within one client's
    share. 100: no shares and no reserve (one client may take all)."""
    usage_headers: UsageHeadersSpec = Field(default_factory=UsageHeadersSpec)
    resources: Resources = Field(
        default_factory=lambda: Resources(gpus=0, requests={"memory": "512Mi"})
    )
    """Front container resources. Without a CPU request, 500m per front process (one per
    vLLM API server, `engine.apiServerCount`): measured, a process spends 0.3-0.8 ms of CPU
    per answer, so that carries about 600-1600 answers a second (docs/cache-front.md). No
    CPU limit is set: a CFS quota would stall the front's bursts. Without a memory limit,
    one is derived from the prompt-embeds ceiling plus in-flight request bytes per process,
    so the cache cannot get the pod OOM-killed."""


class MonitoringSpec(ApiModel):
    """Scrape objects for the Prometheus Operator (docs/monitoring.md)."""

    enabled: bool | None = None
    """Render PodMonitors for the model servers' and the Endpoint Picker's metrics. Empty:
    the operator-wide default `--pod-monitors` (chart value `monitoring.podMonitorsByDefault`).
    Needs the Prometheus Operator CRDs; without them condition `MonitoringReady` says so."""
    interval: Annotated[str, Field(pattern=r"^([0-9]+(ms|s|m|h))+$", max_length=16)] = "30s"
    """Scrape interval of the PodMonitors."""


AutoscalingMetric = Literal["WaitingRequests", "KVCacheUsage"]


class AutoscalingSpec(ApiModel):
    """Scale the model servers on their own load (a HorizontalPodAutoscaler on this resource's
    scale subresource, fed per pod through the custom metrics API, e.g. by prometheus-adapter).

    While it is on, the autoscaler owns `model.replicas`: leave it out of GitOps diffs."""

    enabled: bool = False
    min_replicas: Annotated[int, Field(ge=1, le=1000)] = 1
    max_replicas: Annotated[int, Field(ge=1, le=1000)] = 4
    metric: AutoscalingMetric = "WaitingRequests"
    """`WaitingRequests`: vLLM's queue (`vllm:num_requests_waiting`) per pod.
    `KVCacheUsage`: vLLM's KV-cache usage (`vllm:kv_cache_usage_perc`, 1 = full) per pod."""
    target: Quantity | None = None
    """Average per pod to hold: waiting requests (default 2) or KV-cache usage (default 800m,
    i.e. 80 %)."""
    custom_metric_name: Annotated[str, Field(pattern=r"^[a-zA-Z_][a-zA-Z0-9_:]*$",
                                             max_length=253)] | None = None  # fmt: skip
    """Name of the metric in the custom metrics API. Default `vllm_num_requests_waiting` or
    `vllm_kv_cache_usage_perc`, the names the documented prometheus-adapter rule exposes."""
    scale_down_stabilization_seconds: Annotated[int, Field(ge=0, le=3600)] = 300
    """How long the load must stay low before pods are removed (model servers are slow to
    start, so scaling down eagerly costs more than it saves)."""

    @model_validator(mode="after")
    def _rules(self) -> AutoscalingSpec:
        return enforce_rules(self, "autoscaling")


class PromptCacheDeploymentSpec(ApiModel):
    """Everything a platform team sets to get cache-aware LLM serving."""

    model: ModelSpec
    engine: EngineSpec = Field(default_factory=EngineSpec)
    prompt_embeds: PromptEmbedsSpec = Field(default_factory=PromptEmbedsSpec)
    isolation: IsolationSpec = Field(default_factory=IsolationSpec)
    session_affinity: SessionAffinitySpec = Field(default_factory=SessionAffinitySpec)
    prefix_cache: PrefixCacheSpec = Field(default_factory=PrefixCacheSpec)
    gateway: GatewaySpec = Field(default_factory=GatewaySpec)
    front: FrontSpec = Field(default_factory=FrontSpec)
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec)
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)

    @model_validator(mode="after")
    def _rules(self) -> PromptCacheDeploymentSpec:
        return enforce_rules(self, "spec")

    @property
    def lora_limits(self) -> LoraLimits | None:
        """The engine's LoRA limits as rendered: set values, else derived from the adapters
        (None without adapters: LoRA stays off)."""
        return lora_limits(self)

    @property
    def needs_salt_key(self) -> bool:
        """The pods derive salts, so need the salt Secret (decided by the contract)."""
        return self.front.enabled and needs_salt_key(self.isolation.mode)

    @property
    def honors_prompt_cache_max_len(self) -> bool:
        """`isolation.honorPromptCacheMaxLen` resolved: only a running cache front honours it."""
        return self.front.enabled and self.isolation.honor_prompt_cache_max_len is not False


@dataclass(frozen=True)
class LoraLimits:
    """`--max-loras`, `--max-lora-rank`, `--max-cpu-loras` as the renderer writes them."""

    max_loras: int
    max_lora_rank: int
    max_cpu_loras: int


def default_max_lora_rank(ranks: list[int]) -> int:
    """The smallest rank vLLM accepts at or above every declared rank, else vLLM's default."""
    if not ranks:
        return VLLM_DEFAULT_MAX_LORA_RANK
    return min(r for r in VLLM_LORA_RANKS if r >= max(ranks))


def lora_limits(spec: PromptCacheDeploymentSpec) -> LoraLimits | None:
    adapters = spec.model.adapters
    if not adapters:
        return None
    engine = spec.engine
    max_loras = engine.max_loras or default_max_loras(len(adapters), spec.model.resources.gpus)
    rank = engine.max_lora_rank or default_max_lora_rank(
        [a.rank for a in adapters if a.rank is not None]
    )
    cpu = engine.max_cpu_loras or max(max_loras, len(adapters))
    return LoraLimits(max_loras=max_loras, max_lora_rank=rank, max_cpu_loras=cpu)

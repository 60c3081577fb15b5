"""The Endpoint Picker's configuration: an `EndpointPickerConfig` for the chosen picker.

Two targets (`spec.gateway.picker`): llm-d-router v0.10.0 and the upstream GIE EPP v1.5.0.
Every parameter emitted here is one the plugin's Go struct accepts (llm-d-router decodes
strictly and refuses to start on an unknown key; GIE decodes leniently, which would hide a
typo, so the same list guards both); the list is checked against
`harness/epp/accepted_parameters.json`, read from the sources (see docs/endpoint-picker.md).
Values are emitted as the picker will really use them, and the comments say only what that
picker does, so the config never promises what does not happen.
"""

from __future__ import annotations

from typing import Any, Final

from promptcache.api import PromptCacheDeployment
from promptcache.contract import (
    DEFAULT_MAX_SESSIONS,
    PREDICTED_MATCH_PLUGIN,
    SALT_KEY_FILE,
    SERVING_PORT,
    SESSION_AFFINITY_PLUGIN,
    TENANT_SALT_PARSER,
    PredictedMatchParam,
    SessionParam,
    TenantSaltParam,
    session_sources,
)
from promptcache.contract import PickerFeature as Feature
from promptcache.contract.picker_profiles import SESSION_FILTER
from promptcache.render.names import names_of
from promptcache.render.picker import PickerProfile, picker_of, picker_target
from promptcache.yamlio import dump

PREFIX_PRODUCER: Final[str] = "approx-prefix-cache-producer"
PREFIX_SCORER: Final[str] = "prefix-cache-scorer"
QUEUE_SCORER: Final[str] = "queue-scorer"
KV_CACHE_SCORER: Final[str] = "kv-cache-utilization-scorer"
LORA_SCORER: Final[str] = "lora-affinity-scorer"
"""Scores pods by the request's adapter from `vllm:lora_requests_info` (both pickers read that
metric by default and the plugin takes no parameters: GIE v1.5.0 and llm-d-router v0.10.0
`scorer/loraaffinity`)."""
AFFINITY_FILTER: Final[str] = "prefix-cache-affinity-filter"
"""Keeps only pods whose prefix match reaches a threshold (GIE v1.5.0
`filter/prefixcacheaffinity`: `affinityThreshold`, `explorationProbability`,
`maxTTFTPenaltyMs`; llm-d-router the same plugin)."""
TOKEN_PRODUCER: Final[str] = "token-producer"  # noqa: S105 - a plugin type
"""llm-d-router's producer of the tokens the prefix producer hashes (`estimate` unless a
`vllm` render backend is named)."""
PICKER: Final[str] = "max-score-picker"
PROFILE_HANDLER: Final[str] = "single-profile-handler"
PROFILE: Final[str] = "default"
ALPHA_PLUGINS: Final[frozenset[str]] = frozenset({SESSION_FILTER})
"""Plugins the EPP loads only with `--allow-experimental-plugins`."""


def _producer_parameters(
    picker: PickerProfile,
    *,
    auto_tune: bool,
    block_size_tokens: int,
    lru_capacity: int,
    max_tokens: int,
    max_blocks: int,
) -> dict[str, Any]:
    return {
        "autoTune": auto_tune,
        "blockSizeTokens": picker.effective_block_size(block_size_tokens),
        "maxPrefixTokensToMatch": max_tokens,
        "maxPrefixBlocksToMatch": max_blocks,
        "lruCapacityPerServer": lru_capacity,
    }


def endpoint_picker_config(pcd: PromptCacheDeployment) -> dict[str, Any]:
    """The config as an object; `endpoint_picker_config_text` adds explanatory comments."""
    prefix = pcd.spec.prefix_cache
    session = pcd.spec.session_affinity
    weights = prefix.weights
    picker = picker_target(pcd)
    plugins: list[dict[str, Any]] = [
        {
            "type": PREFIX_PRODUCER,
            "parameters": _producer_parameters(
                picker,
                auto_tune=prefix.auto_tune,
                block_size_tokens=prefix.block_size_tokens,
                lru_capacity=prefix.lru_capacity_per_server,
                max_tokens=prefix.max_prefix_tokens_to_match,
                max_blocks=prefix.max_prefix_blocks_to_match,
            ),
        },
        {"type": PREFIX_SCORER},
        {"type": QUEUE_SCORER},
        {"type": KV_CACHE_SCORER},
    ]
    adapters = bool(pcd.spec.model.adapters)
    if adapters:
        plugins.append({"type": LORA_SCORER})
    plugins += _token_producer(pcd)
    profile: list[dict[str, Any]] = []
    # The upstream GIE picker has no session plugin: the API refuses sessionAffinity there
    # (api/rules.py). promptcache's build has its own, a filter: first, so a pinned session
    # keeps its pod whatever the prefix filter or the scorers say (picker/README.md).
    session_plugin = picker_target(pcd).session_plugin if session.enabled else None
    if session_plugin == SESSION_AFFINITY_PLUGIN:
        plugins.append(
            {"type": SESSION_AFFINITY_PLUGIN, "parameters": session_affinity_parameters(pcd)}
        )
        profile.append({"pluginRef": SESSION_AFFINITY_PLUGIN})
    if session_plugin == SESSION_FILTER:
        plugins.append(
            {
                "type": SESSION_FILTER,
                "parameters": {
                    "strategy": "session_id",
                    "sessionIdConfig": {
                        "sources": [{"header": session.header}],
                        "evictionTtlSeconds": session.ttl_seconds,
                    },
                },
            }
        )
        profile.append({"pluginRef": SESSION_FILTER})
    affinity = prefix.affinity_filter
    if affinity.enabled:
        plugins.append(
            {
                "type": AFFINITY_FILTER,
                "parameters": {
                    "affinityThreshold": affinity.threshold,
                    "explorationProbability": affinity.exploration_probability,
                },
            }
        )
        profile.append({"pluginRef": AFFINITY_FILTER})
    for ref, weight in (
        (PREFIX_SCORER, weights.prefix),
        (QUEUE_SCORER, weights.queue),
        (KV_CACHE_SCORER, weights.kv_cache),
    ):
        profile.append({"pluginRef": ref, "weight": weight})
    if adapters:
        profile.append({"pluginRef": LORA_SCORER, "weight": weights.lora_affinity})
    for tier in prefix.tiers:
        producer, scorer = f"{tier.name}-producer", f"{tier.name}-scorer"
        plugins.append(
            {
                "name": producer,
                "type": PREFIX_PRODUCER,
                "parameters": _producer_parameters(
                    picker,
                    auto_tune=tier.auto_tune,
                    block_size_tokens=tier.block_size_tokens,
                    lru_capacity=tier.lru_capacity_per_server,
                    max_tokens=prefix.max_prefix_tokens_to_match,
                    max_blocks=prefix.max_prefix_blocks_to_match,
                ),
            }
        )
        plugins.append(
            {
                "name": scorer,
                "type": PREFIX_SCORER,
                "parameters": {"prefixMatchInfoProducerName": producer},
            }
        )
        profile.append({"pluginRef": scorer, "weight": tier.weight})
    plugins += [{"type": PICKER, "parameters": {"maxNumOfEndpoints": 1}}, {"type": PROFILE_HANDLER}]
    profile.append({"pluginRef": PICKER})
    config: dict[str, Any] = {
        "apiVersion": picker_target(pcd).config_api_version,
        "kind": "EndpointPickerConfig",
        "plugins": plugins,
        "schedulingProfiles": [{"name": PROFILE, "plugins": profile}],
    }
    if Feature.TENANT_SALT in picker_target(pcd).features:
        plugins.append({"type": TENANT_SALT_PARSER, "parameters": tenant_salt_parameters(pcd)})
        config["parser"] = {"pluginRef": TENANT_SALT_PARSER}
        if pcd.spec.front.enabled:  # the front checks what it signs
            plugins.append(predicted_match_plugin(PREFIX_PRODUCER))
    return config


def predicted_match_plugin(producer: str) -> dict[str, Any]:
    """The `promptcache` picker's plugin that signs, for the chosen pod, the prefix match
    it predicted, with the pool's workload and capacity estimates on `producer`'s blocks
    (issue 39: the front counts them against vLLM's cached tokens). Signed with the salt
    key, which the picker and the fronts then mount in every isolation mode
    (`render.front.signs_predictions`). The producer is the unnamed one (named by its
    type), which the main prefix scorer reads."""
    return {
        "type": PREDICTED_MATCH_PLUGIN,
        "parameters": {
            str(PredictedMatchParam.SALT_KEY_FILE): SALT_KEY_FILE,
            str(PredictedMatchParam.PRODUCER_NAME): producer,
        },
    }


def tenant_salt_parameters(pcd: PromptCacheDeployment) -> dict[str, Any]:
    """The `promptcache` picker's request parser: the cache front's own isolation settings,
    with the very values the front gets (`render.front`), so both derive one salt. Every
    parameter is written out (the parser decodes strictly: picker/README.md)."""
    spec = pcd.spec
    iso = spec.isolation
    params: dict[str, Any] = {
        TenantSaltParam.ISOLATION_MODE: iso.mode.value,
        TenantSaltParam.ISOLATION_HEADER: iso.header,
        TenantSaltParam.ISOLATION_FIELD: iso.body_field,
        TenantSaltParam.HONOR_MAX_LEN: spec.honors_prompt_cache_max_len,
        TenantSaltParam.ALLOW_CLIENT_PRIORITY: spec.front.allow_client_priority,
        TenantSaltParam.ALLOW_ENGINE_STATE: spec.front.allow_engine_state,
        TenantSaltParam.IDENTITY_HEADER: iso.identity.header if iso.identity.enabled else "",
        TenantSaltParam.IDENTITY_BEARER: iso.identity.enabled and iso.identity.bearer_token,
        TenantSaltParam.IDENTITY_REQUIRED: iso.identity.enabled and iso.identity.required,
    }
    if spec.needs_salt_key:
        params[TenantSaltParam.SALT_KEY_FILE] = SALT_KEY_FILE
    return {str(k): v for k, v in params.items()}


def session_affinity_parameters(pcd: PromptCacheDeployment) -> dict[str, Any]:
    """The `promptcache` picker's session plugin: `sessionAffinity` as the policy step
    reads it for llm-d-router (the header, then `prompt_cache_key`, then `user` when
    `useUserField`), pinned for `ttlSeconds`, at most `DEFAULT_MAX_SESSIONS` tracked. Every
    parameter is written out (the plugin decodes strictly and defaults none)."""
    session = pcd.spec.session_affinity
    params: dict[SessionParam, Any] = {
        SessionParam.HEADER: session.header,
        SessionParam.SOURCES: [s.value for s in session_sources(session.use_user_field)],
        SessionParam.TTL_SECONDS: session.ttl_seconds,
        SessionParam.MAX_SESSIONS: DEFAULT_MAX_SESSIONS,
    }
    return {str(k): v for k, v in params.items()}


def _token_producer(pcd: PromptCacheDeployment) -> list[dict[str, Any]]:
    """The explicit `token-producer`, when the resource names one (llm-d-router only: the
    API refuses VllmRender on GIE, and Estimate is what both do without one)."""
    chosen = pcd.spec.prefix_cache.token_producer
    if chosen is None or Feature.TOKEN_PRODUCER not in picker_target(pcd).features:
        return []
    if chosen == "Estimate":
        return [{"type": TOKEN_PRODUCER}]
    names = names_of(pcd)
    url = f"http://{names.model_server}.{names.namespace}.svc:{SERVING_PORT}"
    return [
        {
            "type": TOKEN_PRODUCER,
            "parameters": {
                "modelName": pcd.spec.model.effective_served_name,
                "vllm": {"url": url},
            },
        }
    ]


def needs_experimental_plugins(config: dict[str, Any]) -> bool:
    return any(plugin["type"] in ALPHA_PLUGINS for plugin in config["plugins"])


def _notes(pcd: PromptCacheDeployment) -> list[str]:
    prefix = pcd.spec.prefix_cache
    notes = [
        f"Generated by promptcache for {pcd.metadata.namespace}/{pcd.metadata.name} "
        f"(Endpoint Picker: {picker_of(pcd).value}); edits are reverted by the operator.",
    ]
    session = pcd.spec.session_affinity
    if session.enabled and picker_target(pcd).session_plugin == SESSION_AFFINITY_PLUGIN:
        notes.append(
            f"{SESSION_AFFINITY_PLUGIN}: a session stays on its pod for ttlSeconds after its "
            "last request, until that pod leaves the pool; at most maxSessions are tracked "
            "(least recently used forgotten first)."
        )
    if prefix.auto_tune:
        notes.append(
            "autoTune: block size and per-pod LRU capacity come from each pod's "
            "vllm:cache_config_info (block_size, num_gpu_blocks); the values below are fallbacks."
        )
    requested = [("prefixCache.blockSizeTokens", prefix.block_size_tokens)] + [
        (f"prefixCache.tiers[{i}].blockSizeTokens", t.block_size_tokens)
        for i, t in enumerate(prefix.tiers)
    ]
    target = picker_target(pcd)
    if not target.honours_lru_capacity:
        notes.append(
            f"{target.name} uses block sizes as given and sizes each pod's prefix index from "
            f"num_gpu_blocks under autoTune, else {target.default_lru_capacity} blocks."
        )
    floor = target.min_block_size_tokens
    if floor <= 1:
        return notes
    for path, value in requested:
        if value < floor:
            notes.append(
                f"{path}={value} was raised to {floor}: the Endpoint Picker "
                f"uses at least {floor}-token blocks."
            )
    notes.append(
        f"Block sizes below {floor} tokens, configured or auto-tuned "
        f"(vLLM's default is 16), are raised to {floor} by the Endpoint Picker."
    )
    return notes


def endpoint_picker_config_text(pcd: PromptCacheDeployment) -> str:
    """The ConfigMap payload: the config with comments that say what will really happen."""
    header = "".join(f"# {line}\n" for line in _notes(pcd))
    return header + dump(endpoint_picker_config(pcd))

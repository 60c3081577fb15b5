"""Conditions move lastTransitionTime only on a real transition; status is written only on change."""

from __future__ import annotations

from promptcache.api import OperatorDefaults, PromptCacheDeployment, prompt_embeds_ceiling
from promptcache.api.status import PromptCacheDeploymentStatus
from promptcache.contract import PROFILES
from promptcache.contract import PickerTarget as Picker
from promptcache.controller.conditions import Desired, set_condition, transitions
from promptcache.controller.scrape import ScrapedPrefixCache
from promptcache.controller.status import (
    Observation,
    Problem,
    compute_status,
    format_bytes,
    prefix_cache_status,
    status_differs,
)
from promptcache.render import render, resolved
from promptcache.render.epp_config import PREFIX_PRODUCER, endpoint_picker_config

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def test_new_condition_gets_the_current_time() -> None:
    conds, changed = set_condition([], Desired("Ready", "False", "X", "m"), generation=3, now=T0)
    assert changed
    assert conds == [
        {
            "type": "Ready",
            "status": "False",
            "reason": "X",
            "message": "m",
            "lastTransitionTime": T0,
            "observedGeneration": 3,
        }
    ]


def test_same_status_new_reason_keeps_the_transition_time() -> None:
    conds, _ = set_condition([], Desired("Ready", "False", "A"), generation=1, now=T0)
    conds, transitioned = set_condition(conds, Desired("Ready", "False", "B"), generation=2, now=T1)
    assert not transitioned
    assert conds[0]["lastTransitionTime"] == T0
    assert conds[0]["reason"] == "B"


def test_status_flip_moves_the_transition_time() -> None:
    conds, _ = set_condition([], Desired("Ready", "False", "A"), generation=1, now=T0)
    conds, transitioned = set_condition(conds, Desired("Ready", "True", "A"), generation=1, now=T1)
    assert transitioned
    assert conds[0]["lastTransitionTime"] == T1


def test_transitions_lists_changed_status_or_reason_only() -> None:
    old = [{"type": "Ready", "status": "True", "reason": "Available"}]
    same = [{"type": "Ready", "status": "True", "reason": "Available", "message": "other"}]
    assert transitions(old, same) == []
    flipped = [{"type": "Ready", "status": "False", "reason": "ReplicasNotReady"}]
    assert transitions(old, flipped) == flipped


def _obs(ready: int, **kw: object) -> Observation:
    deployment = {
        "metadata": {"generation": 1},
        "status": {
            "observedGeneration": 1,
            "replicas": 2,
            "updatedReplicas": 2,
            "readyReplicas": ready,
        },
    }
    obs = Observation(
        generation=4,
        desired_replicas=2,
        model_server=deployment,
        selector="a=b",
        ceiling=prompt_embeds_ceiling(enabled=True, cache_gib=2, processes_per_pod=2, replicas=2),
    )
    for key, value in kw.items():
        setattr(obs, key, value)
    return obs


def test_status_fields_and_conditions() -> None:
    status = compute_status(_obs(2), None, now=T0)
    assert status["observedGeneration"] == 4
    assert (status["replicas"], status["readyReplicas"], status["selector"]) == (2, 2, "a=b")
    assert status["promptEmbeds"] == {
        "perPodBytes": 4 * 2**30,
        "totalBytes": 8 * 2**30,
        "perPod": "4Gi",
    }
    by_type = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert by_type["Ready"] == ("True", "Available")
    assert by_type["Progressing"] == ("False", "Reconciled")
    assert by_type["Degraded"] == ("False", "AsExpected")


def test_unchanged_observation_writes_nothing_and_keeps_times() -> None:
    first = compute_status(_obs(2), None, now=T0)
    second = compute_status(_obs(2), first, now=T1)
    assert not status_differs(second, first)


def test_degraded_reason_reaches_the_condition() -> None:
    obs = _obs(0, degraded=Problem("SecretNotFound", "spec.model.hfTokenSecretRef: missing"))
    by_type = {c["type"]: c for c in compute_status(obs, None, now=T0)["conditions"]}
    assert by_type["Degraded"]["status"] == "True"
    assert by_type["Degraded"]["reason"] == "SecretNotFound"
    assert by_type["Ready"]["status"] == "False"


def test_format_bytes() -> None:
    assert format_bytes(0) == "0"
    assert format_bytes(8 * 2**30) == "8Gi"
    assert format_bytes(1536 * 2**20) == "1536Mi"
    assert format_bytes(1000) == "1000"


# --- the prefix-cache status says what the Endpoint Picker does ------------------------------


def _pcd(picker: str | None = "llm-d-router", **prefix: object) -> PromptCacheDeployment:
    """The resource with `prefix`; for `picker` (llm-d-router, whose floor and LRU size
    most of these tests are about, unless told; None: the operator's default)."""
    gateway = {} if picker is None else {"picker": picker}
    return PromptCacheDeployment.model_validate(
        {
            "apiVersion": "serving.promptcache.io/v1alpha1",
            "kind": "PromptCacheDeployment",
            "metadata": {"name": "t", "namespace": "ns"},
            "spec": {"model": {"name": "m"}, "prefixCache": prefix, "gateway": gateway},
        }
    )


def _producer(pcd: PromptCacheDeployment) -> dict[str, object]:
    config = endpoint_picker_config(resolved(pcd))
    producer = next(p for p in config["plugins"] if p["type"] == PREFIX_PRODUCER)
    return dict(producer["parameters"])


SCRAPED = ScrapedPrefixCache(scraped_pods=2, block_size=16, num_gpu_blocks=2048, hit_ratio=0.5)


def test_without_auto_tune_the_status_shows_the_configured_block_size() -> None:
    """Regression: autoTune off with 128-token blocks: the picker used 128, status said 64."""
    pcd = _pcd(autoTune=False, blockSizeTokens=128, lruCapacityPerServer=5000)
    st = prefix_cache_status(pcd, SCRAPED)
    assert st.effective_block_size_tokens == 128 == _producer(pcd)["blockSizeTokens"]
    assert st.index_capacity_per_pod == 5000 == _producer(pcd)["lruCapacityPerServer"]
    assert (st.block_size, st.num_gpu_blocks, st.hit_ratio) == (16, 2048, 0.5)  # what pods say


def test_with_auto_tune_the_status_shows_the_scraped_values_after_the_floor() -> None:
    st = prefix_cache_status(_pcd(autoTune=True, blockSizeTokens=128), SCRAPED)
    assert st.effective_block_size_tokens == 64  # 16 from the pods, raised by llm-d-router
    assert st.index_capacity_per_pod == 2048
    unscraped = prefix_cache_status(_pcd(autoTune=True, blockSizeTokens=128), ScrapedPrefixCache())
    assert unscraped.effective_block_size_tokens == 128  # the fallback until a pod is seen
    assert unscraped.index_capacity_per_pod == 31250


def test_a_small_configured_block_size_is_shown_raised_as_the_config_says() -> None:
    pcd = _pcd(autoTune=False, blockSizeTokens=16)
    st = prefix_cache_status(pcd, ScrapedPrefixCache())
    assert st.effective_block_size_tokens == 64 == _producer(pcd)["blockSizeTokens"]


def test_the_floor_is_the_picker_targets() -> None:
    """A picker without a floor (upstream GIE v1.5) uses what it is given."""
    no_floor = PROFILES[Picker.GIE]
    assert no_floor.block_size(auto_tune=True, configured=64, scraped=16) == 16
    assert no_floor.index_capacity(auto_tune=False, configured=5000, gpu_blocks=None) == 31250
    assert PROFILES[Picker.LLM_D_ROUTER].block_size(auto_tune=True, configured=64, scraped=16) == 64


def test_the_status_of_the_resolved_resource_uses_the_operator_default_picker() -> None:
    """`--picker gie-v1.5` and no `spec.gateway.picker`: render targets GIE, so the status
    of the resolved resource says what GIE uses (no 64-token floor), as the config does."""
    gie = OperatorDefaults(picker=Picker.GIE)
    pcd = resolved(_pcd(None, autoTune=False, blockSizeTokens=16), gie)
    (cm,) = [m for m in render(pcd, gie) if m["kind"] == "ConfigMap"]
    assert "Endpoint Picker: gie-v1.5" in next(iter(cm["data"].values()))
    assert prefix_cache_status(pcd, ScrapedPrefixCache()).effective_block_size_tokens == 16
    auto = resolved(_pcd(None, autoTune=True, blockSizeTokens=64), gie)
    assert prefix_cache_status(auto, SCRAPED).effective_block_size_tokens == 16
    assert resolved(pcd, gie) == pcd  # idempotent: render resolves again, to the same


def test_the_status_of_the_built_in_default_is_promptcaches_picker() -> None:
    """No picker named, no operator flag: promptcache's picker (GIE's underneath), so the
    status shows the block size the pods report (no floor) and the index sized from them."""
    pcd = resolved(_pcd(None, autoTune=True, blockSizeTokens=64))
    assert pcd.spec.gateway.picker is Picker.PROMPTCACHE
    st = prefix_cache_status(pcd, SCRAPED)
    assert (st.effective_block_size_tokens, st.index_capacity_per_pod) == (16, 2048)
    fixed = resolved(_pcd(None, autoTune=False, blockSizeTokens=16))
    assert prefix_cache_status(fixed, SCRAPED).effective_block_size_tokens == 16
    assert _producer(fixed)["blockSizeTokens"] == 16


def test_status_is_written_through_the_typed_model() -> None:
    obs = _obs(2, prefix_cache=prefix_cache_status(_pcd(autoTune=False), SCRAPED))
    status = compute_status(obs, None, now=T0)
    assert PromptCacheDeploymentStatus.model_validate(status).prefix_cache.scraped_pods == 2
    assert status["prefixCache"]["effectiveBlockSizeTokens"] == 64
    assert status["prefixCache"]["indexCapacityPerPod"] == 31250

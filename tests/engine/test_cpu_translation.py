"""The one translation of rendered engine args for vLLM's CPU build adds what it must and
changes nothing else: a new translation cannot creep in without failing here."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.engine.pods import engine_resource, rendered_pod_spec
from harness.pod import pod_local
from harness.vllm import CPU_TRANSLATIONS, cpu_engine_args
from harness.vllm.cpu import (
    KV_CACHE_MEMORY_BYTES,
    MODEL_INFO_DIR,
    OMP_BIND_ENV,
    UNPINNED,
    CpuBuildRefusesError,
    engine_cache_root,
    engine_env,
)


def _rendered_args(**spec: object) -> list[str]:
    resource = engine_resource(Path("/models/tiny"), **spec)
    vllm = next(c for c in rendered_pod_spec(resource)["containers"] if c["name"] == "vllm")
    return [str(a) for a in vllm["args"]]


@pytest.mark.parametrize(
    "spec",
    [{}, {"engine": {"blockSize": 64, "maxNumSeqs": 8}}, {"promptEmbeds": {"enabled": False}}],
)
def test_only_the_kv_cache_size_is_added(spec: dict[str, object]) -> None:
    rendered = _rendered_args(**spec)
    translated = cpu_engine_args(rendered, kv_cache_bytes=123)
    assert translated[: len(rendered)] == rendered, "a rendered argument was changed"
    added = translated[len(rendered) :]
    assert added == [KV_CACHE_MEMORY_BYTES, "123"]
    assert {a for a in added if a.startswith("--")} <= set(CPU_TRANSLATIONS)


def test_the_list_of_translations_is_the_kv_cache_size_alone() -> None:
    assert CPU_TRANSLATIONS == (KV_CACHE_MEMORY_BYTES,)


def test_a_kv_cache_size_already_given_is_kept() -> None:
    rendered = [*_rendered_args(), f"{KV_CACHE_MEMORY_BYTES}=99"]
    assert cpu_engine_args(rendered) == rendered


@pytest.mark.parametrize("block", ["8", "16"])
def test_block_sizes_the_cpu_build_refuses_are_refused_not_translated(block: str) -> None:
    rendered = [a if a != "32" else block for a in _rendered_args()]
    with pytest.raises(CpuBuildRefusesError, match="multiple of 32"):
        cpu_engine_args(rendered)


def test_pod_local_maps_the_pods_addresses_and_mounts() -> None:
    mounts = {"/tmp": Path("/w/tmp"), "/etc/salt": Path("/w/salt")}
    assert pod_local("http://127.0.0.1:8001", "127.50.0.2", mounts) == "http://127.50.0.2:8001"
    assert pod_local("0.0.0.0:8000", "127.50.0.2", mounts) == "127.50.0.2:8000"
    assert pod_local("/etc/salt/salt-key", "127.50.0.2", mounts) == "/w/salt/salt-key"
    assert pod_local("/tmp", "127.50.0.2", mounts) == "/w/tmp"
    assert pod_local("/tmpfoo", "127.50.0.2", mounts) == "/tmpfoo"
    assert pod_local("--dtype=float32", "127.50.0.2", mounts) == "--dtype=float32"
    lora = '{"name":"sql","path":"/etc/salt/a","base_model_name":"m"}'
    assert pod_local(lora, "127.50.0.2", mounts) == lora.replace("/etc/salt/a", "/w/salt/a")


def test_pod_local_keeps_a_host_path_the_pods_volume_would_hide(tmp_path: Path) -> None:
    """A model (or any cache) under the host's /tmp stays reachable: the pod's /tmp
    emptyDir does not shadow a host path that exists and is absent from the volume."""
    volume = tmp_path / "volume-tmp"
    volume.mkdir()
    (volume / "written-by-the-pod").write_text("x")
    model = tmp_path / "cache" / "models" / "tiny"
    model.mkdir(parents=True)
    mount = str(tmp_path)  # stands for the pod's /tmp mount point
    mounts = {mount: volume}
    assert pod_local(str(model), "127.50.0.2", mounts) == str(model)
    assert pod_local(f"{mount}/written-by-the-pod", "127.50.0.2", mounts) == str(
        volume / "written-by-the-pod"
    )
    assert pod_local(f"{mount}/not-yet-there", "127.50.0.2", mounts) == str(
        volume / "not-yet-there"
    )


def test_engines_share_their_model_class_facts_and_nothing_else(tmp_path: Path) -> None:
    """What one engine learnt of the model class (vLLM's `modelinfos`, hash-checked) the
    next finds, so it starts no extra Python to learn it; the rest of each cache is its own."""
    shared = tmp_path / "layer" / MODEL_INFO_DIR
    first = engine_cache_root(tmp_path / "a" / "vllm-cache", shared)
    second = engine_cache_root(tmp_path / "b" / "vllm-cache", shared)
    assert engine_cache_root(first, shared) == first, "preparing twice must be harmless"
    (first / MODEL_INFO_DIR / "qwen2.json").write_text("{}")
    assert (second / MODEL_INFO_DIR / "qwen2.json").read_text() == "{}"
    (first / "torch_compile_cache").mkdir()
    assert not (second / "torch_compile_cache").exists()


def test_pod_local_maps_a_path_inside_a_value_once() -> None:
    """An adapter under a cache in /tmp, mounted at /adapters, in a pod with a /tmp
    emptyDir: the JSON path goes to the host's adapter, not on into the emptyDir (mapped
    mount by mount it did, and vLLM found no adapter: a cold CI run, cache under /tmp)."""
    mounts = {"/tmp": Path("/w/pod/tmp"), "/adapters": Path("/tmp/cache/adapters")}
    lora = '{"name":"sql","path":"/adapters/lora-1","base_model_name":"m"}'
    assert pod_local(lora, "127.50.0.2", mounts) == lora.replace(
        "/adapters/lora-1", "/tmp/cache/adapters/lora-1"
    )
    assert pod_local("--dir=/adapters", "127.50.0.2", mounts) == "--dir=/tmp/cache/adapters"
    assert pod_local("--dir=/tmp/x", "127.50.0.2", mounts) == "--dir=/w/pod/tmp/x"
    assert pod_local("--dir=/adaptersx/y", "127.50.0.2", mounts) == "--dir=/adaptersx/y"


def test_an_engine_is_unpinned_unless_its_pod_names_a_core(tmp_path: Path) -> None:
    """Without a binding of its own an engine floats (vLLM's default put every engine here on
    core 0); a core the harness's kubelet chose for a pod stays, with vLLM's own thread
    count for it."""
    floating = engine_env({"FOO": "bar"}, tmp_path)
    assert {k: floating[k] for k in UNPINNED} == dict(UNPINNED)
    assert floating["FOO"] == "bar"
    placed = engine_env({OMP_BIND_ENV: "1"}, tmp_path)
    assert placed[OMP_BIND_ENV] == "1"
    assert "OMP_NUM_THREADS" not in placed

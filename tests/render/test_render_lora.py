"""LoRA adapters and model routing: vLLM's flags (checked against vLLM 0.33's own source),
the pickers' LoRA affinity, and the pieces the body-based router and the Gateway read."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from harness.epp import accepted_parameters
from harness.resources import BASE
from promptcache.api import parse_resource, resolved
from promptcache.api.spec import MaxLoraRank
from promptcache.contract import VllmFlag
from promptcache.contract.engine import VLLM_LORA_RANKS
from promptcache.contract.router import (
    BASE_MODEL_HEADER,
    MAPPING_ADAPTERS_KEY,
    MAPPING_BASE_MODEL_KEY,
    MAPPING_LABEL,
)
from promptcache.render import render
from promptcache.render.epp_config import LORA_SCORER, endpoint_picker_config
from promptcache.render.model_server import vllm_args
from promptcache.tenancy.routes import VLLM_ROUTES_VERSION
from tools import vllm_flags, vllm_routes

ROOT = Path(__file__).resolve().parents[2]
ACCEPTED = accepted_parameters()
ADAPTERS = [
    {"name": "sql-lora", "path": "/model-cache/adapters/sql", "rank": 8},
    {"name": "chat-lora", "huggingFaceRepo": "org/chat-lora", "rank": 32},
]


def doc(**spec: Any) -> dict[str, Any]:
    out = copy.deepcopy(BASE)
    out["spec"]["model"]["adapters"] = copy.deepcopy(ADAPTERS)
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(out["spec"].get(key), dict):
            out["spec"][key] = {**out["spec"][key], **value}
        else:
            out["spec"][key] = value
    return out


def flag_value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.fixture(scope="module")
def wheel() -> Path:
    return vllm_routes.ensure_wheel(VLLM_ROUTES_VERSION)


def test_every_flag_written_for_adapters_is_a_vllm_flag(wheel: Path) -> None:
    known = vllm_flags.flags_in_wheel(wheel)
    assert {"--enable-prefix-caching", "--lora-modules", "--port"} <= known, "parse found flags"
    written = {a for a in vllm_args(parse_resource(doc())) if a.startswith("--")}
    assert {VllmFlag.ENABLE_LORA, VllmFlag.LORA_MODULES, VllmFlag.MAX_CPU_LORAS} <= written
    assert written - known == set()


def test_lora_ranks_are_vllms(wheel: Path) -> None:
    assert vllm_flags.lora_ranks_in_wheel(wheel) == VLLM_LORA_RANKS
    assert get_args(MaxLoraRank) == VLLM_LORA_RANKS


def test_lora_modules_items_are_json_vllm_reads_as_written(wheel: Path) -> None:
    """vLLM 0.33 reads an item as `name=path` when it has `=` and no `,`, else as JSON whose
    keys are LoRAModulePath's fields; every item here is JSON with known keys."""
    action = vllm_flags.lora_modules_parser_source(wheel)
    assert "'=' in item and ',' not in item" in action, "vLLM changed how it tells the forms"
    fields = set(vllm_flags.lora_module_fields_in_wheel(wheel))
    odd = doc()
    odd["spec"]["model"]["adapters"][0]["path"] = "/model-cache/a=b"
    args = vllm_args(parse_resource(odd))
    start = args.index(VllmFlag.LORA_MODULES) + 1
    items = args[start : start + len(ADAPTERS)]
    parsed = [json.loads(i) for i in items]
    assert all("," in i for i in items), "JSON form, whatever the path holds"
    assert all(set(p) <= fields for p in parsed)
    assert [p["name"] for p in parsed] == ["sql-lora", "chat-lora"]
    assert [p["path"] for p in parsed] == ["/model-cache/a=b", "org/chat-lora"]
    assert {p["base_model_name"] for p in parsed} == {"org/model"}
    assert not args[start + len(ADAPTERS)].startswith("{"), "one --lora-modules, all items"


@pytest.mark.parametrize(
    ("gpus", "engine", "want"),
    [
        (0, {}, (3, 32, 3)),  # CPU: one slot more than adapters; rank from the declared ranks
        (1, {}, (2, 32, 2)),
        (1, {"maxLoras": 1, "maxCpuLoras": 4, "maxLoraRank": 64}, (1, 64, 4)),
    ],
)
def test_limits_default_from_the_adapters(
    gpus: int, engine: dict[str, Any], want: tuple[int, int, int]
) -> None:
    d = doc(engine=engine)
    d["spec"]["model"]["resources"] = {"gpus": gpus}
    args = vllm_args(parse_resource(d))
    got = tuple(
        int(flag_value(args, f))
        for f in (VllmFlag.MAX_LORAS, VllmFlag.MAX_LORA_RANK, VllmFlag.MAX_CPU_LORAS)
    )
    assert got == want


def test_gpu_default_slots_are_capped() -> None:
    d = doc()
    d["spec"]["model"]["adapters"] = [
        {"name": f"a{i}", "path": f"/model-cache/a{i}"} for i in range(12)
    ]
    args = vllm_args(parse_resource(d))
    assert flag_value(args, VllmFlag.MAX_LORAS) == "8"
    assert flag_value(args, VllmFlag.MAX_CPU_LORAS) == "12", "every adapter stays loaded"
    assert flag_value(args, VllmFlag.MAX_LORA_RANK) == "16", "vLLM's default, none declared"


def test_without_adapters_nothing_changes() -> None:
    pcd = parse_resource(copy.deepcopy(BASE))
    assert not [a for a in vllm_args(pcd) if "lora" in a]
    config = endpoint_picker_config(resolved(pcd))
    assert LORA_SCORER not in [p["type"] for p in config["plugins"]]
    kinds = [m["kind"] for m in render(pcd)]
    assert kinds.count("ConfigMap") == 1, "only the picker's config"


@pytest.mark.parametrize("picker", ["llm-d-router", "gie-v1.5"])
def test_both_pickers_score_lora_affinity_with_accepted_parameters(picker: str) -> None:
    pcd = parse_resource(
        doc(gateway={"picker": picker}, prefixCache={"weights": {"loraAffinity": 2.5}})
    )
    config = endpoint_picker_config(resolved(pcd))
    (plugin,) = [p for p in config["plugins"] if p["type"] == LORA_SCORER]
    assert ACCEPTED[LORA_SCORER] == []
    assert "parameters" not in plugin
    refs = config["schedulingProfiles"][0]["plugins"]
    assert {"pluginRef": LORA_SCORER, "weight": 2.5} in refs
    assert refs[-1] == {"pluginRef": "max-score-picker"}, "the picker stays last"


def by_kind(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == kind]


def test_route_by_model_matches_the_routers_header_and_maps_the_adapters() -> None:
    route_spec = {"route": {"parentRefs": [{"name": "shared", "namespace": "gw"}],
                            "routeByModel": True}}  # fmt: skip
    d = doc(gateway=route_spec)
    d["spec"]["model"]["servedModelName"] = "base-a"
    manifests = render(parse_resource(d))
    (route,) = by_kind(manifests, "HTTPRoute")
    (rule,) = route["spec"]["rules"]
    assert rule["matches"] == [
        {
            "path": {"type": "PathPrefix", "value": "/"},
            "headers": [{"type": "Exact", "name": BASE_MODEL_HEADER, "value": "base-a"}],
        }
    ]
    (mapping,) = [m for m in by_kind(manifests, "ConfigMap") if m["metadata"]["name"] == "chat-bbr"]
    assert mapping["metadata"]["labels"][MAPPING_LABEL] == "true"
    assert mapping["metadata"]["namespace"] == "serving"
    assert mapping["data"][MAPPING_BASE_MODEL_KEY] == "base-a"
    assert yaml.safe_load(mapping["data"][MAPPING_ADAPTERS_KEY]) == ["sql-lora", "chat-lora"]


def test_route_by_model_without_adapters_maps_the_model_to_itself() -> None:
    d = copy.deepcopy(BASE)
    d["spec"]["gateway"] = {"route": {"parentRefs": [{"name": "gw"}], "routeByModel": True}}
    (mapping,) = [m for m in render(parse_resource(d)) if m["metadata"]["name"] == "chat-bbr"]
    assert mapping["data"] == {MAPPING_BASE_MODEL_KEY: "org/model", MAPPING_ADAPTERS_KEY: ""}


def test_a_plain_route_is_unchanged() -> None:
    d = copy.deepcopy(BASE)
    d["spec"]["gateway"] = {"route": {"parentRefs": [{"name": "gw"}]}}
    (route,) = by_kind(render(parse_resource(d)), "HTTPRoute")
    assert route["spec"]["rules"][0]["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]

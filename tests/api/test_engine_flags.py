"""`engine.extraArgs` cannot override what the operator writes or relies on, in any spelling
vLLM 0.33's parser accepts; every other vLLM flag passes untouched."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from promptcache.api import InvalidResourceError, parse_resource
from promptcache.api.rules import ENGINE_RULES
from promptcache.contract import OWNED_ENGINE_FLAGS
from promptcache.render.model_server import vllm_args

OWNED = [(flag, group) for group in OWNED_ENGINE_FLAGS for flag in group.flags]

# Real `vllm serve` flags of vLLM 0.33 the operator does not own, including ones that begin
# with an owned flag's name (`--model-impl`, `--config-format`) and dotted JSON forms.
NOT_OWNED = [
    "--max-num-batched-tokens=8192",
    "--max-num-batched-tokens",
    "--kv-cache-dtype",
    "--dtype",
    "--trust-remote-code",
    "--enable-chunked-prefill",
    "--no-enable-chunked-prefill",
    "--model-impl",
    "--model_impl=vllm",
    "--config-format",
    "--quantization",
    "-q",
    "--enforce-eager",
    "--seed",
    "--pipeline-parallel-size",
    "-pp",
    "--data-parallel-size",
    "--tokenizer",
    "--revision",
    "--prefix-caching-hash-algo",
    "--enable-log-requests",
    "--api-key",
    "--root-path",
    "--middleware",
    "--hf-overrides",
    "--compilation-config",
    "-O3",
    "--speculative-config.num_speculative_tokens=3",
    "--long-prefill-token-threshold",
    "--enable-expert-parallel",
    "--uvicorn-log-level",
    "--chat-template",
    "--generation-config",
    "--disable-uvicorn-access-log",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "--load-format",
    "--kv-transfer-config",
    "--disable-fastapi-docs",
    # values, not flags
    "256",
    "-1",
    "auto",
    '{"port": 9000}',
    "hermes",
]


def resource(extra_args: list[str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "serving.promptcache.io/v1alpha1",
        "kind": "PromptCacheDeployment",
        "metadata": {"name": "demo", "namespace": "ns"},
        "spec": {"model": {"name": "org/model"}, "engine": {"extraArgs": extra_args}, **spec},
    }


def refusals(extra_args: list[str]) -> list[str]:
    try:
        parse_resource(resource(extra_args))
    except InvalidResourceError as error:
        problems = error.problems
    else:
        return []
    assert all(p.path == "spec.engine.extraArgs" for p in problems), problems
    return [p.message for p in problems]


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"front": {"enabled": False, "usageHeaders": {"enabled": False}},
         "isolation": {"mode": "Shared"}},
        {"engine": {"maxModelLen": 4096, "apiServerCount": 2},
         "promptEmbeds": {"enabled": True}, "model": {"name": "m", "servedModelName": "x"}},
    ],
)  # fmt: skip
def test_every_flag_the_renderer_writes_is_refused_in_extra_args(spec: dict[str, Any]) -> None:
    pcd = parse_resource({**resource([]), "spec": {"model": {"name": "org/model"}, **spec}})
    written = [a for a in vllm_args(pcd) if a.startswith("-")]
    assert written, "the renderer writes flags"
    for flag in written:
        assert refusals([flag]), f"{flag} is written by the renderer but extraArgs may set it"
        assert refusals([f"{flag}=1"]), flag


@pytest.mark.parametrize(("flag", "group"), OWNED, ids=[f for f, _ in OWNED])
def test_each_spelling_vllm_reads_as_an_owned_flag_is_refused(flag: str, group: Any) -> None:
    name = flag.removeprefix("--")
    spellings = [
        flag,
        f"{flag}=9000",
        f"--{name.replace('-', '_')}",
        f"--{name.replace('-', '_')}=x",
        f"--no-{name}",
        f"--no_{name.replace('-', '_')}",
        f"--{name[:-1]}",  # an abbreviation argparse expands
        f"--{name}.key",  # vLLM's dotted JSON form of the flag
    ]
    for spelling in spellings:
        messages = refusals(["--max-num-batched-tokens", "8", spelling])
        assert any(flag in m for m in messages), f"{spelling!r} not refused as {flag}"
    for alias in group.aliases:
        assert any(alias in m for m in refusals([alias, "2"]))
        assert any(alias in m for m in refusals([f"{alias}=2"]))


@pytest.mark.parametrize("arg", NOT_OWNED)
def test_flags_the_operator_does_not_own_pass(arg: str) -> None:
    assert refusals([arg]) == []


@given(
    st.sampled_from(OWNED),
    st.integers(min_value=1, max_value=40),
    st.booleans(),
    st.booleans(),
    st.sampled_from(["", "=1", "=", ".a.b", "=--port"]),
)
def test_any_prefix_underscore_and_negated_form_is_refused(
    owned: tuple[str, Any], length: int, underscores: bool, negated: bool, tail: str
) -> None:
    flag, _ = owned
    name = flag.removeprefix("--")[:length]
    if underscores:
        name = name.replace("-", "_")
    arg = f"--{'no-' if negated else ''}{name}{tail}"
    assert any(flag in m for m in refusals([arg])), arg


def test_a_flag_and_its_value_in_one_item_is_refused_with_the_fix() -> None:
    (message,) = refusals(["--max-num-batched-tokens 8192"])
    assert '"--max-num-batched-tokens", "8192"' in message
    assert refusals(["--max-num-batched-tokens=8192 "]) == [], "a space in a value is the value's"


def test_one_message_per_broken_rule_and_each_names_its_field() -> None:
    messages = refusals(["--port=1", "--block_size", "16", "-tp", "2"])
    assert messages == [
        rule.message
        for rule in ENGINE_RULES
        if any(f in rule.message for f in ("--port", "--block-size", "-tp"))
    ]
    assert "engine.blockSize" in messages[1]
    assert "model.resources.gpus" in messages[2]

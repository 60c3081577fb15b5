"""The contract's own rules, and regressions for each defect of issue 15 that crossed planes."""

from __future__ import annotations

import argparse
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from promptcache.api import PromptCacheDeployment
from promptcache.api.spec import IsolationSpec, PromptCacheDeploymentSpec
from promptcache.contract import (
    FRONT_SETTINGS,
    GATEWAY_POLICY_SETTINGS,
    HEADER_NAME_PATTERN,
    SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR,
    FrontEnv,
    GatewayPolicyEnv,
    IsolationMode,
    SettingsError,
    format_cache_gib,
    is_header_name,
    needs_salt_key,
    parse_cache_gib,
)
from promptcache.embeds import build_cache_from_env
from promptcache.embeds.cache import cache_capacity_from_env
from promptcache.front.command import settings_from as front_settings
from promptcache.gateway.command import settings_from as gateway_policy_settings
from promptcache.render import render
from promptcache.render.front import FRONT_CONTAINER

NO_FLAGS = argparse.Namespace()


def _pcd(**spec: object) -> PromptCacheDeployment:
    return PromptCacheDeployment.model_validate(
        {
            "apiVersion": "serving.promptcache.io/v1alpha1",
            "kind": "PromptCacheDeployment",
            "metadata": {"name": "t", "namespace": "ns"},
            "spec": {"model": {"name": "m"}, **spec},
        }
    )


def _front_env(pcd: PromptCacheDeployment) -> dict[str, str]:
    for m in render(pcd):
        if m["kind"] == "Deployment":
            for c in m["spec"]["template"]["spec"]["containers"]:
                if c["name"] == FRONT_CONTAINER:
                    return {e["name"]: e["value"] for e in c["env"]}
    raise AssertionError("no cache-front container")


# --- the grammar: one for the API, the front and the shim ---------------------------------


@given(st.text(alphabet='abcXYZ019.!_-~ :\t/"@', max_size=12))
def test_the_api_the_front_and_the_shim_accept_the_same_header_names(name: str) -> None:
    api_ok = True
    try:
        IsolationSpec(header=name)
    except ValidationError:
        api_ok = False
    assert api_ok is bool(re.fullmatch(HEADER_NAME_PATTERN[1:-1], name) or name == "")
    front_ok = True
    try:
        front_settings(NO_FLAGS, {FrontEnv.ISOLATION_HEADER: name})
    except SettingsError:
        front_ok = False
    shim_ok = True
    try:
        gateway_policy_settings(NO_FLAGS, {GatewayPolicyEnv.SESSION_HEADER: name})
    except ValueError:
        shim_ok = False
    # the processes fold case (HTTP compares names case-insensitively); the API stores lower case
    folded = name.strip().lower()
    assert front_ok is (folded == "" or is_header_name(folded))
    # empty means "no session header" to the policy step too (a picker without sessions)
    assert shim_ok is (folded == "" or is_header_name(folded))
    if api_ok:
        assert front_ok
        assert shim_ok


def test_a_dotted_header_name_passes_the_api_and_starts_the_front() -> None:
    """Regression: the API accepted `x.tenant`, the front refused it and the pod crash-looped."""
    env = _front_env(_pcd(isolation={"header": "x.tenant"}))
    assert front_settings(NO_FLAGS, env).isolation_header == "x.tenant"


@pytest.mark.parametrize("field", ["header", "bodyField"])
def test_empty_header_or_field_means_do_not_read_one_end_to_end(field: str) -> None:
    """Regression: the front read an empty variable as unset and fell back to the default."""
    settings = front_settings(NO_FLAGS, _front_env(_pcd(isolation={field: ""})))
    if field == "header":
        assert settings.isolation_header == ""
        assert settings.isolation_field == "prompt_cache_isolation_key"
    else:
        assert settings.isolation_field == ""
        assert settings.isolation_header == "x-prompt-cache-isolation-key"


def test_the_front_refuses_required_with_no_carrier_like_the_api() -> None:
    with pytest.raises(ValidationError, match="Required isolation needs a header or a bodyField"):
        IsolationSpec(mode=IsolationMode.REQUIRED, header="", body_field="")
    env = {FrontEnv.ISOLATION_MODE: "Required", FrontEnv.ISOLATION_HEADER: ""}
    env[FrontEnv.ISOLATION_FIELD] = ""
    with pytest.raises(SettingsError, match="Required needs an isolation header or an isolation"):
        front_settings(NO_FLAGS, env)


# --- the cache size: one parser for the front and for embeds -------------------------------

BAD_SIZES = ["", " ", "inf", "-inf", "nan", "1e400", "-1", "-0.5", "2000", "1GiB", "abc"]


@pytest.mark.parametrize("raw", BAD_SIZES)
def test_a_bad_cache_size_is_refused_by_the_front_and_by_embeds_alike(raw: str) -> None:
    """Regression: the front read an empty size as "off" and crashed on `inf` and `1e400`."""
    env = {SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR: raw}
    with pytest.raises(SettingsError) as front_error:
        front_settings(NO_FLAGS, env)
    with pytest.raises(ValueError, match=SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR) as embeds_error:
        cache_capacity_from_env(env)
    assert str(front_error.value) == str(embeds_error.value)
    assert SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR in str(front_error.value)


def test_build_cache_from_env_uses_the_contract_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR, "0.5")
    assert build_cache_from_env().stats().capacity_bytes == 1 << 29
    monkeypatch.setenv(SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR, "")
    with pytest.raises(ValueError, match="SG_PROMPT_EMBEDS_CACHE_GIB=''"):
        build_cache_from_env()
    monkeypatch.delenv(SG_PROMPT_EMBEDS_CACHE_GIB_ENV_VAR)
    assert build_cache_from_env().stats().capacity_bytes == 0


@given(st.floats(0, 1024, allow_nan=False))
def test_the_rendered_cache_size_reads_back_exactly(gib: float) -> None:
    assert parse_cache_gib("x", format_cache_gib(gib)) == gib


def test_the_api_bound_on_the_cache_size_is_the_contract_bound() -> None:
    with pytest.raises(ValidationError, match="less than or equal to 1024"):
        _pcd(promptEmbeds={"enabled": True, "cacheGiB": 1025})
    with pytest.raises(SettingsError):
        parse_cache_gib("x", "1025")


# --- honorPromptCacheMaxLen follows the front ------------------------------------------------


def test_honor_max_len_is_off_without_the_front_and_on_with_it() -> None:
    """Regression: with front.enabled false it defaulted to true, though nothing honoured it."""
    off = _pcd(
        isolation={"mode": "Shared"}, front={"enabled": False, "usageHeaders": {"enabled": False}}
    )
    assert off.spec.honors_prompt_cache_max_len is False
    assert (
        "honorPromptCacheMaxLen"
        not in off.model_dump(by_alias=True, exclude_none=True)["spec"]["isolation"]
    )
    assert _pcd().spec.honors_prompt_cache_max_len is True
    assert _front_env(_pcd())[FrontEnv.HONOR_MAX_LEN] == "true"
    no = _pcd(isolation={"honorPromptCacheMaxLen": False})
    assert _front_env(no)[FrontEnv.HONOR_MAX_LEN] == "false"


def test_honor_max_len_true_without_the_front_is_refused() -> None:
    with pytest.raises(ValidationError, match="honoured by the cache front"):
        PromptCacheDeploymentSpec.model_validate(
            {
                "model": {"name": "m"},
                "isolation": {"mode": "Shared", "honorPromptCacheMaxLen": True},
                "front": {"enabled": False, "usageHeaders": {"enabled": False}},
            }
        )


# --- one decision, one declaration -------------------------------------------------------------


def test_needs_salt_key_is_decided_by_the_mode() -> None:
    assert [needs_salt_key(m) for m in IsolationMode] == [False, True, True]
    assert _pcd(isolation={"mode": "PerKey"}).spec.needs_salt_key
    assert not _pcd(isolation={"mode": "Shared"}).spec.needs_salt_key


@pytest.mark.parametrize(
    "declared", [FRONT_SETTINGS, GATEWAY_POLICY_SETTINGS], ids=["front", "shim"]
)
def test_each_setting_is_declared_once(declared: tuple[object, ...]) -> None:
    for attr in ("field", "flag", "env"):
        values = [getattr(s, attr) for s in declared]
        assert len(values) == len(set(values)), attr


def test_every_front_default_parses_as_its_own_variable() -> None:
    """A default is a value the process would accept from its variable."""
    for s in FRONT_SETTINGS + GATEWAY_POLICY_SETTINGS:
        raw = s.default.value if isinstance(s.default, IsolationMode) else s.default
        text = format_cache_gib(raw) if isinstance(raw, float) else str(raw)
        if isinstance(raw, bool):
            text = str(raw).lower()
        assert s.parse(s.env, text) == s.default, s.env


def test_the_gateway_policy_step_has_one_image_flag() -> None:
    """`--session-shim-image`, the deprecated old name, was removed with the resource's
    `sessionShimImage`, and `SessionShimEnv` with `promptcache session-shim` (CHANGELOG)."""
    import argparse

    import promptcache.contract
    from promptcache.api.defaults import add_default_flags, defaults_from_args

    assert not hasattr(promptcache.contract, "SessionShimEnv")
    parser = argparse.ArgumentParser()
    add_default_flags(parser)
    args = parser.parse_args(["--gateway-policy-image", "mirror.example/op:1"])
    assert defaults_from_args(args).gateway_policy_image == "mirror.example/op:1"
    with pytest.raises(SystemExit):
        parser.parse_args(["--session-shim-image", "mirror.example/op:1"])

"""Which Endpoint Picker a rendered gateway targets: the API's `spec.gateway.picker`, the
operator's `--default-picker` (chart value `defaultPicker`) and `promptcache render`'s."""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class PickerTarget(StrEnum):
    """The Endpoint Picker binary a rendered gateway targets (`spec.gateway.picker`).

    Each accepts a different dialect (config apiVersion, flags, plugins); the renderer
    emits for each only what that binary accepts (docs/endpoint-picker.md)."""

    LLM_D_ROUTER = "llm-d-router"
    """llm-d-router v0.10.0: the production default (session plugins, 64-token floor)."""
    GIE = "gie-v1.5"
    """The upstream Gateway API Inference Extension EPP v1.5.0, the last GIE release with
    an EPP: no session plugin, lenient decoding, one shared prefix attribute."""


DEFAULT_PICKER: Final[PickerTarget] = PickerTarget.LLM_D_ROUTER
"""The operator-wide default when neither the resource nor the operator names one."""
DEFAULT_PICKER_ENV: Final[str] = "PROMPTCACHE_DEFAULT_PICKER"
"""The operator's (and `promptcache render`'s) default picker; flag `--default-picker`."""

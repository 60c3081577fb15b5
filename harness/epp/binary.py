"""Where each Endpoint Picker binary lives, so tests, benches and CI agree.

Two pickers (`contract.PickerTarget`), built outside the clone into the shared cache
(`$CACHE/bin/picker-<version>/epp` and `$CACHE/bin/epp-<version>/epp`, see the cache
convention):

- `gie-v1.5`: the GIE EPP v1.5.0 as promptcache builds it (`picker/`: the upstream runner
  with promptcache's plugins registered; a config naming none of them runs the upstream
  picker unchanged), which `e2e/cluster build` builds by default into
  `$CACHE/bin/picker-<GIE version>/epp`. Every picker check that can run on it does: a
  missing binary is a failure to run `e2e/cluster build`, never a skip.
- `llm-d-router`: v0.10.0, which the Go module proxy here refuses; tests that need it run
  where a hand-built binary exists and skip with the reason elsewhere.

`PROMPTCACHE_EPP_BIN` / `PROMPTCACHE_GIE_EPP_BIN` point at other builds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from harness.localcluster.paths import BIN_ROOT
from harness.localcluster.targets import find_target
from promptcache.contract import PROFILES, PickerTarget

EPP_MODULE = "github.com/llm-d/llm-d-router"
"""The Go module the llm-d Endpoint Picker comes from (formerly llm-d-inference-scheduler)."""

EPP_VERSION = "v0.10.0"
"""The llm-d-router release the renderer targets (docs/endpoint-picker.md was verified on it)."""

EPP_BIN_ENV = "PROMPTCACHE_EPP_BIN"
GIE_MODULE = "sigs.k8s.io/gateway-api-inference-extension"
GIE_BIN_ENV = "PROMPTCACHE_GIE_EPP_BIN"


GIE_VERSION = find_target("epp").version()
"""The GIE version picker/go.mod pins (the one `e2e/cluster build` builds)."""


@dataclass(frozen=True)
class PickerBinary:
    """One Endpoint Picker the harness can run."""

    target: PickerTarget
    module: str
    version: str
    env: str
    how_to_build: str

    def default_path(self) -> Path:
        if PROFILES[self.target].gie_based:
            return find_target("epp").out_dir() / "epp"  # where `e2e/cluster build` puts it
        return default_epp_path(self.version)

    def path(self) -> Path:
        override = os.environ.get(self.env)
        return Path(override) if override else self.default_path()

    def find(self) -> Path | None:
        candidate = self.path()
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
        return None

    def missing_reason(self) -> str:
        return (
            f"{self.target.value} Endpoint Picker binary not found at {self.path()}: "
            f"{self.how_to_build} (or set {self.env})"
        )


PICKERS: dict[PickerTarget, PickerBinary] = {
    PickerTarget.LLM_D_ROUTER: PickerBinary(
        PickerTarget.LLM_D_ROUTER,
        EPP_MODULE,
        EPP_VERSION,
        EPP_BIN_ENV,
        f"build {EPP_MODULE}/cmd/epp {EPP_VERSION} there with CGO_ENABLED=0 (the Go module "
        "proxy here refuses the module, so `e2e/cluster build` cannot)",
    ),
    PickerTarget.GIE: PickerBinary(
        PickerTarget.GIE,
        GIE_MODULE,
        GIE_VERSION,
        GIE_BIN_ENV,
        "run `python e2e/cluster build` (it builds the GIE EPP by default)",
    ),
    # the same binary: the renderer configures its tenant-salt parser and no policy step
    PickerTarget.PROMPTCACHE: PickerBinary(
        PickerTarget.PROMPTCACHE,
        GIE_MODULE,
        GIE_VERSION,
        GIE_BIN_ENV,
        "run `python e2e/cluster build` (it builds promptcache's picker, picker/, by default)",
    ),
}


def default_epp_path(version: str = EPP_VERSION) -> Path:
    """Where `e2e/cluster build` (or a hand build) puts an Endpoint Picker of `version`."""
    return BIN_ROOT / f"epp-{version}" / "epp"


def find_epp_binary(picker: PickerTarget = PickerTarget.LLM_D_ROUTER) -> Path | None:
    """The Endpoint Picker to run for `picker`, or None when none is built yet."""
    return PICKERS[picker].find()


def missing_reason(picker: PickerTarget = PickerTarget.LLM_D_ROUTER) -> str:
    """What a test says when the binary cannot be found."""
    return PICKERS[picker].missing_reason()


def available_pickers() -> list[PickerTarget]:
    """The pickers this machine can run (GIE's build always counts: its absence must fail)."""
    return [t for t in PICKERS if PROFILES[t].gie_based or PICKERS[t].find() is not None]

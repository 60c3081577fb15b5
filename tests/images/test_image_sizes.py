"""What a node pulls: each image stays within a budget set from its measured size.

Measured here (podman's size of the uncompressed image, Debian 12 base from mmdebstrap):

- operator: 278 MB (base 176 MB, the operator's venv with grpcio 100 MB);
- picker: 59 MB (the static `epp` binary 57 MB on a base of a passwd file and the CA
  bundle; no shell);
- front with PyPI's torch: 5.94 GB (torch's layer 5.61 GB, the front's venv 152 MB), of
  which torch's CUDA libraries (nvidia-*, triton) are about 4 GB: PyPI serves torch for
  linux/amd64 only with them (no `+cpu` build, and its torch refuses to import without
  them), and the CPU index the Dockerfile names by default is not reachable from these
  machines. The release builds from that CPU index,
  which this machine cannot measure; its budget below is the PyPI build less the CUDA
  libraries, so a CPU front past it means the CUDA build slipped in.

A budget is ~10% over the measurement: growth past it is a change someone must explain.
"""

from __future__ import annotations

import pytest

from harness.images import built_image
from tools.images.build import PYPI_INDEX

pytestmark = pytest.mark.images

MB = 1_000_000
OPERATOR_BUDGET = 310 * MB
PICKER_BUDGET = 65 * MB
FRONT_BUDGET = {PYPI_INDEX: 6_500 * MB}
FRONT_CPU_BUDGET = 2_000 * MB  # any other index: the CPU build (see the module docstring)


def test_operator_image_within_budget() -> None:
    built = built_image("operator")
    assert built.size_bytes <= OPERATOR_BUDGET, (
        f"{built.ref} is {built.size_bytes / MB:,.0f} MB, over its {OPERATOR_BUDGET / MB:,.0f} MB budget"
    )


def test_front_image_within_budget() -> None:
    built = built_image("front")
    budget = FRONT_BUDGET.get(built.torch_index, FRONT_CPU_BUDGET)
    assert built.size_bytes <= budget, (
        f"{built.ref} (torch from {built.torch_index}) is {built.size_bytes / MB:,.0f} MB, "
        f"over its {budget / MB:,.0f} MB budget"
    )


def test_picker_image_within_budget() -> None:
    built = built_image("picker")
    assert built.size_bytes <= PICKER_BUDGET, (
        f"{built.ref} is {built.size_bytes / MB:,.0f} MB, over its {PICKER_BUDGET / MB:,.0f} MB budget"
    )

"""The API group is spelled once (`contract.API_GROUP`); everything else derives from it."""

from __future__ import annotations

from typing import get_args

from promptcache.api import API_VERSION, GROUP, KIND, PromptCacheDeployment
from promptcache.api.constants import CRD_NAME
from promptcache.contract import API_GROUP, OPERATOR_ANNOTATION_PREFIX
from promptcache.controller.compare import HASH_ANNOTATION
from promptcache.controller.handlers import ANNOTATION_PREFIX
from promptcache.controller.kube import by_kind
from promptcache.render.epp import CONFIG_HASH_ANNOTATION


def test_every_name_of_the_group_derives_from_the_one_constant() -> None:
    assert GROUP == API_GROUP
    assert API_VERSION.startswith(f"{API_GROUP}/")
    assert CRD_NAME.endswith(f".{API_GROUP}")
    assert f"{API_GROUP}/" == OPERATOR_ANNOTATION_PREFIX
    assert HASH_ANNOTATION.startswith(OPERATOR_ANNOTATION_PREFIX)
    assert CONFIG_HASH_ANNOTATION.startswith(OPERATOR_ANNOTATION_PREFIX)
    assert ANNOTATION_PREFIX == API_GROUP
    assert by_kind(KIND).api_version == API_VERSION


def test_the_models_literals_are_the_constants() -> None:
    """A `Literal` type must spell its value; this keeps it equal to the constants."""
    fields = PromptCacheDeployment.model_fields
    assert get_args(fields["api_version"].annotation) == (API_VERSION,)
    assert get_args(fields["kind"].annotation) == (KIND,)

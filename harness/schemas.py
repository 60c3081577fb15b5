"""Validate rendered manifests against the real schemas: Kubernetes' own and the pinned CRDs'.

Core kinds go through kubernetes-validate (the upstream OpenAPI schemas, strict:
unknown fields fail). InferencePool and HTTPRoute are checked against the
openAPIV3Schema of the exact CRD files `e2e/cluster` installs.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from harness.localcluster.crds import gateway_crd_files, monitoring_crd_files

ROOT = Path(__file__).resolve().parents[1]
KUBERNETES_VERSION = "1.35.0"


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) → openAPIV3Schema, for every served version of the pinned CRDs."""
    # The same files `e2e/cluster which crds` / `which monitoring-crds` list.
    files = [*gateway_crd_files(), *monitoring_crd_files()]
    schemas: dict[tuple[str, str], dict[str, Any]] = {}
    for path in files:
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            for version in spec["versions"]:
                key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                schemas[key] = version["schema"]["openAPIV3Schema"]
    return schemas


def _reject_unknown_fields(schema: Any) -> Any:
    """The API server prunes unknown fields silently; in a test an unknown field is a bug."""
    if isinstance(schema, dict):
        out = {k: _reject_unknown_fields(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_reject_unknown_fields(v) for v in schema]
    return schema


def validate_manifest(manifest: dict[str, Any]) -> None:
    """Raise with the failing path when a manifest does not match its schema."""
    key = (manifest["apiVersion"], manifest["kind"])
    schemas = crd_schemas() if "." in manifest["apiVersion"].split("/")[0] else {}
    if key in schemas:
        body = {k: v for k, v in manifest.items() if k != "metadata"}
        schema = _reject_unknown_fields(schemas[key])
        # Not jsonschema.validate: it first checks the schema itself, and CRDs carry Go
        # regexes Python's `re` rejects (the PrometheusRule CRD's `^(?i)(abort|warn)?$`).
        jsonschema.validators.validator_for(schema)(schema).validate(body)
        return
    kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)

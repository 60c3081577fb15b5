#!/usr/bin/env python3
"""Extract Kubernetes' own schemas of the pod fields a PromptCacheDeployment may overlay.

`spec.model.podTemplate` and `spec.gateway.podTemplate` accept core/v1 Affinity,
TopologySpreadConstraint, LocalObjectReference, Volume, VolumeMount and EnvVar exactly as a
PodSpec does. Rather than re-typing them, this tool takes the upstream OpenAPI definitions
(shipped by `kubernetes-validate` for the pinned Kubernetes version) and rewrites them into
the structural dialect a CRD needs: references inlined, `null` type unions dropped,
int-or-string made explicit, descriptions dropped (the CRD must stay small enough for a
client-side `kubectl apply`). The result is checked in as
`operator/promptcache/api/k8s_schemas.json`; a test fails when it is stale.

Usage::

    tools/k8s_schemas.py           # regenerate
    tools/k8s_schemas.py --check   # exit 1 when the checked-in file differs
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "operator" / "promptcache" / "api" / "k8s_schemas.json"
KUBERNETES_VERSION = "1.35.0"
DEFINITIONS = {
    "Affinity": "io.k8s.api.core.v1.Affinity",
    "TopologySpreadConstraint": "io.k8s.api.core.v1.TopologySpreadConstraint",
    "LocalObjectReference": "io.k8s.api.core.v1.LocalObjectReference",
    "Volume": "io.k8s.api.core.v1.Volume",
    "VolumeMount": "io.k8s.api.core.v1.VolumeMount",
    "EnvVar": "io.k8s.api.core.v1.EnvVar",
}
_INT_OR_STRING = {
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString",
    "io.k8s.apimachinery.pkg.api.resource.Quantity",
}
_OPAQUE = {"io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
_KEEP = ("type", "format", "enum", "required", "properties", "items", "additionalProperties")


def _definitions() -> dict[str, Any]:
    import kubernetes_validate  # noqa: PLC0415 - a dev dependency, needed only here

    base = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    path = base / f"v{KUBERNETES_VERSION}-local-strict" / "_definitions.json"
    defs: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))["$defs"]
    return defs


def _structural(  # noqa: C901 - one case per schema keyword
    node: dict[str, Any], defs: dict[str, Any], seen: tuple[str, ...]
) -> Any:
    ref = node.get("$ref")
    if ref is not None:
        name = ref.rsplit("/", 1)[-1]
        if name in _INT_OR_STRING:
            return {"anyOf": [{"type": "integer"}, {"type": "string"}],
                    "x-kubernetes-int-or-string": True}  # fmt: skip
        if name in _OPAQUE or name in seen:
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        return _structural(defs[name], defs, (*seen, name))
    out: dict[str, Any] = {}
    kind = node.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if kinds else None
    if kind is None and "properties" in node:
        kind = "object"
    if kind is not None:
        out["type"] = kind
    for key in _KEEP:
        if key == "type" or key not in node:
            continue
        value = node[key]
        if key == "properties":
            out[key] = {k: _structural(v, defs, seen) for k, v in sorted(value.items())}
        elif key in ("items", "additionalProperties"):
            if isinstance(value, dict):
                out[key] = _structural(value, defs, seen)
        elif key == "enum":
            out[key] = [v for v in value if v is not None]
        else:
            out[key] = value
    return out


def generate() -> str:
    defs = _definitions()
    schemas = {name: _structural({"$ref": ref}, defs, ()) for name, ref in DEFINITIONS.items()}
    doc = {"kubernetesVersion": KUBERNETES_VERSION, "schemas": schemas}
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail when the file is stale")
    args = parser.parse_args()
    text = generate()
    if args.check:
        if OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run tools/k8s_schemas.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)} ({len(text)} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The body-based router's contract: what GIE's `bbr` v1.5.0 reads and writes.

Several resources behind one Gateway are told apart by the request's `model`. The router
(an ext_proc in front of the Gateway's routing, deployed once per Gateway by the chart)
copies `model` into `MODEL_HEADER` and, for an adapter, its base model into
`BASE_MODEL_HEADER`, from ConfigMaps labelled `MAPPING_LABEL` whose data holds the base
model (`MAPPING_BASE_MODEL_KEY`) and a YAML list of its adapters (`MAPPING_ADAPTERS_KEY`).
The renderer writes one such ConfigMap per resource and one HTTPRoute rule matching
`BASE_MODEL_HEADER` to the resource's InferencePool; the chart starts the router with the
plugins below. Verified against `sigs.k8s.io/gateway-api-inference-extension@v1.5.0`
(`pkg/bbr/plugins/...`, `cmd/bbr/runner`).
"""

from __future__ import annotations

from typing import Final

MODEL_HEADER: Final[str] = "X-Gateway-Model-Name"
"""`body-field-to-header`'s header for the body's `model` (bodyfieldtoheader.ModelHeader)."""
BASE_MODEL_HEADER: Final[str] = "X-Gateway-Base-Model-Name"
"""`base-model-to-header`'s header: the base model of an adapter, the base model itself, or
empty for a name no mapping knows (basemodelextractor.BaseModelHeader)."""
MAPPING_LABEL: Final[str] = "inference.networking.k8s.io/bbr-managed"
"""ConfigMaps the router reads carry this label with the value `"true"`."""
MAPPING_FINALIZER: Final[str] = "serving.promptcache.io/router-map"
"""Held by a mapping ConfigMap and by its resource until the router has seen the mapping
lose `MAPPING_LABEL`: bbr v1.5.0 never sees a deleted mapping (controller/router_map.py)."""
MAPPING_UNMAPPED_AT: Final[str] = "serving.promptcache.io/unmapped-at"
"""Annotation: when the operator took `MAPPING_LABEL` off a mapping on its way out."""
MAPPING_BASE_MODEL_KEY: Final[str] = "baseModel"
MAPPING_ADAPTERS_KEY: Final[str] = "adapters"
BBR_GRPC_PORT: Final[int] = 9004
"""The router's ext_proc port (`--grpc-port` default)."""
BBR_HEALTH_PORT: Final[int] = 9005
"""The router's gRPC health port (`--grpc-health-port` default)."""
BBR_METRICS_PORT: Final[int] = 9090
BBR_PLUGINS: Final[tuple[str, ...]] = (
    'body-field-to-header:model-extractor:{"fieldName":"model","headerName":"X-Gateway-Model-Name"}',
    "base-model-to-header:base-model-mapper",
)
"""The router's `--plugin` values: its defaults, written out as GIE's chart does."""

GATEWAY_HEADER: Final[str] = "X-Promptcache-Gateway"
"""Set by the model-list responder's HTTPRoute (a `RequestHeaderModifier`, so a client's own
value is overwritten) to `<namespace>/<name>` of the Gateway, or `<namespace>/<name>/<listener>`:
which Gateway's list the responder answers with."""
CATALOG_PORT: Final[int] = 8000
"""The model-list responder's serving port (`promptcache catalog --port`)."""
CATALOG_HEALTH_PORT: Final[int] = 8081
"""Its `/healthz` and `/readyz` (`--health-port`), never routed by the Gateway."""
MODELS_PATH: Final[str] = "/v1/models"

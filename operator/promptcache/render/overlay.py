"""A resource's `podTemplate` merged onto a rendered pod template, as a strategic merge patch
would: maps merged, lists merged by their Kubernetes merge key (`name`, `mountPath`).

The API rules already refused every overlay that would replace an operator-owned part, so the
merge here only ever adds (or replaces what the user set elsewhere, e.g. `engine.env`).
"""

from __future__ import annotations

from typing import Any

from promptcache.api.podtemplate import GatewayPodTemplate, ModelPodTemplate

_SCALARS = ("priority_class_name", "runtime_class_name", "scheduler_name")


def _merge_list(base: list[dict[str, Any]], extra: list[dict[str, Any]], key: str) -> list[Any]:
    """Items of `extra` replace items of `base` with the same `key`; new ones are appended."""
    replaced = {item[key]: item for item in extra}
    merged = [replaced.pop(item[key], item) for item in base]
    return merged + [item for item in extra if item[key] in replaced]


def apply_pod_template(  # noqa: C901 - one guarded merge step per pod field
    template: dict[str, Any], overlay: ModelPodTemplate | GatewayPodTemplate | None, container: str
) -> dict[str, Any]:
    """`template` (a Deployment's `spec.template`) with `overlay` merged onto it."""
    if overlay is None:
        return template
    meta = dict(template.get("metadata", {}))
    if overlay.metadata.labels:
        meta["labels"] = {**meta.get("labels", {}), **overlay.metadata.labels}
    if overlay.metadata.annotations:
        meta["annotations"] = {**meta.get("annotations", {}), **overlay.metadata.annotations}
    spec = dict(template["spec"])
    extra = overlay.spec
    if extra.affinity is not None:
        spec["affinity"] = extra.affinity
    for attr in _SCALARS:
        value = getattr(extra, attr)
        if value is not None:
            spec[attr.split("_")[0] + "".join(w.title() for w in attr.split("_")[1:])] = value
    for field, items, key in (
        ("topologySpreadConstraints", extra.topology_spread_constraints, "topologyKey"),
        ("imagePullSecrets", extra.image_pull_secrets, "name"),
        ("volumes", extra.volumes, "name"),
    ):
        if items:
            spec[field] = _merge_list(spec.get(field, []), list(items), key)
    containers = []
    for rendered in spec["containers"]:
        merged = dict(rendered)
        for add in (a for a in extra.containers if a.name == merged["name"] == container):
            if add.env:
                merged["env"] = _merge_list(merged.get("env", []), list(add.env), "name")
            if add.volume_mounts:
                merged["volumeMounts"] = _merge_list(
                    merged.get("volumeMounts", []), list(add.volume_mounts), "mountPath"
                )
        containers.append(merged)
    spec["containers"] = containers
    return {**template, "metadata": meta, "spec": spec}

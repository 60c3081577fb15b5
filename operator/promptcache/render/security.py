"""Pod and container hardening shared by every workload the renderer emits.

Every pod meets the Kubernetes Pod Security "restricted" profile: non-root, no privilege
escalation, all capabilities dropped, seccomp `RuntimeDefault`; and every container has a
read-only root filesystem, with emptyDirs where something must write (/tmp, the model
cache, /dev/shm). No UID is fixed where the image declares a numeric non-root user (this
project's images and the Endpoint Picker's do), so a platform that assigns UIDs
(OpenShift's restricted SCC) can. The upstream vLLM image declares none (it would run as
root and fail `runAsNonRoot`), so its container gets `OperatorDefaults.model_server_user`
unless that is unset. `e2e/test_pod_security.py` has the API server's PodSecurity
admission check every rendered pod.
"""

from __future__ import annotations

from typing import Any


def pod_security_context(*, fs_group: int | None = None) -> dict[str, Any]:
    """`fs_group`: the group volumes (a model-cache claim) are made writable for."""
    context: dict[str, Any] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    if fs_group is not None:
        context["fsGroup"] = fs_group
    return context


def container_security_context(
    *, read_only_root: bool = True, run_as_user: int | None = None
) -> dict[str, Any]:
    """`run_as_user`: only for images without a numeric non-root USER (vLLM's)."""
    context: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": read_only_root,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    if run_as_user is not None:
        context["runAsUser"] = run_as_user
        context["runAsGroup"] = run_as_user
    return context

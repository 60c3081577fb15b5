"""Byte counts as Kubernetes quantities, for limits derived from the spec."""

from __future__ import annotations

MIB = 1024**2


def mebibytes(n_bytes: int) -> str:
    """Round up to whole MiB: a limit must never be below what it has to hold."""
    return f"{-(-n_bytes // MIB)}Mi"

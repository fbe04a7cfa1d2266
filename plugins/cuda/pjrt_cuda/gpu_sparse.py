"""jaxlib's ``gpu_sparse`` for CUDA: the cuSPARSE kernels of the kernel wheel
(``jax_cuda13_plugin._sparse`` or CUDA 12's), tridiagonal_solve's ``gtsv2`` among them."""
from __future__ import annotations

from typing import Any

from ._kernels import KERNELS

__all__ = ["registrations", "batch_partitionable_targets"]


def registrations() -> dict[str, list[tuple[str, Any, int]]]:
    """``{"CUDA": [(target, capsule, api_version), ...]}``, as jaxlib's (an empty list
    without the kernel wheel)."""
    return KERNELS.registrations("sparse")


def batch_partitionable_targets() -> list[str]:
    """The targets that take any number of leading batch dimensions."""
    return [name for name, _, _ in registrations()["CUDA"] if name.endswith("gtsv2_ffi")]

"""jaxlib's ``gpu_linalg`` for ROCm: the LU-pivot, Cholesky-update and perturbed tridiagonal
kernels of the kernel wheel (``jax_rocm10_plugin._linalg`` or ROCm 7's)."""
from __future__ import annotations

from typing import Any

from ._kernels import KERNELS

__all__ = ["registrations", "batch_partitionable_targets"]


def registrations() -> dict[str, list[tuple[str, Any, int]]]:
    """``{"ROCM": [(target, capsule, 1), ...]}``, as jaxlib's (an empty list without the
    kernel wheel)."""
    return KERNELS.registrations("linalg")


def batch_partitionable_targets() -> list[str]:
    """The targets that take any number of leading batch dimensions."""
    return [name for name, _, _ in registrations()["ROCM"]
            if name.endswith("_lu_pivots_to_permutation")]

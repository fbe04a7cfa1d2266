"""jaxlib's ``gpu_linalg`` for CUDA: the LU-pivot, Cholesky-update and perturbed tridiagonal
kernels of the kernel wheel (``jax_cuda13_plugin._linalg`` or CUDA 12's)."""
from __future__ import annotations

from typing import Any

from ._kernels import KERNELS

__all__ = ["registrations", "batch_partitionable_targets"]


def registrations() -> dict[str, list[tuple[str, Any, int]]]:
    """``{"CUDA": [(target, capsule, 1), ...]}``, as jaxlib's (an empty list without the
    kernel wheel)."""
    return KERNELS.registrations("linalg")


def batch_partitionable_targets() -> list[str]:
    """The targets that take any number of leading batch dimensions."""
    return [name for name, _, _ in registrations()["CUDA"]
            if name.endswith("_lu_pivots_to_permutation")]

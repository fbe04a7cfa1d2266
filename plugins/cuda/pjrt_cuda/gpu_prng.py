"""jaxlib's ``gpu_prng`` for CUDA: the threefry kernel of the kernel wheel
(``jax_cuda13_plugin._prng`` or CUDA 12's)."""
from __future__ import annotations

from typing import Any

from ._kernels import KERNELS

__all__ = ["registrations"]


def registrations() -> dict[str, list[tuple[str, Any, int]]]:
    """``{"CUDA": [(target, capsule, api_version), ...]}``, as jaxlib's (an empty list
    without the kernel wheel)."""
    return KERNELS.registrations("prng")

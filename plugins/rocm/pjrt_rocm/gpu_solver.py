"""jaxlib's ``gpu_solver`` for ROCm: the hipSOLVER and hybrid kernels of the kernel wheel.

The handlers come from ``jax_rocm10_plugin._solver`` and ``._hybrid`` (or ROCm 7's); see
[`pjrt.plugin_support.GpuKernels`][pjrt.plugin_support.GpuKernels].
"""
from __future__ import annotations

from typing import Any

from ._kernels import KERNELS

__all__ = ["registrations", "batch_partitionable_targets", "initialize_hybrid_kernels",
           "has_magma"]


def registrations() -> dict[str, list[tuple[str, Any, int]]]:
    """``{"ROCM": [(target, capsule, api_version), ...]}``, as jaxlib's: the hipSOLVER targets
    (api_version 1 for the typed-FFI ``*_ffi`` ones) and the hybrid ones; an empty list
    without the kernel wheel."""
    return KERNELS.registrations("solver", "hybrid")


def batch_partitionable_targets() -> list[str]:
    """The targets that take any number of leading batch dimensions."""
    return [name for name, _, api_version in registrations()["ROCM"] if api_version == 1]


def initialize_hybrid_kernels() -> None:
    """Give the hybrid kernels their LAPACK (from SciPy); pjrt does it itself before the
    first program calling one compiles.

    Raises:
      ImportError: the kernel wheel is not installed, or SciPy is missing.
    """
    KERNELS.module("hybrid").initialize()


def has_magma() -> bool:
    """Whether the hybrid kernels found MAGMA (False without the kernel wheel)."""
    if KERNELS.wheel() is None:
        return False
    return bool(KERNELS.module("hybrid").has_magma())

"""jaxlib's CPU sparse kernel: ``cpu_csr_sparse_dense_ffi``, the custom call jax lowers the
product of a CSR matrix (``jax.experimental.sparse.BCSR``) and a dense matrix or vector to on
CPU. XLA's CPU plugin has no handler for it; this package's C library does
(``_lapack/sparse_kernels.c``, in the same library as the LAPACK kernels, needing no LAPACK).

The handler takes the values, ``indptr`` and ``indices`` of the CSR matrix and the dense
operand, as jax passes them, in int32, int64, float32, float64, complex64 or complex128 (int32
or int64 indices), and checks every index before it reads a value: a malformed matrix is an
error of the program, never a read outside its buffers. It runs on the calling thread, where
jaxlib splits large products over XLA's thread pool: a 4000 x 4000 float32 matrix with 1%
non-zeros times a 4000 x 64 one takes 2.2 ms, jax 0.9 ms with its two threads (a 2-core
machine). pjrt-cpu registers it with pjrt for the ``cpu`` platform whenever it registers the
LAPACK kernels (before a client of the plugin is made).
"""
from __future__ import annotations

import ctypes
import functools

from .lapack import library_path

__all__ = ["SPARSE_TARGETS", "register_sparse_kernels", "registrations", "targets"]

#: The sparse custom-call targets the library handles.
SPARSE_TARGETS = ("cpu_csr_sparse_dense_ffi",)


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    lib = ctypes.CDLL(library_path())
    lib.pjrt_cpu_sparse_num_targets.argtypes = []
    lib.pjrt_cpu_sparse_num_targets.restype = ctypes.c_int
    lib.pjrt_cpu_sparse_target_name.argtypes = [ctypes.c_int]
    lib.pjrt_cpu_sparse_target_name.restype = ctypes.c_char_p
    lib.pjrt_cpu_sparse_target_handler.argtypes = [ctypes.c_int]
    lib.pjrt_cpu_sparse_target_handler.restype = ctypes.c_void_p
    return lib


def targets() -> dict[str, int]:
    """The sparse custom-call targets: name -> ``XLA_FFI_Handler*`` address."""
    lib = _library()
    return {lib.pjrt_cpu_sparse_target_name(i).decode("ascii"):
            lib.pjrt_cpu_sparse_target_handler(i)
            for i in range(lib.pjrt_cpu_sparse_num_targets())}


def registrations() -> dict[str, list[tuple[str, int, int]]]:
    """jaxlib's ``cpu_sparse.registrations()``: ``{"cpu": [(target, handler address, 1)]}``,
    each a typed-FFI handler (api_version 1)."""
    return {"cpu": [(name, address, 1) for name, address in targets().items()]}


def register_sparse_kernels(platform: str = "cpu") -> list[str]:
    """Register the sparse handlers for ``platform`` with pjrt (see
    [`pjrt.plugin_api.register_custom_call_target`][pjrt.plugin_api.register_custom_call_target]);
    safe to call again, before or after a client exists. Returns the target names."""
    from pjrt import plugin_api

    for name, address in targets().items():
        plugin_api.register_custom_call_target(name, address, platform=platform)
    return list(targets())

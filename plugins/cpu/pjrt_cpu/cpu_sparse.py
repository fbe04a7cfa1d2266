"""jaxlib's CPU sparse kernel: ``cpu_csr_sparse_dense_ffi``, the custom call jax lowers the
product of a CSR matrix (``jax.experimental.sparse.BCSR``) and a dense matrix or vector to on
CPU. XLA's CPU plugin has no handler for it; this package's C library does
(``_lapack/sparse_kernels.c``, in the same library as the LAPACK kernels, needing no LAPACK).

The handler takes the values, ``indptr`` and ``indices`` of the CSR matrix and the dense
operand, as jax passes them, in int32, int64, float32, float64, complex64 or complex128 (int32
or int64 indices), and checks every index before it reads a value: a malformed matrix is an
error of the program, never a read outside its buffers.

A large product (about 2^17 multiply-adds per thread at the least) splits its rows over
threads, up to the cores the process may run on: contiguous chunks of about equal work, four
per thread, which the calling thread and helper threads started for the call claim one at a
time. The call returns once every chunk is done (no thread writes its result afterwards), and
on a busy machine the calling thread takes over the chunks of helpers not yet running, so a
product is not held up by a thread waiting for a core. Calls share no state, so concurrent
calls need no lock. Each output row is summed by one thread in stored order, so results are
the same, bit for bit, on any number of threads. [`set_max_threads`][pjrt_cpu.cpu_sparse.set_max_threads] caps the
threads (1: the calling thread alone). Figures next to jax: ``benchmarks/bench_sparse.py``, and
benchmarks/README.md ("Sparse products").

pjrt-cpu registers it with pjrt for the ``cpu`` platform whenever it registers the LAPACK
kernels (before a client of the plugin is made).
"""
from __future__ import annotations

import ctypes
import functools

from .lapack import library_path

__all__ = ["SPARSE_TARGETS", "max_threads", "register_sparse_kernels", "registrations",
           "set_max_threads", "targets"]

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
    lib.pjrt_cpu_sparse_set_max_threads.argtypes = [ctypes.c_int]
    lib.pjrt_cpu_sparse_set_max_threads.restype = ctypes.c_int
    lib.pjrt_cpu_sparse_max_threads.argtypes = []
    lib.pjrt_cpu_sparse_max_threads.restype = ctypes.c_int
    lib.pjrt_cpu_sparse_threads_started.argtypes = []
    lib.pjrt_cpu_sparse_threads_started.restype = ctypes.c_int64
    return lib


def set_max_threads(n: int | None) -> int | None:
    """Set the most threads one sparse product may use: ``n`` >= 1 (taken as asked, even
    above the cores), or None for as many as the process's cores (the default). Products
    already running keep theirs; the setting holds for the whole process. Returns the previous
    setting (None: the default).

    Raises:
      ValueError: ``n`` is below 1.
    """
    if n is not None and (isinstance(n, bool) or int(n) != n or n < 1):
        raise ValueError(f"set_max_threads takes a count of at least 1, or None for every "
                         f"core; got {n!r}")
    previous = _library().pjrt_cpu_sparse_set_max_threads(0 if n is None else int(n))
    return previous or None


def max_threads() -> int | None:
    """The setting of `set_max_threads` (None: the process's cores)."""
    return _library().pjrt_cpu_sparse_max_threads() or None


def _threads_started() -> int:
    """Threads the kernel has started for products in this process (for tests)."""
    return int(_library().pjrt_cpu_sparse_threads_started())


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

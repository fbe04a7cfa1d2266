"""The LAPACK custom-call kernels every jax linear-algebra program needs on CPU.

jax lowers ``jnp.linalg`` and ``jax.scipy.linalg`` on CPU to XLA FFI custom calls named
``lapack_<type><routine>_ffi`` (``lapack_dpotrf_ffi``, ``lapack_zgesdd_ffi``, ...). jaxlib
registers handlers for them inside its own XLA; XLA's standalone CPU plugin has none, so such
a program fails with ``NOT_FOUND: No FFI handler registered for lapack_spotrf_ffi``.

This package ships the handlers in a small C library (``_lapack_kernels``, built from the C
files in ``_lapack/``; ``lapack_kernels.c`` says which holds what). It links no LAPACK: [`provide_lapack`][pjrt_cpu.lapack.provide_lapack] hands it the
routines SciPy exports (``scipy.linalg.cython_lapack`` and ``cython_blas``, as PyCapsules),
the same ones jaxlib uses. [`register_lapack_kernels`][pjrt_cpu.lapack.register_lapack_kernels] registers every handler through
[`pjrt.plugin_api`][pjrt.plugin_api] (pjrt's FFI registry), which passes them to each CPU plugin as it comes up, and leaves the hand-over
for later: importing SciPy costs more than the rest of pjrt's start-up, so
[`provide_lapack`][pjrt_cpu.lapack.provide_lapack] runs when the first program calling a LAPACK target is compiled.

One more target is not LAPACK: ``tridiagonal_solve_perturbed_ffi``, jax's lowering of
``lax.linalg.tridiagonal_solve(..., perturb_singular=True)``, which
``jax.scipy.linalg.eigh_tridiagonal`` uses to compute eigenvectors by inverse iteration. jaxlib
implements it in its own C++ (pivoted elimination that perturbs tiny pivots instead of
failing, after LAPACK's xLAGTF/xLAGTS); the library has a C version of it, one target for all
four types.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import os
import threading

__all__ = ["LAPACK_DTYPE_PREFIX", "OTHER_TARGETS", "TARGETS", "batch_partitionable_targets",
           "build_lapack_fn_target", "library_path", "prepare_lapack_call", "provide_lapack",
           "register_lapack_kernels", "registrations", "targets"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_LIBRARY_STEM = "_lapack_kernels"

#: The custom-call routines implemented, by LAPACK name; each exists for the four types
#: s (float32), d (float64), c (complex64) and z (complex128), with the complex spelling in
#: brackets where LAPACK's differs.
TARGETS = ("potrf", "getrf", "geqrf", "geqp3", "orgqr [ungqr]", "ormqr [unmqr]", "trsm",
           "gesdd", "gesvd", "syevd [heevd]", "geev", "gees", "gehrd", "sytrd [hetrd]", "gtsv")

#: Targets implemented without LAPACK, by their full custom-call name; each handles float32,
#: float64, complex64 and complex128 under the one name.
OTHER_TARGETS = ("tridiagonal_solve_perturbed_ffi",)


def library_path() -> str:
    """Where the compiled kernel library is.

    Raises:
      FileNotFoundError: pjrt-cpu was installed without building its C library.
    """
    # The library uses no Python API, so its name carries no Python version; builds that
    # named it as an extension module (``_lapack_kernels.cpython-311-...so``) are still found.
    for suffix in (".so", *importlib.machinery.EXTENSION_SUFFIXES):
        candidate = os.path.join(_HERE, _LIBRARY_STEM + suffix)
        if os.path.isfile(candidate):
            return candidate
    raise FileNotFoundError(f"the LAPACK kernel library {_LIBRARY_STEM} is missing from "
                            f"{_HERE}; reinstall pjrt-cpu with a C compiler available")


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    lib = ctypes.CDLL(library_path())
    lib.pjrt_cpu_lapack_set.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    lib.pjrt_cpu_lapack_set.restype = ctypes.c_int
    lib.pjrt_cpu_lapack_routine_name.argtypes = [ctypes.c_int]
    lib.pjrt_cpu_lapack_routine_name.restype = ctypes.c_char_p
    lib.pjrt_cpu_lapack_num_targets.argtypes = []
    lib.pjrt_cpu_lapack_num_targets.restype = ctypes.c_int
    lib.pjrt_cpu_lapack_target_name.argtypes = [ctypes.c_int]
    lib.pjrt_cpu_lapack_target_name.restype = ctypes.c_char_p
    lib.pjrt_cpu_lapack_target_handler.argtypes = [ctypes.c_int]
    lib.pjrt_cpu_lapack_target_handler.restype = ctypes.c_void_p
    lib.pjrt_cpu_lapack_target_ready.argtypes = [ctypes.c_int]
    lib.pjrt_cpu_lapack_target_ready.restype = ctypes.c_int
    return lib


def _capsule_address(capsule) -> int:
    """The pointer in a PyCapsule, whatever name the capsule carries (Cython names it after
    the function's signature)."""
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return get_pointer(capsule, get_name(capsule))


_provide_lock = threading.Lock()
_provided: list[str] | None = None


def provide_lapack() -> list[str]:
    """Hand SciPy's LAPACK and BLAS routines to the kernel library (once); return their names.

    Raises:
      ImportError: SciPy is not installed.
      RuntimeError: SciPy lacks a routine the kernels need.
    """
    global _provided
    with _provide_lock:
        if _provided is not None:
            return list(_provided)
        try:
            from scipy.linalg import cython_blas, cython_lapack  # pyright: ignore[reportAttributeAccessIssue]
        except ImportError as exc:
            raise ImportError(f"the LAPACK kernels take their routines from SciPy, which "
                              f"cannot be imported ({exc}); install it: pip install scipy") from exc

        exported = {**cython_blas.__pyx_capi__, **cython_lapack.__pyx_capi__}
        lib = _library()
        names, missing = [], []
        index = 0
        while (raw := lib.pjrt_cpu_lapack_routine_name(index)) is not None:
            index += 1
            name = raw.decode("ascii")
            capsule = exported.get(name)
            if capsule is None:
                missing.append(name)
                continue
            lib.pjrt_cpu_lapack_set(raw, _capsule_address(capsule))
            names.append(name)
        if missing:
            raise RuntimeError(f"SciPy does not export LAPACK/BLAS routines {missing}; "
                               f"install a newer SciPy")
        _provided = names
        return list(names)


def targets() -> dict[str, int]:
    """Every custom-call target the library handles: name -> ``XLA_FFI_Handler*`` address."""
    lib = _library()
    return {lib.pjrt_cpu_lapack_target_name(i).decode("ascii"):
            lib.pjrt_cpu_lapack_target_handler(i)
            for i in range(lib.pjrt_cpu_lapack_num_targets())}


def register_lapack_kernels(platform: str = "cpu") -> list[str]:
    """Register every LAPACK custom-call handler for ``platform`` (through
    [`pjrt.plugin_api.register_custom_call_target`][pjrt.plugin_api.register_custom_call_target]).

    Safe to call repeatedly and before or after a CPU client exists: pjrt keeps the
    registrations and passes them to each plugin serving ``platform`` (see
    [`pjrt.ffi`][pjrt.ffi] for when a plugin counts as serving it). SciPy is not imported here
    but before the first compile of a program that calls a LAPACK target
    ([`pjrt.plugin_api.register_target_preparation`][pjrt.plugin_api.register_target_preparation]).

    Returns:
      The registered target names.
    """
    from pjrt import plugin_api

    registered = []
    needs_lapack = []
    lib = _library()
    for index, (name, address) in enumerate(targets().items()):
        plugin_api.register_custom_call_target(name, address, platform=platform)
        registered.append(name)
        if not lib.pjrt_cpu_lapack_target_ready(index):
            needs_lapack.append(name)
    # SciPy's import costs more than the rest of start-up, and most programs call no LAPACK:
    # the routines are handed over before the first program that calls one is compiled.
    plugin_api.register_target_preparation(needs_lapack, provide_lapack, platform=platform)
    return registered


# -- jaxlib's names (jaxlib/lapack.py) --------------------------------------------------------

#: The LAPACK type letter of each element type, as jaxlib names it.
LAPACK_DTYPE_PREFIX = {"float32": "s", "float64": "d", "complex64": "c", "complex128": "z"}


def registrations() -> dict[str, list[tuple[str, int, int]]]:
    """jaxlib's ``lapack.registrations()``: ``{"cpu": [(target, handler address, 1), ...]}``,
    every target of the library (each a typed-FFI handler, api_version 1). The handlers
    take their LAPACK routines from SciPy ([`provide_lapack`][pjrt_cpu.lapack.provide_lapack]),
    which pjrt runs before the first program calling one compiles."""
    return {"cpu": [(name, address, 1) for name, address in targets().items()]}


def batch_partitionable_targets() -> list[str]:
    """The targets that take any number of leading batch dimensions: all of them."""
    return list(targets())


def build_lapack_fn_target(fn_base: str, dtype) -> str:
    """The custom-call target of LAPACK routine ``fn_base`` for ``dtype``: ``("getrf_ffi",
    float32)`` is ``lapack_sgetrf_ffi``.

    Raises:
      NotImplementedError: ``dtype`` is not float32, float64, complex64 or complex128.
    """
    import numpy as np

    try:
        prefix = LAPACK_DTYPE_PREFIX[np.dtype(dtype).name]
    except (KeyError, TypeError) as exc:
        raise NotImplementedError(f"LAPACK has no routines for {dtype!r}; it takes float32, "
                                  f"float64, complex64 and complex128") from exc
    return f"lapack_{prefix}{fn_base}"


def prepare_lapack_call(fn_base: str, dtype) -> str:
    """Give the kernels their LAPACK routines (once) and return the target of ``fn_base`` for
    ``dtype`` ([`build_lapack_fn_target`][pjrt_cpu.lapack.build_lapack_fn_target]).

    Raises:
      ImportError: SciPy is not installed.
      NotImplementedError: ``dtype`` is not a LAPACK type.
    """
    provide_lapack()
    return build_lapack_fn_target(fn_base, dtype)

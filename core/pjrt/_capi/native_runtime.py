"""The core's native runtime (``pjrt._native_runtime``, built from ``_native/hot_path.c`` and
the files it names), wired to the cffi extension once, here.

The runtime owns the state machine of the per-call path and nothing else: call tickets and the
release of an owner's buffers (`HandleCore`, the base of
`pjrt._capi.handles.ClientHandle`), an Array's fields and its one constructor (`ArrayCore`,
the base of `pjrt.array.Array`), the launch of a program on one or several devices
(`CallPlan`, on at most `MAX_DEVICES` devices) and an Array's host view (ArrayCore's buffer
protocol: ``np.asarray`` and ``memoryview`` of a value in host memory). Python above it decides
the policy: which errors to raise and their words, parking, teardown, when to check what.

It reaches the plugin only through functions of the cffi extension (``_pjrt_cffi``), whose
addresses it is given below; every other module imports the runtime from here, so that it is
never used unwired.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .._native_runtime import (MAX_DEVICES, ArrayCore, CallPlan, HandleCore, configure,
                               launches_keep_gil, programs_may_call_python,
                               set_array_site_recorder)
from .._pjrt_cffi import ffi, lib
from .waits import WAIT_SLICE_MS, wait_buffer_ready

if TYPE_CHECKING:
    import numpy as np

__all__ = ["MAX_DEVICES", "ArrayCore", "CallPlan", "HandleCore", "launches_keep_gil",
           "programs_may_call_python", "set_array_site_recorder"]


def _buffer_format(dtype: np.dtype) -> bytes | None:
    """numpy's own buffer-protocol format for ``dtype``, which numpy reads back as ``dtype``;
    None where there is none (ml_dtypes' types: their arrays are read through ``__array__``).

    Called at an Array's first read of each dtype, when numpy is loaded anyway; importing it
    here rather than with the module keeps numpy out of a process that only loads a plugin
    and makes a client."""
    import numpy as np

    try:
        exported = memoryview(np.empty(0, dtype))  # pyright: ignore[reportArgumentType]
        if np.asarray(exported).dtype != dtype:
            return None
    except (TypeError, ValueError, BufferError):
        return None
    return exported.format.encode()


def _address(function_name: str) -> int:
    return int(ffi.cast("uintptr_t", ffi.addressof(lib, function_name)))


# The runtime reads the address behind a PJRT_Buffer* cdata by assigning the cdata into this
# one-element cffi array (cffi's own, checked conversion) and reading the array's memory.
_address_slot = ffi.new("PJRT_Buffer*[1]")
configure(_address_slot, int(ffi.cast("uintptr_t", _address_slot)),
          buffer_destroy=_address("pjrt_shim_buffer_destroy"),
          error_destroy=_address("pjrt_shim_error_destroy"),
          call_run=_address("pjrt_shim_call_run"),
          host_address=_address("pjrt_host_address"),
          buffer_wait=_address("pjrt_shim_buffer_wait"),
          waiter_finish=_address("pjrt_shim_waiter_finish"), wait_slice_ms=WAIT_SLICE_MS,
          wait_ready=wait_buffer_ready, buffer_format=_buffer_format)

"""Numpy arguments passed straight to a program call: copied to the devices for that call only.

``CompiledProgram`` hands numpy arguments to the executable as they are. The executable
collects them here and starts every copy in one native call (``pjrt_shim_buffers_from_host``)
under its own call's ticket, launches the program, and frees the copies right after: the
plugin keeps what a running program reads. No Array object is made for them, and nothing is
waited on: the program's launch orders the copies before it.

On host-memory plugins, a value for one device goes through staging memory only from
`CALL_STAGING_THRESHOLD_BYTES` (below it the plugin's own copy is as
fast, since its allocator recycles the memory of the last call), and a replicated value is
copied from the host once, into one staging block every device adopts.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from .._pjrt_cffi import ffi, lib
from ..array import native_host
from ..dtypes import to_pjrt_type
from ..errors import ArgumentMismatchError, consume
from .._capi.handles import HostBufferSemantics
from .._capi.staging import (CALL_STAGING_THRESHOLD_BYTES, SharedStaging, adoptable_copy,
                            should_stage)

if TYPE_CHECKING:
    from ..device import ClientView, Device
    from ..sharding import Sharding

_NULL = ffi.NULL
_ZERO_COPY = int(HostBufferSemantics.ZERO_COPY)


def host_array(index: int, value, spec) -> np.ndarray:
    """The call's argument ``index`` as a C-contiguous native-order numpy array, checked
    against the parameter's ``(shape, dtype)`` when the program says what it is."""
    host = value if type(value) is np.ndarray and value.dtype.isnative else native_host(value)
    if spec is not None and (host.shape != spec[0] or host.dtype != spec[1]):
        raise ArgumentMismatchError(index, host.shape, host.dtype, spec[0], spec[1])
    if not host.flags.c_contiguous:
        host = np.ascontiguousarray(host)  # (a 0-d array is always contiguous)
    return host


def check_shards(index: int, shape: tuple, dtype, sharding: "Sharding", expected) -> None:
    """Raise TypeError unless argument ``index`` of ``shape`` and ``dtype``, cut by
    ``sharding``, gives the parameter's ``(shard shape, dtype)`` (``expected``; None: unknown)."""
    if expected is None:
        return
    shard_shape = tuple(sharding.shard_shape(shape))
    if shard_shape != expected[0] or dtype != expected[1]:
        raise TypeError(f"argument {index} has shape {shape} and dtype {dtype}: shards of "
                        f"{shard_shape}, but the program expects shards of {expected[0]} and "
                        f"dtype {expected[1]}")


class HostCopies:
    """The host-to-device copies of one call: gathered, started together, freed together.

    Each copy is written straight into the arrays the native call reads. ``start`` and
    ``free`` run inside the caller's native call on the client (its ticket), so the client
    outlives both.
    """

    __slots__ = ("_client", "_platform", "_count", "_made", "_data", "_keep", "_types",
                 "_num_dims", "_dims", "_semantics", "_devices", "_slots", "_buffers", "_done",
                 "_staged")

    def __init__(self, client: "ClientView", capacity: int):
        """``capacity``: the most copies the call can make (its argument slots)."""
        self._client = client
        self._platform = client.platform
        self._count = 0
        #: How many copies exist, written by the native call itself: a KeyboardInterrupt
        #: arriving as it returns cannot lose them.
        self._made = ffi.new("size_t *")
        self._data = ffi.new("void*[]", capacity)
        self._keep: list = []  # the host arrays and their cffi views, alive until started
        self._types = ffi.new("PJRT_Buffer_Type[]", capacity)
        self._num_dims = ffi.new("size_t[]", capacity)
        self._dims: list[int] = []
        self._semantics = ffi.new("int[]", capacity)  # zeros: IMMUTABLE_ONLY_DURING_CALL
        self._devices = ffi.new("PJRT_Device*[]", capacity)
        self._slots = ffi.new("size_t[]", capacity)
        self._buffers = _NULL
        self._done = ffi.new("PJRT_Event*[]", capacity)
        #: (item index, what keeps the adopted memory) of the zero-copy items
        self._staged: list = []

    def add_value(self, slot: int, value, spec, device: "Device", donated: bool) -> None:
        """Copy the host value ``value`` (checked against ``spec``, see `host_array`)
        to ``device`` as argument slot ``slot``."""
        self.add(slot, host_array(slot, value, spec), device, donated)

    def add(self, slot: int, host: np.ndarray, device: "Device", donated: bool,
            adopted=None) -> None:
        """Copy the C-contiguous native-order ``host`` to ``device`` as argument ``slot``.

        ``adopted``: ``host`` is staging memory already made for this call (shared by
        several devices through that object), to be adopted rather than copied again.
        """
        k = self._count
        self._count = k + 1
        if adopted is not None:
            self._stage(k, adopted)
        # A donated slot is not staged: the program may write into it, and staging memory
        # goes back to the pool to be reused. (The size is tested first, inline: most values
        # are small, and this runs for each of them.)
        elif (host.nbytes >= CALL_STAGING_THRESHOLD_BYTES and not donated
                and should_stage(self._platform, host, CALL_STAGING_THRESHOLD_BYTES)):
            self._client.raw_handle.recycle_host_memory()
            host = adoptable_copy(host)
            self._stage(k, host)
        view = ffi.from_buffer(host)
        self._keep.append(view)
        self._data[k] = view
        self._types[k] = to_pjrt_type(host.dtype)
        self._num_dims[k] = host.ndim
        self._dims.extend(host.shape)
        self._devices[k] = device.pointer
        self._slots[k] = slot

    def _stage(self, k: int, adopted) -> None:
        self._semantics[k] = _ZERO_COPY
        self._staged.append((k, adopted))

    def add_replicated(self, slots: Sequence[int], host: np.ndarray,
                       devices: Sequence["Device"], donated: bool) -> None:
        """Copy ``host`` whole to each of ``devices`` (slot ``slots[k]`` for the k-th)."""
        if donated or len(devices) < 2 or not should_stage(self._platform, host):
            for slot, device in zip(slots, devices):
                self.add(slot, host, device, donated)
            return
        self._client.raw_handle.recycle_host_memory()
        staged = adoptable_copy(host)
        shared = SharedStaging(staged, len(devices))
        for slot, device in zip(slots, devices):
            self.add(slot, staged, device, donated, adopted=shared)

    def add_sharded(self, index: int, num_arguments: int, host: np.ndarray,
                    sharding: "Sharding", devices: Sequence["Device"], donated: bool) -> None:
        """Cut ``host`` by ``sharding`` into argument ``index`` of a call on ``devices`` (the
        argument array holds ``num_arguments`` slots per device, device after device)."""
        slots = [d * num_arguments + index for d in range(len(devices))]
        if sharding.is_fully_replicated:
            self.add_replicated(slots, host, devices, donated)
            return
        indices = sharding.devices_indices_map(host.shape)
        for slot, device in zip(slots, devices):
            shard = host[indices[device]]
            if not shard.flags.c_contiguous:
                shard = np.ascontiguousarray(shard)
            self.add(slot, shard, device, donated)

    def start(self, argument_array) -> None:
        """Start every copy in one native call; each new buffer goes to its slot of
        ``argument_array``. On an error nothing is left behind."""
        count = self._count
        if not count:
            return
        dims = self._dims
        handle = self._client.raw_handle
        api = handle.api
        api.require("PJRT_Client_BufferFromHostBuffer")  # the shim calls the entry unchecked
        self._buffers = argument_array
        error = lib.pjrt_shim_buffers_from_host(
            api.table, handle.pointer, count, self._data, self._types,
            ffi.new("int64_t[]", dims) if dims else _NULL, self._num_dims, self._semantics,
            self._devices, self._slots, argument_array, self._done, self._made)
        self._keep.clear()  # the plugin has copied, or holds its event for the staged memory
        if error != _NULL:
            self.free()
            raise consume(api, error)

    def free(self) -> None:
        """Free the copies (the plugin keeps what a launched program still reads) and keep
        adopted host memory until the plugin lets go of it. Frees nothing twice."""
        made = self._made[0]
        if not made:
            return
        self._made[0] = 0
        handle = self._client.raw_handle
        buffers, slots = self._buffers, self._slots
        made_buffers = [buffers[slots[k]] for k in range(made)]
        for k in range(made):
            buffers[slots[k]] = _NULL
        lib.pjrt_shim_buffers_destroy(handle.api.table, ffi.new("PJRT_Buffer*[]", made_buffers),
                                      made)
        holds = [(adopted, self._done[k]) for k, adopted in self._staged
                 if k < made and self._done[k] != _NULL]
        if holds:
            handle.keep_host_memory_until_done(holds)

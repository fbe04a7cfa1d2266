"""Host values passed straight to a program call: copied to the devices for that call only.

``CompiledProgram`` hands numpy arguments to the executable as they are. The executable
collects them here and starts every copy in one native call (``pjrt_shim_buffers_from_host``)
under its own call's ticket, launches the program, and frees the copies right after: the
plugin keeps what a running program reads. No Array object is made for them, and nothing is
waited on: the program's launch orders the copies before it.

Copies follow ``Client.buffer_from_pyval``'s rules (large values go through staging memory on
host-memory plugins), with one addition: a replicated value is copied from the host once, and
every device adopts that one staging block.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from . import dtypes
from ._pjrt_cffi import ffi, lib
from .array import native_host
from .errors import consume
from .handles import HostBufferSemantics
from .staging import SharedStaging, adoptable_copy, should_stage

if TYPE_CHECKING:
    from .client import Client
    from .device import Device
    from .sharding import Sharding

_NULL = ffi.NULL
_DURING_CALL = int(HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL)
_ZERO_COPY = int(HostBufferSemantics.ZERO_COPY)


def host_array(index: int, value, spec) -> np.ndarray:
    """The call's argument ``index`` as a C-contiguous native-order numpy array, checked
    against the parameter's ``(shape, dtype)`` when the program says what it is."""
    host = value if type(value) is np.ndarray and value.dtype.isnative else native_host(value)
    if spec is not None and (host.shape != spec[0] or host.dtype != spec[1]):
        raise TypeError(f"argument {index} has shape {host.shape} and dtype {host.dtype}, but "
                        f"the program expects shape {spec[0]} and dtype {spec[1]}")
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

    ``start`` and ``free`` run inside the caller's native call on the client (its ticket),
    so the client outlives both.
    """

    __slots__ = ("_client", "_items", "_buffers", "_count", "_holds")

    def __init__(self, client: "Client"):
        self._client = client
        #: (position in the argument array, host array, device, semantics, hold object)
        self._items: list = []
        self._buffers = _NULL
        self._count = 0
        self._holds: list = []

    def add(self, position: int, host: np.ndarray, device: "Device", donated: bool) -> None:
        """Copy ``host`` to ``device`` as argument slot ``position``."""
        # A donated slot is not staged: the program may write into it, and staging memory
        # goes back to the pool to be reused.
        if not donated and should_stage(self._client.platform, host):
            self._client._handle.recycle_host_memory()
            staged = adoptable_copy(host)
            self._items.append((position, staged, device, _ZERO_COPY, staged))
        else:
            self._items.append((position, host, device, _DURING_CALL, None))

    def add_replicated(self, positions: Sequence[int], host: np.ndarray,
                       devices: Sequence["Device"], donated: bool) -> None:
        """Copy ``host`` whole to each of ``devices`` (slot ``positions[k]`` for the k-th)."""
        if donated or len(devices) < 2 or not should_stage(self._client.platform, host):
            for position, device in zip(positions, devices):
                self.add(position, host, device, donated)
            return
        self._client._handle.recycle_host_memory()
        staged = adoptable_copy(host)
        shared = SharedStaging(staged, len(devices))
        for position, device in zip(positions, devices):
            self._items.append((position, staged, device, _ZERO_COPY, shared))

    def add_sharded(self, index: int, num_arguments: int, host: np.ndarray,
                    sharding: "Sharding", devices: Sequence["Device"], donated: bool) -> None:
        """Cut ``host`` by ``sharding`` into argument ``index`` of a call on ``devices`` (the
        argument array holds ``num_arguments`` slots per device, device after device)."""
        positions = [d * num_arguments + index for d in range(len(devices))]
        if sharding.is_fully_replicated:
            self.add_replicated(positions, host, devices, donated)
            return
        indices = sharding.devices_indices_map(host.shape)
        for position, device in zip(positions, devices):
            shard = host[indices[device]]
            if not shard.flags.c_contiguous:
                shard = np.ascontiguousarray(shard)
            self.add(position, shard, device, donated)

    def start(self, argument_array) -> None:
        """Start every copy in one native call; each new buffer goes to its slot of
        ``argument_array``. On an error nothing is left behind."""
        items = self._items
        count = len(items)
        if not count:
            return
        data = ffi.new("void*[]", count)
        types = ffi.new("PJRT_Buffer_Type[]", count)
        num_dims = ffi.new("size_t[]", count)
        semantics = ffi.new("int[]", count)
        devices = ffi.new("PJRT_Device*[]", count)
        dims: list[int] = []
        keep = []
        for k, (_, host, device, semantic, _) in enumerate(items):
            view = ffi.from_buffer(host)
            keep.append(view)
            data[k] = view
            types[k] = dtypes.to_pjrt_type(host.dtype)
            num_dims[k] = host.ndim
            dims.extend(host.shape)
            semantics[k] = semantic
            devices[k] = device._handle
        buffers = ffi.new("PJRT_Buffer*[]", count)
        done = ffi.new("PJRT_Event*[]", count)
        failed = ffi.new("size_t *")
        api = self._client._handle.api
        api.require("PJRT_Client_BufferFromHostBuffer")  # the shim calls the entry unchecked
        error = lib.pjrt_shim_buffers_from_host(
            api.table, self._client._handle.pointer, count, data, types,
            ffi.new("int64_t[]", dims) if dims else _NULL, num_dims, semantics, devices,
            buffers, done, failed)
        self._buffers, self._count = buffers, count
        for k, item in enumerate(items):
            if done[k] != _NULL:
                self._holds.append((item[4], done[k]))
        if error != _NULL:
            self._count = failed[0]
            self.free()
            raise consume(api, error)
        for k, item in enumerate(items):
            argument_array[item[0]] = buffers[k]

    def free(self) -> None:
        """Free the copies (the plugin keeps what a launched program still reads) and keep
        adopted host memory until the plugin lets go of it."""
        handle = self._client._handle
        if self._count:
            lib.pjrt_shim_buffers_destroy(handle.api.table, self._buffers, self._count)
            self._count = 0
        if self._holds:
            holds, self._holds = self._holds, []
            handle.keep_host_memory_until_done(holds)

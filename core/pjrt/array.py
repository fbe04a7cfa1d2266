"""Arrays on devices: the owner of ``PJRT_Buffer`` handles, and host transfers both ways.

An :class:`Array` owns its buffers: each is destroyed exactly once, when the array is deleted,
donated to a program, garbage-collected, or its client is closed, whichever comes first. It keeps
its client's C handle alive, so a client never goes before its buffers.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from . import dtypes
from ._pjrt_cffi import ffi, lib
from .errors import ClosedClientError, DeletedArrayError, check

if TYPE_CHECKING:
    from .client import Client
    from .device import Device, Memory

_NULL = ffi.NULL


class Array:
    """An array held in device memory.

    Attributes:
      shape: the array's shape (a tuple of ints).
      dtype: its numpy dtype.

    ``np.asarray(array)`` copies it to the host (waiting for any computation producing it); the
    host copy is cached and read-only, since an Array never changes.
    """

    __slots__ = ("_client", "_handle", "_buffers", "_devices", "shape", "dtype", "_host_value",
                 "_host_keepalive", "_deleted_reason", "__weakref__")

    def __init__(self, client: "Client", buffers: list, devices: tuple, shape: tuple,
                 dtype: np.dtype, host_keepalive=None):
        self._client = client
        self._handle = client._handle
        self._buffers = buffers
        self._devices = devices
        self.shape = shape
        self.dtype = dtype
        self._host_value = None
        self._host_keepalive = host_keepalive
        self._deleted_reason = None
        self._handle.buffers[id(self)] = buffers
        client._live_arrays.add(self)

    # -- ownership -------------------------------------------------------------------------

    def _release(self, reason: str = "deleted") -> None:
        """Destroy the buffers now (idempotent). Later uses raise DeletedArrayError."""
        if self._buffers is None:
            return
        self._buffers = None
        self._deleted_reason = reason
        self._host_keepalive = None
        self._handle.release_buffers(id(self))

    def __del__(self):
        self._handle.release_buffers(id(self))

    def _live_buffers(self) -> list:
        buffers = self._buffers
        if buffers is None:
            if self._handle.closed and self._deleted_reason == "deleted":
                raise ClosedClientError("this array's client has been closed")
            raise DeletedArrayError(
                f"this array has been {self._deleted_reason or 'deleted'}; it can no longer "
                f"be used (a donated array is consumed by the program it was passed to)")
        if self._handle.closed:
            raise ClosedClientError("this array's client has been closed")
        return buffers

    def delete(self) -> None:
        """Free the device memory now. Using the array afterwards raises DeletedArrayError."""
        self._release("deleted")

    def is_deleted(self) -> bool:
        """Whether the array was deleted, donated, or its client closed."""
        return self._buffers is None or self._handle.closed

    # -- metadata --------------------------------------------------------------------------

    @property
    def client(self) -> "Client":
        return self._client

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """Bytes of the array's elements as numpy would hold them on the host."""
        return self.size * self.dtype.itemsize

    @property
    def device(self) -> "Device":
        """The device holding this (single-device) array."""
        if len(self._devices) != 1:
            raise ValueError(f"this array spans {len(self._devices)} devices; use devices()")
        return self._devices[0]

    def devices(self) -> set:
        """The set of devices holding a part of the array."""
        return set(self._devices)

    @property
    def memory_kind(self) -> str:
        """The kind of memory the array lives in (e.g. ``"device"``)."""
        api = self._handle.api
        args = api.call_new("PJRT_Buffer_Memory", buffer=self._live_buffers()[0])
        return self._client._memory(args.memory).kind

    def on_device_size_in_bytes(self) -> int:
        """Bytes the plugin uses for the array on its device(s), padding included."""
        api = self._handle.api
        return sum(int(api.call_new("PJRT_Buffer_OnDeviceSizeInBytes", buffer=b)
                       .on_device_size_in_bytes) for b in self._live_buffers())

    def unsafe_buffer_pointer(self) -> int:
        """The device address of the (single) buffer. Valid while the array lives."""
        api = self._handle.api
        return int(api.call_new("PJRT_Buffer_UnsafePointer",
                                buffer=self._live_buffers()[0]).buffer_pointer)

    # -- synchronisation -------------------------------------------------------------------

    def block_until_ready(self) -> "Array":
        """Wait until the computation producing the array has finished; returns self.

        Raises:
          XlaRuntimeError: the computation failed.
        """
        table = self._handle.api.table
        for buffer in self._live_buffers():
            check(self._handle.api, lib.pjrt_shim_buffer_await_ready(table, buffer))
        return self

    def is_ready(self) -> bool:
        """Whether the array's value has been computed (without waiting)."""
        api = self._handle.api
        for buffer in self._live_buffers():
            event = api.call_new("PJRT_Buffer_ReadyEvent", buffer=buffer).event
            try:
                ready = api.call_new("PJRT_Event_IsReady", event=event).is_ready
            finally:
                lib.pjrt_shim_event_destroy(api.table, event)
            if not ready:
                return False
        return True

    # -- host transfers --------------------------------------------------------------------

    def _value(self) -> np.ndarray:
        value = self._host_value
        if value is None:
            buffers = self._live_buffers()
            if len(buffers) != 1:
                raise NotImplementedError("reading a multi-device array needs its sharding")
            value = _buffer_to_host(self._handle.api, buffers[0], self.shape, self.dtype)
            self._host_value = value
        return value

    def __array__(self, dtype=None, copy=None):
        value = self._value()
        if dtype is not None and np.dtype(dtype) != value.dtype:
            return value.astype(dtype)
        if copy:
            return value.copy()
        return value

    def to_py(self) -> np.ndarray:
        """The value as a (read-only) numpy array."""
        return self._value()

    def tolist(self):
        return self._value().tolist()

    def item(self):
        return self._value().item()

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __float__(self):
        return float(self._value())

    def __int__(self):
        return int(self._value())

    def __bool__(self):
        return bool(self._value())

    def copy_to_device(self, device: "Device") -> "Array":
        """A copy of this single-device array on ``device`` (of the same or another client)."""
        buffer = self._live_buffers()[0]
        target_client = device.client
        if target_client._handle is not self._handle:
            return target_client.buffer_from_pyval(self._value(), device)
        api = self._handle.api
        args = api.call_new("PJRT_Buffer_CopyToDevice", buffer=buffer, dst_device=device._handle)
        return Array(self._client, [args.dst_buffer], (device,), self.shape, self.dtype)

    def copy_to_memory(self, memory: "Memory") -> "Array":
        """A copy of this single-device array in ``memory`` (e.g. a host memory space)."""
        buffer = self._live_buffers()[0]
        api = self._handle.api
        args = api.call_new("PJRT_Buffer_CopyToMemory", buffer=buffer, dst_memory=memory._handle)
        devices = memory.addressable_by_devices()
        return Array(self._client, [args.dst_buffer], (devices[0] if devices else self.device,),
                     self.shape, self.dtype)

    def __repr__(self) -> str:
        if self.is_deleted():
            return f"Array(<{self._deleted_reason or 'deleted'}>, shape={self.shape}, dtype={self.dtype})"
        where = ", ".join(str(d) for d in self._devices)
        return f"Array({np.array2string(self._value(), separator=', ')}, dtype={self.dtype}, device={where})"


def _buffer_to_host(api, buffer, shape: tuple, dtype: np.dtype) -> np.ndarray:
    out = np.empty(shape, dtype=dtype)
    if out.size:
        destination = ffi.cast("void *", out.__array_interface__["data"][0])
        check(api, lib.pjrt_shim_buffer_to_host(api.table, buffer, destination, out.nbytes))
    else:
        check(api, lib.pjrt_shim_buffer_await_ready(api.table, buffer))
    out.flags.writeable = False
    return out


def array_from_host(client: "Client", value, device: "Device | None", semantics: int,
                    memory: "Memory | None" = None) -> Array:
    """Copy a host value to one device of ``client``; see ``Client.buffer_from_pyval``."""
    handle = client.handle
    if device is None:
        device = memory.addressable_by_devices()[0] if memory is not None else client._local_devices[0]
    elif device.client is not client:
        raise ValueError(f"{device} belongs to another client ({device.client.platform}); "
                         f"pass a device of this {client.platform} client")
    host = np.asarray(value)
    if not host.flags.c_contiguous:
        host = host.copy(order="C")  # (np.ascontiguousarray would turn a 0-d array into 1-d)
    buffer_type = dtypes.to_pjrt_type(host.dtype)
    dims = ffi.new("int64_t[]", host.shape) if host.ndim else _NULL
    out = ffi.new("PJRT_Buffer **")
    data = ffi.cast("const void *", host.__array_interface__["data"][0])
    api = handle.api
    api.require("PJRT_Client_BufferFromHostBuffer")  # the shim calls the entry unchecked
    check(api, lib.pjrt_shim_buffer_from_host(
        api.table, handle.pointer, data, buffer_type, dims, host.ndim, int(semantics),
        device._handle if memory is None else _NULL,
        memory._handle if memory is not None else _NULL, out))
    keepalive = host if semantics >= 2 else None
    return Array(client, [out[0]], (device,), host.shape, host.dtype, keepalive)


def device_put(value, device: "Device") -> Array:
    """Place ``value`` (a numpy-compatible value or an Array) on ``device``."""
    if isinstance(value, Array):
        if value._devices == (device,):
            return value
        return value.copy_to_device(device)
    return device.client.buffer_from_pyval(value, device)


def block_until_ready(arrays: Sequence[Array]) -> list[Array]:
    """Wait for every array in ``arrays``; returns them."""
    for array in arrays:
        array.block_until_ready()
    return list(arrays)

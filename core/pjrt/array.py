"""Arrays on devices: the owner of ``PJRT_Buffer`` handles, and host transfers both ways.

An [`Array`][pjrt.array.Array] owns its buffers: each is destroyed exactly once, when the array is deleted,
donated to a program, garbage-collected, or its client is closed, whichever comes first (but
never while numpy still reads it without a copy). It keeps its client's C handle alive, so a
client never goes before its buffers.

On CPU plugins device memory is host memory, which both directions exploit: reading an array
gives a read-only numpy view of the buffer, and a large host array is copied once into memory
the plugin adopts instead of being copied by the plugin at half of memcpy speed.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Generator, Sequence

import numpy as np

from . import dtypes, layouts
from ._runtime import dlpack_export as _dlpack
from ._runtime import host_reads
from ._runtime.host_reads import buffer_to_host
from ._capi.native_runtime import ArrayCore
from ._profiling import recorder
from ._pjrt_cffi import ffi, lib
from .device import ClientView, Device, Memory
from .errors import ClosedClientError, DeletedArrayError, DeviceAssignmentMismatchError, check
from ._capi.handles import HostBufferSemantics
from ._capi.staging import adoptable_copy, should_stage
from ._capi.waits import wait_buffers_ready
from ._capi.ready_events import wait_until_ready

_NULL = ffi.NULL

@dataclasses.dataclass(frozen=True)
class Shard:
    """One device's part of an Array."""

    device: "Device"
    #: The slices of the global array this shard covers.
    index: tuple
    #: The shard as a single-device Array (it shares the global array's buffer).
    data: "Array"


class Array(ArrayCore):
    """An array held in device memory.

    Attributes:
      shape: the array's shape (a tuple of ints).
      dtype: its numpy dtype.

    ``np.asarray(array)`` gives its value on the host, waiting for any computation producing
    it. The result is read-only: pjrt never changes an Array's value. When the device memory is
    host memory (CPU plugins) it is a view of the buffer itself, with no copy; otherwise it is
    a copy, cached for later reads (never for a `shared` Array, whose DLPack partner may
    write to the memory).
    """

    # The fields are ArrayCore's (pjrt._capi.native_runtime; their one list is HP_ARRAY_FIELDS
    # in _native/hot_path.h, typed in pjrt/_native_runtime.pyi): they behave as slots, and C
    # reads them on the per-call path. ArrayCore also holds the one constructor: ``__init__`` below hands
    # it the fields, and ``Array._adopt(client, handle, buffers, devices, shape, dtype)`` makes
    # an array without calling the class (an executable's outputs). When an Array is
    # collected, ArrayCore's finaliser marks it deleted and hands its buffers to the handle,
    # which frees them under its own rules (a finaliser in C rather than a __del__: one Python
    # frame per Array freed would cost more than the rest of a small call).
    __slots__ = ("__weakref__",)

    def __init__(self, client: ClientView, buffers: list, devices: tuple, shape: tuple,
                 dtype: np.dtype, host_holds=None, sharding=None, parent: "Array | None" = None,
                 physical_order: tuple | None = None):
        """Wrap buffers the caller hands over (not for users: arrays come from transfers
        and executions).

        Args:
          buffers: ``buffers[i]`` is the shard on ``devices[i]``; the array owns them unless
            ``parent`` is given, in which case it borrows one of the parent's.
          host_holds: ``(host array, PJRT_Event*)`` pairs from [`put_buffer`][pjrt.array.put_buffer]: host memory
            the buffers may read, kept until the plugin says it is done with it.
          shape: the global shape; dtype: the element type.
          sharding: how the shards lay the array out (a single-device sharding when None).
          physical_order: for buffers whose layout is not row-major (a program's output
            compiled to another layout), the dimensions from major to minor; reads honour it.
        """
        handle = client.raw_handle
        ArrayCore.__init__(self, client, handle, buffers, devices, shape, dtype, sharding,
                           parent, physical_order)
        if parent is None and host_holds:
            holds = [hold for hold in host_holds if hold is not None]
            if holds:
                handle.hold_host_memory(id(self), holds)

    # -- ownership -------------------------------------------------------------------------

    def _owner_id(self) -> int:
        """The id the buffers are registered under: a shard's are its global array's."""
        return id(self._parent) if self._parent is not None else id(self)

    def _viewed(self) -> bool:
        """Whether numpy views of the buffers' memory are still in use somewhere."""
        return self._handle.is_viewed(self._owner_id())

    def keep_memory_for(self, keeper) -> None:
        """Keep the buffers' memory for as long as ``keeper`` lives (the object a numpy view
        or a DLPack export holds), even past ``delete()`` or ``Client.close()``.

        Called inside a native call, after the buffers were read: the keeper is registered
        first and the array checked afterwards, so a ``delete()`` racing from another thread
        either sees the keeper or is seen here.

        Raises:
          DeletedArrayError: the array was deleted meanwhile (nothing is kept).
          ClosedClientError: its client was closed meanwhile.
        """
        self._handle.add_view(self._owner_id(), keeper)
        self.live_buffers()

    @property
    def shared(self) -> bool:
        """Whether the buffers' memory is shared with a DLPack consumer or producer (a
        zero-copy ``__dlpack__`` or ``pjrt.from_dlpack``). Such a consumer may write to it
        (PyTorch ignores DLPack's read-only flag); the Array then shows the writes to every
        reader alike (numpy, programs), as a jax Array does, since its value is never cached
        on the host again."""
        return self._shared or (self._parent is not None and self._parent._shared)

    def mark_shared(self) -> None:
        """Record that the memory is shared through DLPack (see `shared`): the cached
        host copy is dropped, and reads see the buffer itself from now on."""
        self._shared = True
        host_reads.forget_copy(self)
        if self._parent is not None:
            self._parent.mark_shared()

    def _release(self, reason: str = "deleted") -> None:
        """Destroy the buffers now (idempotent). Later uses raise DeletedArrayError.

        While numpy views of the buffer are alive the memory stays until they go (the array
        reads as deleted at once). A borrowed shard releases the global array it belongs to.
        """
        if self._parent is not None:
            self._buffers = None
            self._deleted_reason = reason
            self._parent._release(reason)
            return
        if self._buffers is None:
            return
        self._buffers = None
        self._deleted_reason = reason
        self._handle.release_when_unviewed(id(self))

    @property
    def shard_devices(self) -> tuple:
        """The device of each of this array's buffers, in buffer order (`devices()` is a
        set)."""
        return self._devices

    def live_buffers(self) -> list:
        """The `PJRT_Buffer*` of each shard, in `shard_devices` order, for a native call on
        the array's client (the array keeps owning them).

        Raises:
          ClosedClientError: the array's client is closed.
          DeletedArrayError: the array was deleted or donated.
        """
        # A closed client is reported first: its reason (closed, forked, exiting) says more
        # than that this one array is gone.
        if self._handle.closed:
            raise ClosedClientError(f"this array's client is closed: {self._handle.closed_reason}")
        buffers = self._buffers
        if self._parent is not None and self._parent._buffers is None:
            buffers = None  # a shard of a global array that has been deleted or donated
            self._deleted_reason = self._parent._deleted_reason
        if buffers is None:
            raise DeletedArrayError(
                f"this array has been {self._deleted_reason or 'deleted'}; it can no longer "
                f"be used (a donated array is consumed by the program it was passed to)")
        return buffers

    def clone(self) -> "Array":
        """A new Array of the same buffers, with no copy (jaxlib's ``clone``): the two share
        the device memory, so deleting or donating either deletes both.

        Raises:
          DeletedArrayError: the array was deleted or donated.
          ClosedClientError: its client is closed.
        """
        buffers = self.live_buffers()
        owner = self._parent if self._parent is not None else self
        return Array(self._client, list(buffers), self._devices, self.shape, self.dtype,
                     sharding=self._sharding, parent=owner,
                     physical_order=self._physical_order)

    def delete(self) -> None:
        """Free the device memory now. Using the array afterwards raises DeletedArrayError."""
        self._release("deleted")

    def __copy__(self) -> "Array":
        """``copy.copy(x)``: a new Array with its own buffers holding the same value, on the
        same devices and with the same sharding (as jax's ``copy.copy`` of an Array). The two
        are independent: deleting or donating one leaves the other intact."""
        with self._handle.calling() as handle:
            copies, holds = _copy_shards(self, handle.api, self.live_buffers())
            return Array(self._client, copies, self._devices, self.shape, self.dtype, holds,
                         self._sharding)

    def __deepcopy__(self, memo) -> "Array":
        """``copy.deepcopy(x)``: the same as ``copy.copy(x)`` (an Array holds no Python
        objects to copy deeper)."""
        return self.__copy__()

    def __reduce__(self):
        raise TypeError("a pjrt Array cannot be pickled (its buffers live in this process's "
                        "client); pickle np.asarray(x) and place it again with "
                        "pjrt.device_put after loading")

    def _shard_shape(self) -> tuple:
        if self._sharding is None:
            return self.shape
        return tuple(self._sharding.shard_shape(self.shape))

    @property
    def stored_order(self) -> tuple | None:
        """The buffers' dimensions from major to minor where not row-major (a program's output
        compiled to another layout), else None; reads give the logical value either way."""
        return self._physical_order

    def is_deleted(self) -> bool:
        """Whether the array was deleted, donated, or its client closed."""
        if self._parent is not None and self._parent.is_deleted():
            return True
        return self._buffers is None or self._handle.closed

    # -- metadata --------------------------------------------------------------------------

    @property
    def client(self) -> ClientView:
        return self._client

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

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
        """The set of devices holding a part of the array (other processes' included)."""
        if self._sharding is not None:
            return set(self._sharding.device_set)
        return set(self._devices)

    @property
    def is_fully_addressable(self) -> bool:
        """Whether every shard is on a device of this process."""
        return self._sharding is None or self._sharding.is_fully_addressable

    @property
    def sharding(self):
        """How the array is laid out over its devices (a [`Sharding`][pjrt.sharding.Sharding])."""
        if self._sharding is None:
            from .sharding import SingleDeviceSharding

            self._sharding = SingleDeviceSharding(self._devices[0])
        return self._sharding

    @property
    def is_fully_replicated(self) -> bool:
        return self.sharding.is_fully_replicated

    @property
    def addressable_shards(self) -> list["Shard"]:
        """The shards this process holds: each with its ``device``, ``index`` (the slices of
        the global array it covers) and ``data`` (a single-device Array of the shard)."""
        buffers = self.live_buffers()
        if self._sharding is None:
            index = tuple(slice(None) for _ in self.shape)
            return [Shard(self._devices[0], index, self)]
        indices = self._sharding.devices_indices_map(self.shape)
        shard_shape = self._sharding.shard_shape(self.shape)
        return [Shard(device, indices[device],
                      Array(self._client, [buffer], (device,), shard_shape, self.dtype,
                            parent=self, physical_order=self._physical_order))
                for device, buffer in zip(self._devices, buffers)]

    @property
    def memory_kind(self) -> str:
        """The kind of memory the array lives in (e.g. ``"device"``)."""
        return _kept(self, "memory_kind", _ask_memory_kind)

    @property
    def committed(self) -> bool:
        """Whether the array is tied to its devices (jaxlib's meaning). Every pjrt Array is:
        pjrt places nothing implicitly, so an array never moves unless asked."""
        return True

    @property
    def layout(self) -> layouts.PjRtLayout:
        """The memory layout of the array's buffer (of each shard; they share one).

        Raises:
          UnsupportedFeatureError: the plugin cannot report buffer layouts.
        """
        with self._handle.calling() as handle:
            return layouts.buffer_layout(handle.api, self.live_buffers()[0])

    @property
    def format(self) -> layouts.Format:
        """The array's [`Format`][pjrt.layouts.Format]: its layout and its sharding."""
        return layouts.Format(self.layout, self.sharding)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of the (single-device) array, sharing its memory (the protocol's
        method; see [`pjrt.dlpack`][pjrt.dlpack]). A versioned capsule when ``max_version >= (1, 0)``.

        Without a copy the array becomes `shared`: a consumer that writes to the memory
        (PyTorch ignores the read-only flag) is seen by every reader, as with jax. Pass
        ``copy=True`` to hand out a private copy instead.

        ``stream`` is the consumer's stream on a GPU (a handle, or 1 / 2 for CUDA's default
        streams): the plugin makes it wait for the array's value (the PJRT stream extension,
        as in jaxlib) and the host does not wait. None or -1: the host waits for the value.

        Raises:
          BufferError: the array spans several devices, or cannot be shared as asked; a
            ``stream`` for an array in host memory, or ``stream=0``.
          UnsupportedFeatureError: a ``stream`` where the plugin lacks the stream extension.
        """
        return _dlpack.export(self, stream=stream, max_version=max_version,
                              dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(DLPack device type, device id)`` of the array's memory."""
        if len(self._devices) != 1:
            raise BufferError(f"this array has {len(self._devices)} shards on different "
                              f"devices; ask each of addressable_shards")
        return _dlpack.device_of(self)

    def on_device_size_in_bytes(self) -> int:
        """Bytes the plugin uses for the array on its device(s), padding included."""
        with self._handle.calling():
            api = self._handle.api
            return sum(int(api.call_new("PJRT_Buffer_OnDeviceSizeInBytes", buffer=b)
                           .on_device_size_in_bytes) for b in self.live_buffers())

    def unsafe_buffer_pointer(self) -> int:
        """The device address of the (single-device) array's buffer. Valid while it lives.

        Raises:
          ValueError: the array has shards on several devices (each has its own buffer; ask
            each of ``addressable_shards`` instead).
        """
        with self._handle.calling():
            buffers = self.live_buffers()
            if len(buffers) != 1:
                raise ValueError(f"this array has {len(buffers)} shards, each in its own buffer; "
                                 f"call unsafe_buffer_pointer() on each of addressable_shards")
            api = self._handle.api
            return int(api.call_new("PJRT_Buffer_UnsafePointer", buffer=buffers[0]).buffer_pointer)

    # -- synchronisation -------------------------------------------------------------------

    def block_until_ready(self) -> "Array":
        """Wait until the computation producing the array has finished; returns self.

        Ctrl-C interrupts the wait (the computation itself goes on).

        Raises:
          XlaRuntimeError: the computation failed.
        """
        started = recorder.now() if recorder.active else 0  # a trace records the wait
        self._wait_with((self,))
        if started:
            recorder.waited(started, self)
        return self

    def _wait_with(self, arrays: Sequence["Array"]) -> None:
        """Wait for every buffer of ``arrays`` (Arrays of this one's client) in one native
        wait; raise the error of the first failed one, in order."""
        handle = self._handle
        with handle.calling(closed_ok=True):
            wait_buffers_ready(handle.api, [buffer for array in arrays
                                            for buffer in _buffers_to_wait(array)])

    def __await__(self) -> Generator[Any, None, "Array"]:
        """``await array``: wait, without blocking the event loop, until the computation
        producing the array has finished; resolves to the array itself.

        The plugin's completion event wakes the loop (no thread waits); an array already
        computed resolves at once without involving the loop. Cancelling the await leaves the
        computation and the array alone. See `pjrt.ready` for several arrays.

        Raises:
          XlaRuntimeError: the computation failed.
          DeletedArrayError: the array was deleted or donated.
          ClosedClientError: its client is closed.
        """
        yield from wait_until_ready((self,))
        return self

    def is_ready(self) -> bool:
        """Whether the array's value has been computed (without waiting)."""
        with self._handle.calling():
            api = self._handle.api
            for buffer in self.live_buffers():
                event = api.call_new("PJRT_Buffer_ReadyEvent", buffer=buffer).event
                try:
                    ready = api.call_new("PJRT_Event_IsReady", event=event).is_ready
                finally:
                    lib.pjrt_shim_event_destroy(api.table, event)
                if not ready:
                    return False
            return True

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def copy_to_device(self, device: "Device") -> "Array":
        """A copy of this single-device array on ``device`` (of the same or another client).

        Raises:
          ValueError: the array spans several devices (use ``pjrt.device_put``).
        """
        return _copy_to(self, device, None)

    def copy_to_memory(self, memory: "Memory") -> "Array":
        """A copy of this single-device array in ``memory`` (e.g. a host memory space).

        A memory of another client gets a copy through the host.

        Raises:
          ValueError: the array spans several devices, or no device can address ``memory``.
        """
        # A global array: _copy_to refuses it, before any question to ``memory``.
        devices = memory.addressable_by_devices() if len(self._devices) == 1 else self._devices
        if not devices:
            raise ValueError(f"no device addresses {memory!r}; pick a memory from "
                             f"device.addressable_memories()")
        return _copy_to(self, self._devices[0] if self._devices[0] in devices else devices[0],
                        memory)

    # -- reads to the host: pjrt._runtime.host_reads, free functions over an Array ----------
    # numpy's protocol (where the buffer protocol has no buffer) is one, bound: no frame added.
    __array__ = host_reads.to_numpy

    def to_py(self) -> np.ndarray:
        """The value as a (read-only) numpy array."""
        return np.asarray(self)

    def copy_to_host_async(self) -> None:
        """Start reading the value to the host, for a later ``np.asarray`` (jaxlib's method)."""
        host_reads.copy_to_host_async(self)

    def tolist(self):
        return np.asarray(self).tolist()

    def item(self):
        return np.asarray(self).item()

    def __float__(self):
        return float(np.asarray(self))

    def __int__(self):
        return int(np.asarray(self))

    def __bool__(self):
        return bool(np.asarray(self))

    def __repr__(self) -> str:
        if len(self._devices) > 1 and not self.is_deleted():
            return (f"Array(shape={self.shape}, dtype={self.dtype}, sharding={self.sharding!r})")
        if self.is_deleted():
            return f"Array(<{self._deleted_reason or 'deleted'}>, shape={self.shape}, dtype={self.dtype})"
        where = ", ".join(str(d) for d in self._devices)
        return f"Array({np.array2string(np.asarray(self), separator=', ')}, dtype={self.dtype}, device={where})"


def _kept(array: Array, name: str, ask: Callable[[Array], Any]) -> Any:
    """The answer of the buffer query ``name``: ``ask(array)`` the first time, kept on the Array
    afterwards (in ``_queries``), since what a buffer reports of itself never changes.

    The one place a query's answer is kept: a new query kept this way is a property of `Array`
    and an ``ask`` function here, with no field of its own in C. A deleted array raises as
    ``live_buffers`` does, kept answer or not.
    """
    queries = array._queries
    if queries is None:
        queries = array._queries = {}
    elif name in queries:
        array.live_buffers()
        return queries[name]
    answer = queries[name] = ask(array)
    return answer


def _ask_memory_kind(array: Array) -> str:
    client = array.client
    with client.raw_handle.calling() as handle:
        args = handle.api.call_new("PJRT_Buffer_Memory", buffer=array.live_buffers()[0])
        return client.memory_from_pointer(args.memory).kind


def _copy_to(array: Array, device: "Device", memory: "Memory | None") -> Array:
    """A copy of single-device ``array`` on ``device`` (in ``memory`` when given): by the
    plugin within one client, else through the host (also for a buffer not row-major)."""
    if len(array.shard_devices) != 1:
        raise ValueError(f"copy_to_{'memory' if memory else 'device'} moves a single-device "
                         f"array; place a global array with pjrt.device_put(x, sharding)")
    target_client = device.client if memory is None else memory.client
    if target_client is not array.client or array.stored_order is not None:
        return array_from_host(target_client, np.asarray(array), device,
                               HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL, memory)
    with array.client.raw_handle.calling() as handle:
        buffer = array.live_buffers()[0]
        if memory is None:
            copied = handle.api.call_new("PJRT_Buffer_CopyToDevice", buffer=buffer,
                                         dst_device=device.pointer).dst_buffer
        else:
            copied = handle.api.call_new("PJRT_Buffer_CopyToMemory", buffer=buffer,
                                         dst_memory=memory.pointer).dst_buffer
        return Array(array.client, [copied], (device,), array.shape, array.dtype)


def _copy_shards(array: Array, api, buffers: list) -> tuple[list, list]:
    """Copies of ``array``'s buffers on the same devices (for `Array.__copy__`), with the host
    memory each copy may still read. Where they fail, those made so far are freed."""
    copies: list = []
    holds: list = []
    try:
        for device, buffer in zip(array.shard_devices, buffers):
            # Not row-major: through the host, as device-side copies of such buffers differ
            # between plugins (XLA's 0.81 CPU build labels its copy row-major, bytes unchanged).
            if api.has("PJRT_Buffer_CopyToDevice") and array.stored_order is None:
                copies.append(api.call_new("PJRT_Buffer_CopyToDevice", buffer=buffer,
                                           dst_device=device.pointer).dst_buffer)
                holds.append(None)
            else:  # through the host
                host = np.ascontiguousarray(buffer_to_host(
                    api, buffer, array._shard_shape(), array.dtype, array.stored_order))
                copied, hold = put_buffer(array.client, host, device, 0)
                copies.append(copied)
                holds.append(hold)
    except BaseException:
        for copied in copies:
            lib.pjrt_shim_buffer_destroy(api.table, copied)
        raise
    return copies, holds


def array_from_host(client: ClientView, value, device: "Device | None",
                    semantics: HostBufferSemantics | int,
                    memory: "Memory | None" = None) -> Array:
    """Copy a host value to one device of ``client``; see ``Client.buffer_from_pyval``."""
    device = _placement_device(client, device, memory)
    host = native_host(value)
    with client.raw_handle.calling():
        buffer, hold = put_buffer(client, host, device, semantics, memory)
        return Array(client, [buffer], (device,), host.shape, host.dtype, [hold])


def _placement_device(client: ClientView, device: "Device | None",
                      memory: "Memory | None") -> "Device":
    """The device a buffer placed on ``device`` / in ``memory`` belongs to, both checked."""
    if memory is not None:
        if not isinstance(memory, Memory):
            raise TypeError(f"memory must be a pjrt Memory, not {type(memory).__name__} "
                            f"{memory!r}; pick one from device.addressable_memories()")
        if memory.client is not client:
            raise ValueError(f"{memory!r} belongs to another client ({memory.client!r}); pass "
                             f"a memory of this {client.platform} client")
        addressing = memory.addressable_by_devices()
        if device is None:
            if not addressing:
                raise ValueError(f"no device addresses {memory!r}")
            return addressing[0]
        if device not in addressing:
            names = ", ".join(map(str, addressing)) or "none"
            raise ValueError(f"{memory!r} is not a memory of {device} (devices that address it: "
                             f"{names}); pass one of device.addressable_memories()")
    if device is None:
        return client.local_devices()[0]
    if not isinstance(device, Device):
        hint = " (pass a Memory as memory=...)" if isinstance(device, Memory) else ""
        raise TypeError(f"device must be a pjrt Device, not {type(device).__name__} "
                        f"{device!r}{hint}; pick one from client.devices()")
    if device.client is not client:
        raise ValueError(f"{device} belongs to another client ({device.client!r}); pass a "
                         f"device of this {client.platform} client")
    return device


def native_host(value) -> np.ndarray:
    """``value`` as a numpy array in this machine's byte order (plugins read no other).

    Raises:
      ValueError: ``value`` is a numpy masked array (a device array has no mask, and dropping
        it silently would change the values' meaning); ValueError, as jax raises.
    """
    if isinstance(value, np.ma.MaskedArray):
        raise ValueError("numpy masked arrays cannot be placed on a device (the mask would be "
                         "lost); pass value.filled(fill) or value.data explicitly")
    host = np.asarray(value)
    if not host.dtype.isnative:
        host = host.astype(host.dtype.newbyteorder("="))
    return host


def put_buffer(client: ClientView, host: np.ndarray, device: "Device",
               semantics: HostBufferSemantics | int,
               memory: "Memory | None" = None) -> tuple:
    """Start a host-to-device copy; returns the new ``PJRT_Buffer*`` (owned by the caller)
    and, when the buffer may use the host memory directly, ``(host array, PJRT_Event*)``:
    the memory to keep until the event fires (None otherwise).

    The caller brackets this with a native call on the client (``handle.calling()``)."""
    started = recorder.now() if recorder.active else 0  # a trace records the transfer
    handle = client.raw_handle
    if not host.flags.c_contiguous:
        host = host.copy(order="C")  # (np.ascontiguousarray would turn a 0-d array into 1-d)
    host = native_host(host)
    buffer_type = dtypes.to_pjrt_type(host.dtype)
    if (semantics == HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL
            and should_stage(client.platform, host)):
        # Copy once into memory the plugin can adopt, rather than let it copy (slowly).
        handle.recycle_host_memory()  # staging the plugin has let go of since
        host, semantics = adoptable_copy(host), HostBufferSemantics.ZERO_COPY
    dims = ffi.new("int64_t[]", host.shape) if host.ndim else _NULL
    out = ffi.new("PJRT_Buffer **")
    done = ffi.new("PJRT_Event **")
    api = handle.api
    api.require("PJRT_Client_BufferFromHostBuffer")  # the shim calls the entry unchecked
    check(api, lib.pjrt_shim_buffer_from_host(
        api.table, handle.pointer, ffi.from_buffer(host), buffer_type, dims, host.ndim,
        int(semantics), device.pointer if memory is None else _NULL,
        memory.pointer if memory is not None else _NULL, out, done))
    if started:
        recorder.transferred(started, host, device, memory)
    return out[0], ((host, done[0]) if semantics >= HostBufferSemantics.ZERO_COPY
                       else None)


def _buffers_to_wait(array: Array) -> list:
    """``array``'s buffers, for a wait (raises as jaxlib does for a deleted array)."""
    try:
        return array.live_buffers()  # raises once the client is closed
    except DeletedArrayError as deleted:  # in jaxlib's words, which its users match
        raise DeletedArrayError("BlockHostUntilReady() called on deleted or donated "
                                f"buffer: {deleted.plugin_message}") from None


def block_arrays_until_ready(arrays: Sequence[Array]) -> None:
    """Wait until every one of ``arrays`` is computed: those of one client with one native
    wait for all their buffers (a program's outputs become ready together, so this wakes
    once rather than once per output); the error of the first failed buffer, in the order of
    ``arrays``, is raised. With a trace running, or arrays of several clients, each array
    waits on its own (`Array.block_until_ready`)."""
    if not arrays:
        return
    client = arrays[0].client
    if recorder.active or any(array.client is not client for array in arrays):
        for array in arrays:
            array.block_until_ready()
        return
    arrays[0]._wait_with(arrays)


def check_device_sets(arguments: Sequence[Array], devices: tuple, *,
                       host_values_allowed: bool = False) -> None:
    """Raise DeviceAssignmentMismatchError listing arguments that sit on other devices
    (numbered by their position in ``arguments``; host values are skipped when allowed)."""
    expected = set(devices)
    wrong = []
    for i, argument in enumerate(arguments):
        if not isinstance(argument, Array):
            if host_values_allowed:
                continue
            raise TypeError(f"argument {i} is a {type(argument).__name__}; pass pjrt Arrays")
        if set(argument._devices) != expected:
            wrong.append(f"argument {i} is on {_device_text(argument._devices)}")
    if wrong:
        raise DeviceAssignmentMismatchError(
            "the program runs on " + _device_text(devices) + ", but " + "; ".join(wrong)
            + ". Move the arguments with pjrt.device_put(x, sharding) first.")


def _device_text(devices) -> str:
    ids = [d.id for d in devices]
    platform = devices[0].platform if devices else "?"
    return f"{platform} devices {ids}" if len(ids) > 1 else f"{devices[0]}"

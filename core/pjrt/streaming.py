"""Streamed host-to-device transfers: device buffers whose bytes arrive in pieces.

[`Client.create_buffers_for_async_host_to_device`][pjrt.client.Client.create_buffers_for_async_host_to_device]
makes a [`TransferManager`][pjrt.streaming.TransferManager]: buffers of given shapes on one
device (in one memory) whose bytes the host sends later, chunk by chunk
(`TransferManager.transfer_data`), over PJRT's ``PJRT_AsyncHostToDeviceTransferManager``.
Each buffer can be taken as an [`Array`][pjrt.array.Array] at any time
(`TransferManager.retrieve_buffer`), before its bytes have arrived: a program may be launched
on it at once, and runs when the last chunk is in; reads of it wait likewise. A producer
that fails tells the readers so with `TransferManager.set_buffer_error`.

Each chunk is read by the plugin after ``transfer_data`` returns, from the caller's own
memory, without a copy: the manager keeps that memory alive until the plugin has read it,
which the returned [`Transfer`][pjrt.streaming.Transfer] tells (``is_ready()``,
``block_until_ready()``). Do not write to the memory of a chunk before then.

Every plugin PJRT C API 0.60 or newer that provides the transfer-manager entries can do this;
XLA's CPU plugins (0.81 and 0.106 are tested) do. Another plugin raises
[`UnsupportedFeatureError`][pjrt.errors.UnsupportedFeatureError] naming it and its version:
pjrt offers no imitation over whole-array transfers, which would not stream.
"""
from __future__ import annotations

import operator
import weakref
from typing import Any, Sequence

import numpy as np

from . import dtypes
from ._capi import transfer_manager as _native
from ._capi.staging import PACKED_DTYPE_NAMES
from ._wire.shape_extents import check_extents
from .array import Array
from .device import ClientView, Device, Memory
from .errors import ClosedClientError, ErrorCode
from .shapes import Shape

__all__ = ["Transfer", "TransferManager"]

class Transfer:
    """One chunk sent by `TransferManager.transfer_data`: whether the plugin has finished
    reading its host memory (after which the caller may reuse it).

    Attributes:
      index: the buffer the chunk went to.
      offset: where in the buffer it starts, in bytes.
      nbytes: its size in bytes.
      is_last: whether it completed the buffer.
    """

    __slots__ = ("index", "offset", "nbytes", "is_last", "_chunk")

    def __init__(self, index: int, offset: int, nbytes: int, is_last: bool, chunk):
        self.index = index
        self.offset = offset
        self.nbytes = nbytes
        self.is_last = is_last
        self._chunk = chunk

    def is_ready(self) -> bool:
        """Whether the plugin has finished reading the chunk's host memory (without waiting).

        Raises:
          ClosedClientError: in a child after ``fork()``, for a chunk of the parent's that
            the plugin had not been seen to finish reading.
        """
        return self._chunk.poll(0)

    def block_until_ready(self) -> "Transfer":
        """Wait until the plugin has read the chunk's host memory; returns self.

        Ctrl-C interrupts the wait (the transfer itself goes on).

        Raises:
          XlaRuntimeError: the plugin reported that the transfer failed.
          ClosedClientError: in a child after ``fork()``, for a chunk of the parent's that
            the plugin had not been seen to finish reading (it never will be there).
        """
        self._chunk.wait()
        if self._chunk.error is not None:
            raise self._chunk.error
        return self

    def __repr__(self) -> str:
        try:
            state = "done" if self.is_ready() else "in flight"
        except ClosedClientError:
            state = "sent before a fork"
        last = ", last" if self.is_last else ""
        return (f"Transfer(buffer {self.index}, bytes {self.offset}..{self.offset + self.nbytes}"
                f"{last}, {state})")


class TransferManager:
    """Buffers on one device whose bytes the host sends in chunks (PJRT's
    ``AsyncHostToDeviceTransferManager``); made by
    [`Client.create_buffers_for_async_host_to_device`][pjrt.client.Client.create_buffers_for_async_host_to_device].

    A buffer is complete when its last chunk is in (``is_last``); until then an `Array` of it
    (`retrieve_buffer`) is not ready. Chunks may come in any order and from several threads.
    The bytes are the buffer's row-major array as it lies in memory (buffer ``i`` holds
    `buffer_size` ``(i)`` of them); bytes never sent hold whatever the memory held.

    Closing the manager (`close`, the end of a ``with`` block, or its collection) first lets
    the plugin finish the chunks it was given; a buffer whose last chunk had not been sent
    then fails with the plugin's error ("Async transfer object was deleted before transfers
    completed"), and buffers never retrieved are freed. Arrays already retrieved stay. Closing
    the client closes its managers first.

    Attributes:
      client: the client the buffers belong to.
      device: the device they live on.
      memory: the memory they live in.
      shapes: ``(shape, dtype)`` of each buffer, in order.
    """

    def __init__(self, client: ClientView, state: "_native.ManagerState", shapes: list,
                 device: Device, memory: Memory):
        """Wrap a manager the plugin made (not for users: see
        ``Client.create_buffers_for_async_host_to_device``)."""
        self.client = client
        self.device = device
        self.memory = memory
        self.shapes: tuple[tuple[tuple[int, ...], np.dtype], ...] = tuple(shapes)
        self._state = state
        weakref.finalize(self, state.close).atexit = False  # the module's exit hook closes it

    # -- what the buffers are ----------------------------------------------------------------

    @property
    def buffer_count(self) -> int:
        """How many buffers the manager holds."""
        return len(self._state.sizes)

    def buffer_size(self, index: int) -> int:
        """The size of buffer ``index`` in bytes, as the plugin lays it out on the device.

        Raises:
          IndexError: there is no buffer ``index``.
        """
        return self._state.sizes[self._check_index(index)]

    @property
    def closed(self) -> bool:
        """Whether the manager has been closed."""
        return self._state.closed

    # -- sending -------------------------------------------------------------------------------

    def transfer_data(self, index: int, data: Any, offset: int = 0,
                      is_last: bool | None = None) -> Transfer:
        """Send ``data`` into buffer ``index`` at byte ``offset``; returns at once, while the
        plugin copies it.

        Args:
          index: which buffer.
          data: a numpy array of the buffer's dtype (any shape: its bytes count, in row-major
            order), or raw bytes (``bytes``, ``bytearray``, ``memoryview``, anything with the
            buffer protocol and no dtype). Its memory is read by the plugin after this call:
            it is kept alive until then, and must not be written to meanwhile (see the
            returned `Transfer`).
          offset: where in the buffer the chunk goes, in bytes; for a numpy array, a multiple
            of its item size.
          is_last: whether this chunk completes the buffer. None (the default): it does when,
            with it, every byte of the buffer has been sent.

        Returns:
          A [`Transfer`][pjrt.streaming.Transfer]: whether the plugin has read the chunk yet.

        Raises:
          IndexError: there is no buffer ``index``.
          TypeError: ``data`` is a numpy array of another dtype, or has no buffer; the offset
            is not an int.
          ValueError: the chunk would reach past the end of the buffer, the offset is
            negative or not a multiple of the item size, the buffer's last chunk was already
            sent (or an error set on it), or the manager is closed.
          ClosedClientError: the client is closed.
        """
        index = self._check_index(index)
        _, dtype = self.shapes[index]
        host, nbytes, typed = _host_bytes(data, dtype, index)
        offset = _check_int("offset", offset)
        size = self._state.sizes[index]
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        if typed and offset % dtype.itemsize:
            raise ValueError(f"offset {offset} is not a multiple of {dtype}'s item size "
                             f"({dtype.itemsize} bytes): a chunk of {dtype} elements starts at "
                             f"an element")
        if offset + nbytes > size:
            raise ValueError(
                f"the chunk reaches past the end of buffer {index}: bytes {offset}.."
                f"{offset + nbytes} of a buffer of {size} bytes ({_describe(self.shapes[index])})")
        if is_last is not None and not isinstance(is_last, (bool, np.bool_)):
            raise TypeError(f"is_last must be a bool or None, not {type(is_last).__name__}")
        chunk, last = self._state.transfer(index, host, offset, nbytes,
                                           None if is_last is None else bool(is_last))
        return Transfer(index, offset, nbytes, last, chunk)

    def set_buffer_error(self, index: int, message: str,
                         code: ErrorCode | int = ErrorCode.INTERNAL) -> None:
        """Make buffer ``index`` fail: reading it, or a program launched on it (before or
        after), raises [`XlaRuntimeError`][pjrt.errors.XlaRuntimeError] with ``message``.
        The buffer takes no more chunks.

        Raises:
          IndexError: there is no buffer ``index``.
          ValueError: its last chunk was already sent or an error already set (the plugin
            cannot take either back), ``code`` is OK or not a status code, or the manager is
            closed.
          ClosedClientError: the client is closed.
        """
        index = self._check_index(index)
        if not isinstance(message, str):
            raise TypeError(f"message must be a str, not {type(message).__name__}")
        try:
            code = ErrorCode(code)
        except ValueError:
            raise ValueError(f"code must be one of pjrt.ErrorCode, got {code!r}") from None
        if code == ErrorCode.OK:
            raise ValueError("code must name an error, not OK")
        self._state.set_buffer_error(index, code, message.encode("utf-8"))

    # -- taking the buffers ------------------------------------------------------------------

    def retrieve_buffer(self, index: int) -> Array:
        """Buffer ``index`` as an [`Array`][pjrt.array.Array], which owns it from now on; it
        may still be waiting for its bytes (programs launched on it run, and reads of it
        return, once they are in).

        Each buffer is handed out once.

        Raises:
          IndexError: there is no buffer ``index``.
          ValueError: it was already retrieved, or the manager is closed.
          ClosedClientError: the client is closed.
        """
        index = self._check_index(index)
        shape, dtype = self.shapes[index]
        return self._state.retrieve(
            index, lambda buffer: Array(self.client, [buffer], (self.device,), shape, dtype))

    # -- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        """Free the manager (idempotent). The plugin first finishes the chunks it was given;
        buffers still missing their last chunk then fail, and buffers never retrieved are
        freed. Retrieved Arrays stay."""
        self._state.close()

    def __enter__(self) -> "TransferManager":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return f"TransferManager(<closed>, {self.buffer_count} buffers)"
        shapes = ", ".join(_describe(spec) for spec in self.shapes)
        return f"TransferManager([{shapes}], device={self.device}, memory={self.memory.kind!r})"

    def _check_index(self, index: int) -> int:
        index = _check_int("index", index)
        count = len(self._state.sizes)
        if not 0 <= index < count:
            raise IndexError(f"buffer index {index} is out of range: the manager holds "
                             f"{count} buffers (0..{count - 1})")
        return index


def create_transfer_manager(client: ClientView, shapes: Sequence, memory: Memory
                            ) -> TransferManager:
    """See ``Client.create_buffers_for_async_host_to_device``."""
    specs = _parse_shapes(shapes)
    memory = _check_memory(client, memory)
    handle = client.raw_handle
    state, device_pointer = _native.create(
        handle, [(shape, dtypes.to_pjrt_type(dtype)) for shape, dtype in specs], memory.pointer)
    manager = TransferManager(client, state, specs, client.device_from_pointer(device_pointer),
                              memory)
    # A buffer of no bytes is complete from the start: its one (empty) chunk is sent here, so
    # that nothing waits for it.
    for index, size in enumerate(state.sizes):
        if size == 0:
            manager.transfer_data(index, b"", is_last=True)
    return manager


# -- checks -------------------------------------------------------------------------------------

def _check_memory(client: ClientView, memory: Memory) -> Memory:
    if not isinstance(memory, Memory):
        hint = (" (its memory: device.default_memory())" if isinstance(memory, Device) else "")
        raise TypeError(f"memory must be a pjrt Memory, not {type(memory).__name__}{hint}; "
                        f"pick one from device.addressable_memories()")
    if memory.client is not client:
        raise ValueError(f"{memory!r} belongs to another client ({memory.client!r}); pass a "
                         f"memory of this {client.platform} client")
    if not memory.addressable_by_devices():
        raise ValueError(f"no device addresses {memory!r}; pick a memory from "
                         f"device.addressable_memories()")
    return memory


def _parse_shapes(shapes: Sequence) -> list[tuple[tuple[int, ...], np.dtype]]:
    """``(shape, dtype)`` of each spec: a ``pjrt.shapes.Shape`` (an array shape, row-major,
    static) or a ``(shape, dtype)`` pair."""
    if isinstance(shapes, (Shape, str, bytes)) or not isinstance(shapes, Sequence):
        raise TypeError(f"shapes must be a list of (shape, dtype) pairs or pjrt.shapes.Shape "
                        f"objects, not {type(shapes).__name__}")
    if len(shapes) == 2 and _is_dims(shapes[0]) and _is_dtype_like(shapes[1]):
        raise TypeError(f"shapes is a list of specs: pass [{shapes!r}] for one buffer")
    if not shapes:
        raise ValueError("shapes is empty: give the (shape, dtype) of each buffer to make")
    return [_parse_spec(i, spec) for i, spec in enumerate(shapes)]


def _parse_spec(i: int, spec) -> tuple[tuple[int, ...], np.dtype]:
    if isinstance(spec, Shape):
        if not spec.is_array():
            raise ValueError(f"shapes[{i}] is {spec}: only array shapes can be streamed "
                             f"(one buffer each; no tuples or tokens)")
        if any(spec.is_dynamic_dimension(d) for d in range(spec.rank())):
            raise ValueError(f"shapes[{i}] is {spec}, which has dynamic dimensions; give its "
                             f"static bounds")
        rank = spec.rank()
        layout = spec.layout()
        if layout is not None and tuple(layout.minor_to_major()) != tuple(range(rank - 1, -1, -1)):
            raise ValueError(f"shapes[{i}] is {spec}: streamed buffers are row-major; drop the "
                             f"layout or give {{{','.join(map(str, range(rank - 1, -1, -1)))}}}")
        dims, dtype = spec.dimensions(), spec.numpy_dtype()
    elif isinstance(spec, (tuple, list)) and len(spec) == 2:
        dims, dtype = spec
        if not _is_dims(dims):
            raise TypeError(f"shapes[{i}] has shape {dims!r}; a shape is a tuple of ints, e.g. "
                            f"(1024, 1024)")
        dims = tuple(operator.index(d) for d in dims)
        try:
            dtype = np.dtype(dtype)
        except TypeError:
            raise TypeError(f"shapes[{i}] has dtype {dtype!r}, which is not a numpy dtype") from None
    else:
        raise TypeError(f"shapes[{i}] is {spec!r}; each spec is a (shape, dtype) pair or a "
                        f"pjrt.shapes.Shape")
    if any(d < 0 for d in dims):
        raise ValueError(f"shapes[{i}] has negative dimensions: {dims}")
    dtypes.to_pjrt_type(dtype)  # TypeError naming the supported dtypes
    if dtype.name in PACKED_DTYPE_NAMES:
        raise ValueError(f"shapes[{i}] has dtype {dtype}, which devices pack below a byte; "
                         f"streamed bytes are the device's, so place {dtype} arrays with "
                         f"device_put instead")
    # More bytes than a buffer can hold, or extents XLA cannot multiply out (the plugin
    # aborts on either, even for a shape with a 0 extent).
    check_extents(dims, dtype.itemsize, f"shapes[{i}] ({_describe((dims, dtype))})")
    return dims, dtype


def _is_dims(value) -> bool:
    if not isinstance(value, (tuple, list)):
        return False
    try:
        return all(not isinstance(d, (bool, np.bool_)) and operator.index(d) is not None
                   for d in value)
    except TypeError:
        return False


def _is_dtype_like(value) -> bool:
    if isinstance(value, (tuple, list, Shape)):
        return False
    try:
        np.dtype(value)
    except TypeError:
        return False
    return True


def _check_int(name: str, value) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, not a bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, not {type(value).__name__}") from None


def _host_bytes(data, dtype: np.dtype, index: int) -> tuple[object, int, bool]:
    """``(object whose memory the plugin reads, its size in bytes, whether it is typed)``."""
    if isinstance(data, (np.ndarray, np.generic)) or hasattr(data, "dtype"):
        host = np.asarray(data)
        if not host.dtype.isnative:
            host = host.astype(host.dtype.newbyteorder("="))
        if host.dtype != dtype:
            raise TypeError(f"buffer {index} holds {dtype}, but the data is {host.dtype}; "
                            f"convert it (data.astype(np.{dtype.name})) or pass raw bytes")
        if not host.flags.c_contiguous:
            host = host.copy(order="C")
        return host, host.nbytes, True
    try:
        view = memoryview(data)
    except TypeError:
        raise TypeError(f"data must be a numpy array of {dtype} or a bytes-like object, not "
                        f"{type(data).__name__}") from None
    if not view.c_contiguous:
        raise ValueError("data must be contiguous in memory; pass bytes(data) or a "
                         "contiguous copy")
    return data, view.nbytes, False


def _describe(spec: tuple) -> str:
    shape, dtype = spec
    return f"{np.dtype(dtype).name}{list(shape)}"

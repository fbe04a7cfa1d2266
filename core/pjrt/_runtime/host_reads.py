"""Reading an Array's value on the host: what `np.asarray(array)` gives where the buffer
protocol does not.

An Array whose value lies in host memory (any array of a CPU plugin, or in a host memory
space) is read through the buffer protocol, in C (``_native/host_views.c``): ``np.asarray``,
``memoryview`` and ``bytes`` of it are the buffer itself, read-only, for every size, as
jaxlib's are. numpy turns to ``__array__``, here, only where there is no such buffer:

* a value in device memory is copied to the host once and the copy cached for later reads
  (never for an array shared through DLPack, whose partner may write to the memory);
* an array of several buffers is assembled from one copy of each distinct shard;
* a dtype the buffer protocol has no format for (ml_dtypes' types) is viewed through
  `HostMemory`, the same memory with no copy;
* an error (a deleted array, a closed client, a failed computation) is raised here, worded.

A value still being computed is waited for in slices that Ctrl-C can interrupt.
"""
from __future__ import annotations

import threading
import weakref
import numpy as np

from .._profiling import recorder
from .._pjrt_cffi import ffi, lib
from ..errors import check, consume
from .._capi.waits import wait_buffer_ready

_host_read = lib.pjrt_host_read
_NOT_READY = lib.PJRT_HOST_READ_NOT_READY
_ndarray = np.ndarray
_ZERO = b"\0"


class HostMemory:
    """Host memory exposed to numpy read-only: a host-resident device buffer (no copy), or
    the private copy of a buffer that pjrt read for the caller.

    numpy views of it keep this object alive, and it keeps ``owner`` alive (the Array, or the
    private copy), so the memory outlives every view. numpy cannot make a view of it writeable,
    since this object offers no writeable memory: pjrt never changes an Array's value, and
    only a DLPack consumer that ignores the read-only flag can (see ``Array.shared``). The
    Array holds only a weak reference back, so that it can tell whether any view of its buffer
    is still in use.
    """

    __slots__ = ("owner", "__array_interface__", "__weakref__")

    def __init__(self, owner, address: int, nbytes: int):
        self.owner = owner
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                    "data": (address, True), "version": 3}


def read_only(value: np.ndarray) -> np.ndarray:
    """``value`` (an array nobody else holds) as a view that can never be made writeable: its
    base is a read-only memoryview, which numpy will not write through."""
    try:
        return np.asarray(memoryview(value).toreadonly())  # pyright: ignore[reportArgumentType]
    except (ValueError, TypeError):  # dtypes the buffer protocol cannot describe (ml_dtypes)
        raw = memoryview(value.reshape(-1).view(np.uint8)).toreadonly()  # pyright: ignore[reportArgumentType]
        return np.frombuffer(raw, dtype=value.dtype).reshape(value.shape)


def private_bytes(nbytes: int) -> bytes:
    """A new ``bytes`` object of ``nbytes`` zeros that nothing else refers to, for C to fill
    before it is shared (as CPython's own constructors fill theirs).

    ``b"\\0" * n`` is the cheapest way to make one, but gives back ``b"\\0"`` itself for
    ``n == 1`` and the shared empty bytes for 0; ``bytes(n)`` makes a new object for any
    ``n >= 1``. Nothing is ever written into an empty one."""
    return _ZERO * nbytes if nbytes > 1 else bytes(nbytes)


def copy_to_host(api, buffer, destination, nbytes: int, status=None) -> None:
    """Copy ``buffer``'s value into ``destination`` (``nbytes`` of memory: a buffer cffi can
    pass as a pointer, such as a `private_bytes` object or ``ffi.from_buffer`` of a numpy
    array), waiting for the value first if it is still being computed (a wait Ctrl-C can
    interrupt).

    ``status``, when given, is what a first ``pjrt_host_read`` of the same arguments
    returned: this finishes that read (its error, if any, is taken over and freed).

    Raises:
      XlaRuntimeError: the computation producing the value failed, or the copy did.
    """
    if status is None:
        status = _host_read(api.table, buffer, destination, nbytes)
    if status == _NOT_READY:
        wait_buffer_ready(api, buffer)  # raises the computation's error
        status = _host_read(api.table, buffer, destination, nbytes)
        if status == _NOT_READY:  # a plugin whose fired event went back to unfired
            raise RuntimeError("the plugin reported a buffer not ready after waiting for it")
    if status:
        raise consume(api, ffi.cast("PJRT_Error *", status))


def buffer_to_host(api, buffer, shape: tuple, dtype: np.dtype,
                   physical_order: tuple | None = None) -> np.ndarray:
    """A read-only host copy of ``buffer`` (of ``shape`` and ``dtype``), once it is ready.

    ``physical_order``: the buffer's dimensions from major to minor when its layout is not
    row-major; the bytes are read in that order and the result is their logical view."""
    if physical_order is not None:
        stored = buffer_to_host(api, buffer, tuple(shape[d] for d in physical_order), dtype)
        return in_logical_order(stored, physical_order)
    nbytes = dtype.itemsize
    for extent in shape:
        nbytes *= extent
    raw = private_bytes(nbytes)
    copy_to_host(api, buffer, raw, nbytes)
    return _ndarray(shape, dtype, raw)


def in_logical_order(stored: np.ndarray, physical_order: tuple) -> np.ndarray:
    """An array stored with its dimensions in ``physical_order`` (major to minor), seen with
    them in their logical order (a transposed view; read-only stays read-only)."""
    return stored.transpose(np.argsort(physical_order))


# -- the reads of an Array: free functions over it ------------------------------------------
#
# An Array's methods (``__array__``, ``copy_to_host_async``) hand over to these. They use the
# Array's documented members (``live_buffers()``, ``client``, ``nbytes``, ``shape``,
# ``dtype``, ``stored_order``, ``is_fully_addressable``, ``shared``, ``keep_memory_for``,
# ``addressable_shards``) and own its two host caches, ``_host_copy`` (a cached copy) and
# ``_host_view`` (a weak reference to the view of a host-resident buffer): ArrayCore fields,
# since the buffer protocol's C reads them, that only this module writes (`forget_copy` for
# the Array). Two more of ArrayCore's members serve the reads: ``_handle`` (the client's
# handle, whose ticket a read runs under: ``client.raw_handle`` without two property calls)
# and ``_take_interruption`` (what ended the buffer protocol's wait).


def to_numpy(array, dtype=None, copy=None) -> np.ndarray:
    """``Array.__array__`` itself (bound as the method): the value as a read-only numpy array
    (numpy 2's protocol: ``copy=False`` raises ValueError where the value cannot be had without
    a copy). numpy calls it only where the buffer protocol gives it no buffer (see the module's
    docstring)."""
    interruption = array._take_interruption()
    if interruption is not None:  # ended the buffer protocol's wait; numpy dropped it
        raise interruption
    started = recorder.now() if recorder.active else 0  # a trace records the read
    handle = array._handle
    with handle.calling(closed_ok=True):
        value, is_view = _read(array, handle)  # raises for a deleted array or closed client
    if started:
        recorder.read(started, array, is_view)
    if dtype is not None and np.dtype(dtype) != value.dtype:
        if copy is False:
            raise ValueError(f"converting an Array of {value.dtype} to {np.dtype(dtype)} "
                             f"needs a copy, and copy=False was asked for")
        return value.astype(dtype)
    if copy:
        return value.copy()
    if copy is False and not is_view:
        where = ("its value is assembled from several buffers"
                 if len(array.live_buffers()) != 1 else "its memory is not host memory")
        raise ValueError(f"reading this Array needs a copy ({where}), and copy=False was "
                         f"asked for; use np.asarray(x), which copies only where it must")
    return value


def _read(array, handle) -> tuple[np.ndarray, bool]:
    """The value, and whether it is the buffers' own memory (a view) rather than a copy:
    every read the buffer protocol leaves to Python (see the module's docstring). Runs
    under a ticket; raises for a deleted array or a closed client."""
    buffers = array.live_buffers()  # a deleted array is not read, even from a cache
    if array._host_copy is not None:
        return array._host_copy, False
    view = array._host_view() if array._host_view is not None else None
    if view is not None:
        return view, True
    if not array.is_fully_addressable:
        raise ValueError(
            "this array has shards on devices of other processes, so its value cannot be "
            "read here; read its addressable_shards, or gather it into one process first")
    if len(buffers) != 1:
        value = _assemble(array)
        _cache(array, value)
        return value, False
    api = handle.api
    nbytes = array.nbytes
    order = array.stored_order
    wait_buffer_ready(api, buffers[0])  # here, where Ctrl-C can interrupt it
    address = ffi.new("uintptr_t *")
    check(api, lib.pjrt_shim_buffer_host_address(api.table, buffers[0], nbytes, address))
    if address[0]:
        memory = HostMemory(array, address[0], nbytes)
        array.keep_memory_for(memory)  # before a delete() racing in another thread frees it
        if order is None:
            view = np.asarray(memory).view(array.dtype).reshape(array.shape)
        else:
            stored = tuple(array.shape[d] for d in order)
            view = in_logical_order(np.asarray(memory).view(array.dtype).reshape(stored), order)
        array._host_view = weakref.ref(view)
        return view, True
    value = buffer_to_host(api, buffers[0], array.shape, array.dtype, order)
    _cache(array, value)
    return value, False


def _cache(array, value: np.ndarray) -> None:
    """Keep a host copy for later reads, unless the memory is shared through DLPack (a
    consumer's writes would make it stale)."""
    if not array.shared:
        array._host_copy = value
        if array.shared:  # exported by another thread meanwhile
            array._host_copy = None


def forget_copy(array) -> None:
    """Drop ``array``'s cached host copy (its memory is now shared: later reads see it)."""
    array._host_copy = None


def _assemble(array) -> np.ndarray:
    """The global value of a multi-device array, from one copy of each distinct shard."""
    out = np.empty(array.shape, dtype=array.dtype)
    written = set()
    for shard in array.addressable_shards:
        key = tuple((s.start, s.stop, s.step) if isinstance(s, slice) else s
                    for s in shard.index)
        if key not in written:  # replicated shards hold the same values: read one
            written.add(key)
            out[shard.index] = np.asarray(shard.data)
    return read_only(out)


def copy_to_host_async(array) -> None:
    """``array.copy_to_host_async()``: start reading its value to the host on a thread, so
    that a later ``np.asarray`` does not wait for it. A host-resident buffer (CPU plugins) is
    read in place when asked for, so nothing is started for it."""
    if array._host_copy is not None or array.is_deleted():
        return
    if array.client.platform == "cpu":
        return  # read as a view of the buffer itself when asked for

    def fetch():
        try:
            np.asarray(array)
        except Exception:  # noqa: BLE001 - the error shows again on the real read
            pass

    threading.Thread(target=fetch, name="pjrt-copy-to-host", daemon=True).start()

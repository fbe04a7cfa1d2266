"""An Array's DLPack export: what ``Array.__dlpack__`` shares, copies or refuses.

Free functions over a single-device Array that its ``__dlpack__`` and ``__dlpack_device__``
call (as `pjrt._runtime.host_reads` holds its reads): they sit below ``pjrt.array`` and read
what they need from the Array they are given. The capsule's C structs are
`pjrt._capi.dlpack_structs`'s.

The capsule's tensor keeps a strong reference to a small `_Export` object that holds the
Array, and the Array's client records the export as a view of its buffers
(``Array.keep_memory_for``, inside the native call that read the address), so ``delete()`` or
closing the client leaves the memory in place until the consumer lets go: a buffer is freed
only through ``ClientHandle.release_buffers``, once the last Array and the last view are gone.
A zero-copy export marks the Array shared (``Array.mark_shared``): a consumer that writes to the
memory is seen by every reader alike.
"""
from __future__ import annotations

import numpy as np

from .._capi.dlpack_structs import (DEVICE_TYPES, HOST_DEVICE_TYPES, dtype_code, make_capsule,
                                    row_major_strides)
from .._pjrt_cffi import lib
from ..layouts import buffer_layout


class _Export:
    """What an exported capsule keeps alive: the Array whose buffer it shares."""

    __slots__ = ("array", "__weakref__")

    def __init__(self, array):
        self.array = array


def export(array, *, stream=None, max_version=None, dl_device=None, copy=None):
    """``array.__dlpack__(...)``: a capsule sharing (or, when asked or needed, copying) the
    memory of a single-device Array.

    Raises:
      BufferError: the array spans several devices, cannot be shared as asked (``copy=False``
        where a copy is needed, a ``dl_device`` it cannot reach), or has a dtype DLPack
        cannot carry.
    """
    if len(array.shard_devices) != 1:
        raise BufferError(f"this array has {len(array.shard_devices)} shards on different devices; "
                          f"DLPack carries one buffer: export each of addressable_shards")
    versioned = max_version is not None and int(tuple(max_version)[0]) >= 1
    dtype_code(array.dtype)  # refuse before doing any work
    own = device_of(array)
    if stream is not None and own[0] == lib.kDLCPU:
        raise BufferError(f"stream={stream!r} was passed for an array in host memory; DLPack "
                          f"wants stream=None there")
    on_stream = _consumer_stream(stream)
    if dl_device is not None and tuple(dl_device) != own:
        if int(tuple(dl_device)[0]) != lib.kDLCPU:
            raise BufferError(f"cannot export to DLPack device {tuple(dl_device)}; this array "
                              f"is on {own} and can also be exported to the host (1, 0)")
        if copy is False:
            raise BufferError("exporting to the host needs a copy, and copy=False was asked for")
        host = np.array(array)  # a private, writeable copy
        return make_capsule(host, host.ctypes.data, (lib.kDLCPU, 0), host.dtype, host.shape,
                            row_major_strides(host.shape), versioned=versioned,
                            read_only=False, copied=True)
    source = array.copy_to_device(array.device) if copy else array
    holder = _Export(source)
    pointer, strides = shared_memory(source, holder, stream=on_stream)
    if pointer is None:  # a layout DLPack cannot describe: hand out a dense copy
        if copy is False:
            raise BufferError(f"this array's buffer is laid out as {source.layout}, which "
                              f"DLPack cannot describe, and copy=False was asked for")
        source = array.copy_to_device(array.device)  # the plugin's default (dense) layout
        holder = _Export(source)
        pointer, strides = shared_memory(source, holder, stream=on_stream)
        if pointer is None:
            raise BufferError(f"this array's buffer is laid out as {source.layout}, which "
                              f"DLPack cannot describe")
        copy = True
    if source is array:
        # The consumer may write to the memory (PyTorch ignores the read-only flag below):
        # from now on the Array shows such writes to every reader alike, as jax's does.
        array.mark_shared()
    return make_capsule(holder, pointer, own, source.dtype, source.shape, strides,
                        versioned=versioned, read_only=True, copied=bool(copy))


def _consumer_stream(stream) -> int | None:
    """The consumer's stream to make wait for the buffer; None: the host waits instead.

    DLPack's values for a GPU: None (no stream named) and -1 (the consumer asks for no
    synchronisation; the host still waits here, which is always safe), 1 and 2 (CUDA's legacy
    and per-thread default streams) or a stream handle; 0 is ambiguous and refused.
    """
    if stream is None:
        return None
    if isinstance(stream, bool) or not isinstance(stream, int):
        raise TypeError(f"stream must be an int (a stream handle, or 1, 2 or -1 as DLPack "
                        f"defines them) or None, not {type(stream).__name__}")
    if stream == 0:
        raise BufferError("stream=0 is ambiguous (DLPack disallows it); pass 1 for CUDA's "
                          "legacy default stream, 2 for the per-thread default stream, or a "
                          "stream handle")
    return None if stream == -1 else stream


def device_of(array) -> tuple[int, int]:
    """``array.__dlpack_device__()``: ``(DLDeviceType, device id)``."""
    device = array.device
    platform = device.client.platform
    kind = array.memory_kind if platform != "cpu" else "device"
    if kind != "device" and platform in HOST_DEVICE_TYPES:
        return (HOST_DEVICE_TYPES[platform], 0)
    device_type = DEVICE_TYPES.get(platform)
    if device_type is None:
        raise BufferError(f"DLPack has no device type for {platform} devices")
    if device_type == lib.kDLCPU:
        return (device_type, 0)
    hardware_id = device.local_hardware_id
    return (device_type, int(hardware_id if hardware_id is not None else device.id))


def shared_memory(array, keeper, *, stream: int | None = None) -> tuple:
    """``(address, element strides)`` of a ready single-device array's buffer, kept alive for
    as long as ``keeper`` lives; ``(None, None)`` (nothing kept) when its layout is tiled or
    packed (no DLPack strides describe it).

    With a ``stream`` (a consumer's stream on the array's device), that stream is made to wait
    for the buffer through the plugin's stream extension and the host does not wait, as in
    jaxlib; UnsupportedFeatureError, naming the plugin, where the plugin lacks the extension.

    The keeper is registered before the call that read the address ends, so a ``delete()``
    racing in another thread cannot free the memory in between.

    Raises:
      DeletedArrayError: the array is deleted (or was, meanwhile).
    """
    with array.client.raw_handle.calling() as handle:
        api = handle.api
        buffer = array.live_buffers()[0]
        layout = None
        if api.has("PJRT_Buffer_GetMemoryLayout"):
            layout = buffer_layout(api, buffer).layout
        if layout is not None and not layout.is_row_major() and (
                layout.element_size_in_bits()
                or (layout.tiling() and any(any(d != 1 for d in t) for t in layout.tiling()))):
            return None, None
        if stream is None:
            array.block_until_ready()
        else:
            from .._capi.stream_extension import wait_until_ready_on_stream

            wait_until_ready_on_stream(api, buffer, stream)
        pointer = int(api.call_new("PJRT_Buffer_UnsafePointer", buffer=buffer).buffer_pointer)
        array.keep_memory_for(keeper)
    shape = array.shape
    if layout is None or layout.is_row_major():
        return pointer, row_major_strides(shape)
    strides = [0] * len(shape)
    step = 1
    for dimension in layout.minor_to_major():
        strides[dimension] = step
        step *= max(int(shape[dimension]), 1)
    return pointer, tuple(strides)

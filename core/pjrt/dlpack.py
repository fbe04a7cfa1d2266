"""DLPack interchange: pjrt Arrays to and from numpy, jax, PyTorch and any DLPack producer.

Exporting is ``Array.__dlpack__`` / ``Array.__dlpack_device__`` (so ``np.from_dlpack(x)``,
``jnp.from_dlpack(x)`` and ``torch.from_dlpack(x)`` read a pjrt Array without a copy where they
can). Importing is [`from_dlpack`][pjrt.dlpack.from_dlpack]: it wraps the producer's memory in a pjrt buffer when the
plugin can view foreign memory on the target device (``PJRT_Client_CreateViewOfDeviceBuffer``;
on CPU plugins host memory is device memory), and copies it otherwise.

Lifetimes, both ways: an exported capsule keeps the Array's buffer (see `pjrt._runtime.dlpack_export`);
an imported view keeps the producer's tensor until the plugin frees the buffer, which happens
only through the client's ownership rules (`pjrt._capi.handles`), at which point the plugin
calls back and the producer's deleter runs.

An Array made by [`from_dlpack`][pjrt.dlpack.from_dlpack] without a copy shares memory with the producer: writes the
producer makes later show through it (as with jax). The same holds the other way: after a
zero-copy export, writes a consumer makes (PyTorch ignores DLPack's read-only flag) show in
``np.asarray(x)`` and in programs alike (``Array.shared``).
"""
from __future__ import annotations

from . import dtypes
from ._capi import dlpack_structs as _dlpack
from ._capi.native_runtime import programs_may_call_python
from ._pjrt_cffi import ffi, lib
from ._wire.shape_extents import check_extents
from .array import Array, array_from_host
from .client import HostBufferSemantics
from .device import Device
from .errors import XlaRuntimeError, check

__all__ = ["from_dlpack", "SUPPORTED_DTYPES"]

_NULL = ffi.NULL

#: Dtypes that travel through DLPack both ways.
SUPPORTED_DTYPES = _dlpack.SUPPORTED_DTYPES


def from_dlpack(external, device: Device | None = None, copy: bool | None = None) -> Array:
    """An Array holding the data of a DLPack producer (an object with ``__dlpack__``, or a
    legacy ``"dltensor"`` capsule).

    A producer on a GPU whose plugin has the PJRT stream extension is asked for its data on
    that device's stream for external ready events
    ([`Device.get_stream_for_external_ready_events`][pjrt.device.Device.get_stream_for_external_ready_events]), as jaxlib asks: it makes the
    stream wait for its own work, so neither side waits on the host.

    Args:
      external: the producer: a numpy array, a jax or PyTorch tensor, a pjrt Array, ...
      device: the device to place the Array on; None picks the producer's own device (the
        first CPU device of the default ``cpu`` backend for host memory).
      copy: True always copies; False never does (BufferError where sharing is impossible);
        None shares memory where the plugin can view it and copies otherwise.

    Returns:
      A single-device [`Array`][pjrt.array.Array].

    Raises:
      ValueError: the producer's capsule is damaged (its ndim, shape, strides, byte_offset,
        data pointer or device cannot be right); the message names the field. Or its shape's
        extents overflow int64 when multiplied in order, which XLA refuses even for a shape
        with a 0 extent (`pjrt._wire.shape_extents`).
      BufferError: the producer's dtype or layout cannot be taken as asked, or ``copy=False``
        where the memory cannot be shared.
      TypeError: ``external`` is not a DLPack producer.
    """
    if device is not None and not isinstance(device, Device):
        raise TypeError(f"device must be a pjrt Device or None, not {type(device).__name__}")
    stream = _producer_stream(external)
    capsule = _capsule_of(external, copy, stream)
    tensor = _dlpack.consume(capsule)
    try:
        # A producer may hold a shape with no element whose extents XLA cannot multiply out
        # (PyTorch makes (3, 2**61, 0) float32): the plugin would abort making it.
        check_extents(tensor.shape, tensor.dtype.itemsize,
                      f"the DLPack tensor's shape {tensor.shape} of {tensor.dtype}")
        target = device if device is not None else _default_device(tensor.device)
        array = None
        if copy is not True and _can_view(tensor, target):
            array = _view(tensor, target, must=copy is False, stream=stream)
            if array is not None:
                return array
        if copy is False:
            raise BufferError(
                f"copy=False, but the data cannot be shared with {target}: "
                f"{_why_not_shared(tensor, target)}")
        return _copy(tensor, target, stream)
    finally:
        if not tensor.handed_over:
            tensor.release()


def _producer_stream(external) -> int | None:
    """The stream a GPU producer is asked to make its data ready on: the stream for external
    ready events of the device holding the data, as jaxlib asks (through the plugin's stream
    extension). None for host data, or where that device's plugin lacks the extension (the
    producer then synchronises as DLPack says for no stream)."""
    dlpack_device = getattr(external, "__dlpack_device__", None)
    if dlpack_device is None:
        return None
    dl_device = tuple(dlpack_device())
    if dl_device[0] not in (lib.kDLCUDA, lib.kDLROCM):
        return None
    try:
        holder = _default_device(dl_device)
    except (BufferError, RuntimeError):
        return None  # no backend for that device: the data is copied through the host
    from ._capi.stream_extension import has_stream_extension

    if not has_stream_extension(holder.client.plugin.api):
        return None
    return holder.get_stream_for_external_ready_events()


def _capsule_of(external, copy, stream=None):
    if not hasattr(external, "__dlpack__"):
        if type(external).__name__ == "PyCapsule":
            return external  # the legacy protocol: a capsule handed over directly
        raise TypeError(f"from_dlpack takes an object with __dlpack__ (or a DLPack capsule), "
                        f"not {type(external).__name__}")
    kwargs = {"max_version": _dlpack.VERSION}
    if copy is not None:
        kwargs["copy"] = copy
    if stream is not None:
        kwargs["stream"] = stream
    try:
        return external.__dlpack__(**kwargs)
    except TypeError:
        # A producer of the protocol before DLPack 1.0 takes no max_version or copy.
        return external.__dlpack__(**({"stream": stream} if stream is not None else {}))


def _default_device(dl_device: tuple) -> Device:
    from .registry import get_backend

    device_type, device_id = dl_device
    platform = _dlpack.PLATFORMS.get(device_type)
    if platform is None:
        if device_type in (lib.kDLCUDAHost, lib.kDLROCMHost, lib.kDLCUDAManaged):
            platform = "cpu"  # host memory any CPU device can read
        else:
            raise BufferError(f"DLPack device type {device_type} has no pjrt platform; pass "
                              f"device= to copy it somewhere")
    devices = get_backend(platform).local_devices()
    if platform == "cpu":
        return devices[0]
    for candidate in devices:
        if candidate.local_hardware_id == device_id:
            return candidate
    raise BufferError(f"no local {platform} device has hardware id {device_id}")


def _host_readable(tensor: _dlpack.Consumed) -> bool:
    return tensor.device[0] in (lib.kDLCPU, lib.kDLCUDAHost, lib.kDLROCMHost,
                                lib.kDLCUDAManaged)


def _can_view(tensor: _dlpack.Consumed, target: Device) -> bool:
    return _why_not_shared(tensor, target) is None


def _why_not_shared(tensor: _dlpack.Consumed, target: Device) -> str | None:
    client = target.client
    if not client.plugin.api.has("PJRT_Client_CreateViewOfDeviceBuffer"):
        return f"the {client.platform} plugin cannot view foreign memory"
    own = _dlpack.DEVICE_TYPES.get(client.platform)
    if own is None or tensor.device[0] != own:
        return f"the data is on DLPack device {tensor.device}, not on a {client.platform} device"
    if own != lib.kDLCPU and target.local_hardware_id != tensor.device[1]:
        return f"the data is on device {tensor.device[1]}, not on {target}"
    if not _dlpack.is_row_major(tensor.shape, tensor.strides):
        return f"its strides {tensor.strides} are not dense row-major"
    return None


def _view(tensor: _dlpack.Consumed, target: Device, *, must: bool,
          stream: int | None = None) -> Array | None:
    """Wrap the tensor's memory in a buffer on ``target``; None when the plugin refuses (e.g.
    memory it finds misaligned) and a copy may be made instead. ``stream``: the stream the
    producer made the data ready on, which the view waits for."""
    client = target.client
    api = client.plugin.api
    args = api.new_args("PJRT_Client_CreateViewOfDeviceBuffer_Args")
    dims = ffi.new("int64_t[]", list(tensor.shape)) if tensor.shape else _NULL
    args.device_buffer_ptr = ffi.cast("void *", tensor.data)
    args.dims = dims
    args.num_dims = len(tensor.shape)
    args.element_type = dtypes.to_pjrt_type(tensor.dtype)
    args.device = target.pointer
    args.on_delete_callback = tensor.deleter
    args.on_delete_callback_arg = tensor.managed
    # The producer's deleter takes the GIL on whichever thread the plugin frees the view:
    # launches let the GIL go from now on (see CallPlan).
    programs_may_call_python()
    if stream is not None:
        args.stream = stream
    with client.raw_handle.calling() as handle:
        args.client = handle.pointer
        try:
            check(api, api.table.PJRT_Client_CreateViewOfDeviceBuffer(args))
        except XlaRuntimeError as error:
            if must:
                raise BufferError(f"copy=False, but the {client.platform} plugin cannot view "
                                  f"this memory: {error}") from error
            return None  # the plugin did not take the callback: the tensor is still ours
        tensor.handed_over = True  # the plugin runs the deleter when it frees the buffer
        array = Array(client, [args.buffer], (target,), tensor.shape, tensor.dtype)
        array.mark_shared()  # the producer may write to it later: never cache its value
        return array


def _copy(tensor: _dlpack.Consumed, target: Device, stream: int | None = None) -> Array:
    client = target.client
    if _host_readable(tensor):
        # IMMUTABLE_ONLY_DURING_CALL: the plugin has its own copy when the call returns.
        return array_from_host(client, tensor.host_view(), target,
                               HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL)
    source_platform = _dlpack.PLATFORMS.get(tensor.device[0])
    if source_platform is None or not _dlpack.is_row_major(tensor.shape, tensor.strides):
        raise BufferError(f"cannot copy a tensor on DLPack device {tensor.device} with "
                          f"strides {tensor.strides} to {target}")
    source = _default_device(tensor.device)
    view = _view(tensor, source, must=True, stream=stream)
    return view.copy_to_device(target)

"""One launch of a program, below `pjrt.executable.LoadedExecutable`: the one call struct
every launch fills (`Call`), the callbacks a native `CallPlan` makes into Python
(`CallHooks`), donation, the launch of a portable executable on a chosen device, and the
Arrays made of what the plugin returned. Nothing here knows an executable: each function is
given the handles and values it works on."""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence

import numpy as np

from .. import dtypes
from .._capi import long_runs, off_thread
from .._pjrt_cffi import ffi, lib
from ..array import Array, array_from_host
from ..errors import consume

if TYPE_CHECKING:
    from ..device import ClientView, Device

_NULL = ffi.NULL


class Call:
    """One caller's ``pjrt_shim_call``, in memory cffi owns: the one call struct of every
    launch, on one device or several, run by the one launcher (``pjrt_shim_call_run``) from
    C (`CallPlan`) or from Python (`Launcher.launch`, `pjrt._capi.long_runs`).

    A `CallPlan` keeps the idle ones and the Python path one per thread, and each is handed to
    one call at a time, so two threads, or a call made from inside another (a Python custom
    call), never share one.
    """

    __slots__ = ("call", "arguments", "outputs", "host_data", "fixed", "size", "keep", "busy",
                 "abandoned")

    def __init__(self, handle, pointer, device_pointer, num_outputs: int, count: int,
                 fixed: tuple, num_devices: int = 1):
        if num_devices < 1 and device_pointer == _NULL:  # the plugin would get no device
            raise ValueError("a launch needs a device: this one has neither a device list nor "
                             "a device (a portable executable runs with execute(arguments, "
                             "device=...))")
        self.fixed = fixed  # the parameters' host types and dimensions, which call points to
        self.size = (count, num_devices)
        #: The non-donatable indices of the launch running now (call.non_donatable's memory).
        self.keep = None
        #: Set during a call on the Python path (see `Launcher.thread_call`).
        self.busy = False
        self.abandoned = None  # see pjrt._capi.long_runs.free_after
        self.call = call = ffi.new("pjrt_shim_call *")
        # Device-major, as PJRT_LoadedExecutable_Execute takes them on several devices.
        self.arguments = ffi.new("PJRT_Buffer*[]", max(count * num_devices, 1))
        self.outputs = ffi.new("PJRT_Buffer*[]", max(num_outputs * num_devices, 1))
        self.host_data = ffi.new("void*[]", max(count, 1))
        call.api = handle.api.table
        call.client = handle.pointer
        call.executable = pointer
        call.num_devices = num_devices
        call.device = device_pointer
        call.num_arguments = count
        call.num_outputs = num_outputs
        call.arguments = self.arguments
        call.outputs = self.outputs
        call.host_data = self.host_data
        call.host_types, call.host_num_dims, call.host_dims = fixed
        call.slow_ns = int(long_runs.INLINE_LIMIT_SECONDS * 1e9)


def new_call(handle, pointer, device_pointer, num_outputs: int, count: int,
              fixed: tuple, num_devices: int = 1) -> tuple:
    """A fresh `Call` as its `CallPlan` takes it: the owner, its struct's address, and the
    cffi array the plugin writes the outputs to."""
    call = Call(handle, pointer, device_pointer, num_outputs, count, fixed, num_devices)
    return call, int(ffi.cast("uintptr_t", call.call)), call.outputs


class LaunchState:
    """Where a launch runs, for an executable without a `CallPlan` (which keeps the same
    two fields for its own calls)."""

    __slots__ = ("inline", "live")

    def __init__(self):
        self.inline = 0  # see pjrt._capi.long_runs: the first launch is off-thread
        self.live = 1


class CallHooks(NamedTuple):
    """What a `CallPlan` calls back into: the executable's side of a call, which the native
    plan leaves to Python because each is policy (how a call's scratch is made, what donation
    means, how an error is worded, which shardings fit)."""

    #: () -> (owner, call struct address, outputs): a fresh call struct for this executable.
    new_call: Callable[[], tuple]
    #: (arguments) -> what `consume_donated` needs: checks and holds the donated inputs.
    prepare_donations: Callable[..., tuple]
    #: (arguments, held) -> None: marks the donated inputs consumed after a launch.
    consume_donated: Callable[..., None]
    #: (call owner) -> None: raises the launch's error, worded.
    raise_error: Callable[..., None]
    #: (index, argument) -> bool, on several devices: whether a global argument fits.
    accept: Callable[[int, Any], bool] | None = None


def call_hooks(handle, donated: tuple, new_call: Callable[[], tuple],
                accept: Callable[[int, Any], bool] | None = None) -> CallHooks:
    return CallHooks(new_call, functools.partial(prepare_call_donations, donated),
                     functools.partial(consume_call_donations, donated),
                     functools.partial(raise_call_error, handle.api), accept)


def prepare_call_donations(donated: tuple, arguments: Sequence) -> tuple:
    """`prepare_donations` for one `CallPlan` call."""
    return prepare_donations(donated, [arguments])


def consume_call_donations(donated: tuple, arguments: Sequence, keep: tuple) -> None:
    """`consume_donated` for one `CallPlan` call."""
    consume_donated(donated, [arguments], keep)


def raise_call_error(api, call: Call) -> None:
    """Raise the plugin's error of a `CallPlan` call (taking it out of the call struct)."""
    error, call.call.error = call.call.error, _NULL
    raise consume(api, error)


def prepare_donations(donated: tuple, per_device_arguments) -> tuple:
    """Check donated arguments; the indices that must not be donated this time.

    An array whose memory numpy is reading without a copy is passed as not donatable, so
    the plugin copies it instead of reusing it, and the array stays valid.
    """
    keep = set()
    for arguments in per_device_arguments:
        for index in donated:
            if index >= len(arguments):
                continue
            if not isinstance(arguments[index], Array):
                continue  # a host value's copy, made for this call alone
            for other, argument in enumerate(arguments):
                if other != index and argument is arguments[index]:
                    raise ValueError(f"argument {index} is donated to the program and also "
                                     f"passed as argument {other}; pass a copy")
            if arguments[index]._viewed():
                keep.add(index)
    return tuple(sorted(keep))


def consume_donated(donated: tuple, per_device_arguments, keep: tuple) -> None:
    for index in donated:
        if index in keep:
            continue
        for arguments in per_device_arguments:
            if index < len(arguments) and isinstance(arguments[index], Array):
                arguments[index]._release("donated")


def launch_on_device(handle, pointer, buffers, count: int, num_outputs: int, keep: tuple,
                      device: "Device"):
    """Launch a portable executable with ``count`` argument ``buffers`` on ``device``
    (``PJRT_LoadedExecutable_Execute``'s ``execute_device``) on a worker thread; returns the
    array its ``num_outputs`` new buffers landed in. A launch the caller abandoned (Ctrl-C)
    goes on with its own ticket on the client, and its outputs are freed when it ends."""
    api = handle.api
    outputs = ffi.new("PJRT_Buffer*[]", max(num_outputs, 1))
    error = ffi.new("PJRT_Error**")
    non_donatable = ffi.new("int64_t[]", keep) if keep else _NULL
    ticket = handle.begin()  # its own: the caller's may end before the launch does

    def work() -> int:
        return lib.pjrt_shim_execute(api.table, pointer, buffers, 1, count, outputs,
                                     num_outputs, non_donatable, len(keep), device.pointer,
                                     _NULL, error)

    def abandon(status) -> None:
        try:
            if error[0] != _NULL:
                consume(api, error[0])  # destroys the plugin's error; nobody reads it
            elif status == 0:
                made = [outputs[i] for i in range(num_outputs) if outputs[i] != _NULL]
                if made:
                    lib.pjrt_shim_buffers_destroy(api.table, ffi.new("PJRT_Buffer*[]", made),
                                                  len(made))
        finally:
            handle.end(ticket)

    try:
        status = off_thread.call_off_thread(work, abandon)
    except BaseException as interrupt:
        if not off_thread.was_abandoned(interrupt):
            handle.end(ticket)
        raise
    handle.end(ticket)
    if error[0] != _NULL:
        raise consume(api, error[0])
    if status != 0:
        raise MemoryError("out of host memory while preparing the execution")
    return outputs


def buffer_metadata(client: "ClientView", buffer) -> tuple:
    """``(shape, dtype)`` of a buffer, read from the plugin."""
    api = client.raw_handle.api
    element_type = api.call_new("PJRT_Buffer_ElementType", buffer=buffer).type
    dims = api.call_new("PJRT_Buffer_Dimensions", buffer=buffer)
    shape = tuple(int(dims.dims[i]) for i in range(dims.num_dims))
    return shape, dtypes.from_pjrt_type(element_type)


def unpadded(client: "ClientView", array: Array) -> Array:
    """An output with a dimension of dynamic size, at the size its call gave (an Array's shape
    is static). The plugin's buffer has the bound's size and holds the value, dense in its
    stored order, at its start (XLA's ``SliceToDynamic``). Waits for the value, since its
    size is part of it; the padded buffer is freed."""
    handle = client.raw_handle
    with handle.calling():
        buffer = array.live_buffers()[0]
        array.block_until_ready()
        dims = handle.api.call_new("PJRT_Buffer_UnpaddedDimensions", buffer=buffer)
        size = tuple(int(dims.unpadded_dims[d]) for d in range(int(dims.num_dims)))
    if size == array.shape:
        return array
    order = array.stored_order or tuple(range(len(size)))
    stored = np.asarray(array).transpose(order).reshape(-1)  # the buffer's bytes, in order
    value = stored[:math.prod(size)].reshape([size[d] for d in order])
    value = np.ascontiguousarray(value.transpose(np.argsort(order)))
    unpadded = array_from_host(client, value, array.device, 0)  # copied during the call
    array.delete()
    return unpadded


def array_from_buffer(client: "ClientView", buffer, devices: tuple) -> Array:
    """Wrap a buffer whose shape and dtype are read from the plugin."""
    shape, dtype = buffer_metadata(client, buffer)
    return Array(client, [buffer], devices, shape, dtype)


def refuse_no_device(devices: Sequence, launch: str) -> None:
    """Raise ValueError when ``launch`` (a method's name) would run an executable on its own
    ``devices`` and there are none: a portable executable's
    (``CompileOptions.compile_portable_executable``). The plugin's Execute would get neither a
    device list nor a device, where XLA's CPU plugin crashes (jaxlib's error is
    ``INVALID_ARGUMENT: Execute expects a non-null device_assignment``)."""
    if not devices:
        raise ValueError(f"this executable is portable (compiled with CompileOptions."
                         f"compile_portable_executable) and has no devices of its own for "
                         f"{launch} to run it on: launch it on one device with "
                         f"execute(arguments, device=...)")


def not_row_major(index: int, argument: Array) -> ValueError:
    """The error for an argument stored in another layout than the row-major one the program
    takes (the plugin would read its bytes in the wrong order)."""
    return ValueError(
        f"argument {index} is laid out as {argument.layout} (a program's output compiled to "
        f"that layout), but this program takes it row-major; pass a row-major copy, e.g. "
        f"client.buffer_from_pyval(np.asarray(x)), or compile the program to take that layout "
        f"(CompileOptions.argument_layouts)")

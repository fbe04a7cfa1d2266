"""Checks of a client, its devices and memories, host transfers and events."""
from __future__ import annotations

import threading

import ml_dtypes
import numpy as np

from ... import dtypes
from ..._pjrt_cffi import ffi
from ...errors import ErrorCode, XlaRuntimeError
from ._context import IMMUTABLE_UNTIL_TRANSFER_COMPLETES, refused
from ._registry import CLIENT, LOADED, CheckFailed, Skip, add, check

#: Options of every type PJRT_NamedValue carries, under names no plugin knows.
_PROBE_OPTIONS = {"pjrt_conform_probe_string": "x", "pjrt_conform_probe_int": 1,
                  "pjrt_conform_probe_list": [1, 2], "pjrt_conform_probe_float": 0.5,
                  "pjrt_conform_probe_bool": True}


@check(CLIENT, needs=(LOADED,))
def create(ctx):
    """PJRT_Client_Create makes a client (with the run's create options)."""
    try:
        client = ctx.client
    except XlaRuntimeError as error:
        raise CheckFailed(f"the plugin could not create a client: {refused(error)}") from None
    ctx.info["platform"] = f"{client.platform} {client.platform_version}".strip()
    ctx.info["devices"] = len(client.local_devices())
    shown = ", ".join(f"{k}={v}" for k, v in sorted(ctx.options.items()))
    return (f"{client.platform} client with {len(client.local_devices())} device(s)" +
            (f", options {shown}" if shown else ""))


@check("client.create_with_options")
def create_with_options(ctx):
    """A second client with options of every named-value type is made, or refused with an
    error (never a crash)."""
    try:
        other = ctx.new_client({**ctx.options, **_PROBE_OPTIONS})
    except XlaRuntimeError as error:
        return f"refused options it does not know, with an error: {refused(error)}"
    try:
        count = len(other.local_devices())
    finally:
        other.close()
    return f"accepted string, int, int list, float and bool options; {count} device(s)"


@check("client.platform")
def platform(ctx):
    """The client names its platform and version and its process index."""
    client = ctx.client
    if not client.platform:
        raise CheckFailed("PJRT_Client_PlatformName returned an empty name")
    index = client.process_index()
    if index < 0:
        raise CheckFailed(f"process index {index}")
    return f"{client.platform!r}, version {client.platform_version!r}, process {index}"


@check("devices.list")
def device_list(ctx):
    """Devices and addressable devices are listed, with distinct ids, and found by id."""
    client = ctx.client
    devices, local = client.devices(), client.local_devices()
    if not local:
        raise CheckFailed("the client has no addressable devices")
    ids = [device.id for device in devices]
    if len(set(ids)) != len(ids):
        raise CheckFailed(f"device ids repeat: {ids}")
    if not set(d.id for d in local) <= set(ids):
        raise CheckFailed("an addressable device is missing from PJRT_Client_Devices")
    for device in devices:
        if client.lookup_device(device.id) != device:
            raise CheckFailed(f"PJRT_Client_LookupDevice({device.id}) found another device")
    return f"{len(devices)} device(s), {len(local)} addressable, ids {ids[:8]}"


@check("devices.descriptions", needs=("devices.list",))
def device_descriptions(ctx):
    """Each device describes itself: kind, process index, attributes and strings."""
    api = ctx.api
    kinds, read = set(), ["kind"]
    for device in ctx.client.devices():
        if not device.device_kind:
            raise CheckFailed(f"device {device.id} has an empty kind")
        kinds.add(device.device_kind)
        if api.has("PJRT_DeviceDescription_Attributes"):
            if not isinstance(device.attributes(), dict):
                raise CheckFailed(f"device {device.id} attributes are not named values")
        if api.has("PJRT_DeviceDescription_ToString") and not device.to_string():
            raise CheckFailed(f"device {device.id} has an empty ToString")
        if api.has("PJRT_DeviceDescription_DebugString") and not device.debug_string():
            raise CheckFailed(f"device {device.id} has an empty DebugString")
    for function, what in (("PJRT_DeviceDescription_Attributes", "attributes"),
                           ("PJRT_DeviceDescription_ToString", "strings")):
        if api.has(function):
            read.append(what)
    return f"read {', '.join(read)}; kinds {sorted(kinds)}"


@check("memories.kinds", needs=("devices.list",))
def memories(ctx):
    """Memories have kinds, belong to devices, and each device's default is among its own."""
    api = ctx.api
    if not api.has("PJRT_Device_DefaultMemory") or not api.has("PJRT_Memory_Kind"):
        raise Skip("the plugin has no memory API (PJRT_Device_DefaultMemory, PJRT_Memory_Kind)")
    client = ctx.client
    kinds = set()
    for memory in client.addressable_memories():
        if not memory.kind:
            raise CheckFailed(f"memory {memory.id} has an empty kind")
        kinds.add(memory.kind)
    for device in client.local_devices():
        default = device.default_memory()
        if default not in device.addressable_memories():
            raise CheckFailed(f"device {device.id}'s default memory is not among its memories")
        if device not in default.addressable_by_devices():
            raise CheckFailed(f"device {device.id}'s default memory does not list the device")
    return f"{len(client.addressable_memories())} memories, kinds {sorted(kinds)}"


@check("client.default_device_assignment", needs=("devices.list",))
def default_device_assignment(ctx):
    """The default device assignment names addressable devices."""
    if not ctx.api.has("PJRT_Client_DefaultDeviceAssignment"):
        raise Skip("the plugin has no PJRT_Client_DefaultDeviceAssignment")
    client = ctx.client
    count = len(client.local_devices())
    assignment = client.default_device_assignment(1, count)
    ids = {device.id for device in client.devices()}
    if set(assignment.flat) - ids:
        raise CheckFailed(f"assignment {assignment.tolist()} names unknown devices")
    return f"1 replica x {count} partition(s): {assignment.tolist()[0][:8]}"


# -- transfers -------------------------------------------------------------------------------

_SUB_BYTE = {"int4", "uint4", "int2", "uint2", "float4_e2m1fn"}


def sample(dtype: np.dtype) -> np.ndarray:
    """Values of ``dtype`` covering its range (every bit pattern of the small types)."""
    rng = np.random.default_rng(1234)
    if dtype == np.bool_:
        return np.array([True, False, False, True, True, True, False, True]).reshape(2, 4)
    if dtype.name in _SUB_BYTE:
        if dtype.kind == "V" or "float" in dtype.name:
            return np.arange(16, dtype=np.uint8).view(dtype).reshape(4, 4)
        info = ml_dtypes.iinfo(dtype)
        return np.arange(int(info.min), int(info.max) + 1).astype(dtype).reshape(2, -1)
    if dtype.itemsize == 1:
        return np.arange(256, dtype=np.uint8).view(dtype).reshape(16, 16)
    raw = rng.integers(0, 256, size=64 * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(8, 8)


def same_bits(expected: np.ndarray, got: np.ndarray) -> bool:
    """Whether two arrays hold the same values bit for bit (sub-byte types by value)."""
    if expected.shape != got.shape or expected.dtype != got.dtype:
        return False
    if expected.dtype.name in _SUB_BYTE:
        return bool(np.array_equal(expected.astype(np.float32), got.astype(np.float32)))
    return expected.tobytes() == got.tobytes()


def _mismatch(expected: np.ndarray, got: np.ndarray) -> str:
    flat_e, flat_g = expected.reshape(-1), got.reshape(-1)
    for i in range(flat_e.size):
        if not same_bits(flat_e[i:i + 1], flat_g[i:i + 1]):
            return (f"PJRT_Buffer_ToHostBuffer returned other bytes: element {i} is "
                    f"{flat_g[i]!r}, {flat_e[i]!r} was sent")
    return "PJRT_Buffer_ToHostBuffer returned other bytes"


def _check_metadata(ctx, buffer, host: np.ndarray) -> None:
    api = ctx.api
    if api.has("PJRT_Buffer_ElementType"):
        kind = api.call_new("PJRT_Buffer_ElementType", buffer=buffer).type
        if kind != dtypes.to_pjrt_type(host.dtype):
            raise CheckFailed(f"PJRT_Buffer_ElementType says {int(kind)}, the buffer was made "
                              f"as {dtypes.to_pjrt_type(host.dtype)}")
    if api.has("PJRT_Buffer_Dimensions"):
        args = api.call_new("PJRT_Buffer_Dimensions", buffer=buffer)
        dims = tuple(args.dims[i] for i in range(args.num_dims))
        if dims != host.shape:
            raise CheckFailed(f"PJRT_Buffer_Dimensions says {dims}, the buffer was made {host.shape}")


def _roundtrip_checked(ctx, host: np.ndarray, **put_options) -> None:
    buffer, _ = ctx.put(host, **put_options)
    try:
        _check_metadata(ctx, buffer, host)
        ready = ctx.api.call_new("PJRT_Buffer_ReadyEvent", buffer=buffer).event
        ctx.await_event(ready)
        got = ctx.to_host(buffer, host.shape, host.dtype)
    finally:
        ctx.destroy(buffer)
    expected = host.copy(order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
    if not same_bits(expected, got):
        raise CheckFailed(_mismatch(expected, got))


def _roundtrip_check(dtype: np.dtype):
    def run(ctx):
        host = sample(dtype)
        try:
            buffer, _ = ctx.put(host)
        except XlaRuntimeError as error:
            raise Skip(f"the plugin does not take {dtype.name} buffers: {refused(error)}") from None
        ctx.destroy(buffer)
        _roundtrip_checked(ctx, host)
        return f"{host.size} values of shape {host.shape} came back bit for bit"
    return run


for _dtype in dtypes.SUPPORTED_DTYPES:
    add(f"transfer.roundtrip.{_dtype.name}", _roundtrip_check(_dtype), (CLIENT,),
        f"{_dtype.name} to the device and back through ToHostBuffer, bit for bit")


@check("transfer.zero_size")
def zero_size(ctx):
    """Arrays with a zero-length dimension go to the device and back."""
    for host in (np.zeros((0, 4), np.float32), np.zeros((3, 0, 2), np.int32)):
        _roundtrip_checked(ctx, host)
    return "shapes (0, 4) float32 and (3, 0, 2) int32"


@check("transfer.scalar")
def scalar(ctx):
    """0-d arrays go to the device and back."""
    for host in (np.array(3.25, np.float32), np.array(-7, np.int64), np.array(True)):
        _roundtrip_checked(ctx, host)
    return "0-d float32, int64 and bool"


@check("transfer.strided")
def strided(ctx):
    """Host arrays read through byte strides (a transpose, a step) arrive in order."""
    base = np.arange(60, dtype=np.float32).reshape(6, 10)
    views = (base.T, base[::2, 1::3])
    try:
        for view in views:
            _roundtrip_checked(ctx, view, byte_strides=view.strides)
    except XlaRuntimeError as error:
        if error.code_name == "UNIMPLEMENTED":
            raise Skip(f"the plugin takes no byte strides: {refused(error)}") from None
        raise
    return "a transposed (10, 6) and a stepped (3, 3) float32 view"


@check("transfer.device_to_device", needs=("devices.list",))
def device_to_device(ctx):
    """A buffer copied to another device (PJRT_Buffer_CopyToDevice) keeps its value."""
    devices = ctx.devices(2)
    if not ctx.api.has("PJRT_Buffer_CopyToDevice"):
        raise Skip("the plugin has no PJRT_Buffer_CopyToDevice")
    host = np.arange(12, dtype=np.int32).reshape(3, 4)
    array = ctx.client.buffer_from_pyval(host, devices[0])
    moved = array.copy_to_device(devices[1])
    if moved.device != devices[1]:
        raise CheckFailed(f"the copy is on {moved.device}, not {devices[1]}")
    if not np.array_equal(np.asarray(moved), host):
        raise CheckFailed("the copy holds other values")
    return f"device {devices[0].id} -> {devices[1].id}"


# -- events and errors -----------------------------------------------------------------------

@check("events.async")
def events(ctx):
    """Transfer events complete: OnReady callbacks fire, IsReady turns true, Await returns."""
    api = ctx.api
    host = np.arange(1 << 16, dtype=np.float32)
    buffer, done = ctx.put(host, semantics=IMMUTABLE_UNTIL_TRANSFER_COMPLETES, wait=False)
    seen = []
    try:
        ctx.await_event(done)  # may be NULL: a plugin may copy during the call
        ready = api.call_new("PJRT_Buffer_ReadyEvent", buffer=buffer).event
        if ready == ffi.NULL:
            raise CheckFailed("PJRT_Buffer_ReadyEvent returned no event")
        fired = threading.Event()
        if api.has("PJRT_Event_OnReady"):
            @ffi.callback("PJRT_Event_OnReadyCallback")
            def on_ready(error, user_arg):
                seen.append(error != ffi.NULL)
                if error != ffi.NULL:  # the callback owns the error it is given
                    args = api.new_args("PJRT_Error_Destroy_Args")
                    args.error = error
                    api.table.PJRT_Error_Destroy(args)
                fired.set()
            api.call_new("PJRT_Event_OnReady", event=ready, callback=on_ready, user_arg=ffi.NULL)
            if not fired.wait(60):
                raise CheckFailed("the OnReady callback did not fire within 60 s")
            if seen[0]:
                raise CheckFailed("the ready event fired with an error")
        if not api.call_new("PJRT_Event_IsReady", event=ready).is_ready:
            raise CheckFailed("PJRT_Event_IsReady is false after the event fired")
        ctx.await_event(ready)
        got = ctx.to_host(buffer, host.shape, host.dtype)
    finally:
        ctx.destroy(buffer)
    if not same_bits(host, got):
        raise CheckFailed(_mismatch(host, got))
    how = "OnReady fired, " if seen else ""
    return f"{how}IsReady true, Await returned" + (", done-with-host event awaited" if done != ffi.NULL else "")


@check("errors.codes", needs=("devices.list",))
def error_codes(ctx):
    """A refused request returns a PJRT_Error whose code and message the plugin's own
    PJRT_Error_GetCode and PJRT_Error_Message read, and PJRT_Error_Destroy frees."""
    api = ctx.api
    if not api.has("PJRT_Client_LookupDevice"):
        raise Skip("the plugin has no PJRT_Client_LookupDevice to refuse a request with")
    missing_id = max(device.id for device in ctx.client.devices()) + 1000
    args = api.new_args("PJRT_Client_LookupDevice_Args")
    args.client = ctx.client.handle.pointer
    args.id = missing_id
    error = api.table.PJRT_Client_LookupDevice(args)
    if error == ffi.NULL:
        raise CheckFailed(f"PJRT_Client_LookupDevice found a device with id {missing_id}, "
                          f"which the client does not list")
    try:
        code_args = api.new_args("PJRT_Error_GetCode_Args")
        code_args.error = error
        code_error = api.table.PJRT_Error_GetCode(code_args)
        if code_error != ffi.NULL:
            raise CheckFailed("PJRT_Error_GetCode itself returned an error")
        code = int(code_args.code)
        message_args = api.new_args("PJRT_Error_Message_Args")
        message_args.error = error
        api.table.PJRT_Error_Message(message_args)
        message = (ffi.unpack(message_args.message, message_args.message_size).decode(
            "utf-8", "replace") if message_args.message != ffi.NULL else "")
    finally:
        destroy_args = api.new_args("PJRT_Error_Destroy_Args")
        destroy_args.error = error
        api.table.PJRT_Error_Destroy(destroy_args)
    if not 1 <= code <= 16:
        raise CheckFailed(f"the error's code is {code}, not one of PJRT's codes 1 to 16")
    if not message.strip():
        raise CheckFailed(f"the error (code {ErrorCode(code).name}) has an empty message")
    return (f"a lookup of device {missing_id} is refused with "
            f"{ErrorCode(code).name}: {' '.join(message.split())}")

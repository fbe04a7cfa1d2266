"""Which device's program runs the custom-call handler a thread is in, and the one wait that
rule forbids.

XLA's CPU plugin runs the launches of one device in order, and the PJRT C API gives no way to
queue a launch elsewhere, so a program launched on that device from inside a handler of an
asynchronous program would start only after the program running the handler ends, which waits
for the handler. The trampoline (`pjrt._capi.ffi_handlers`) notes the device while a handler
runs; `pjrt._runtime.handler_launches` runs such launches elsewhere, and the sliced waits
(`pjrt._capi.waits`) turn a wait that could never end into an error.
"""
from __future__ import annotations

import contextvars

from .api import Api

#: The id of the device whose program runs, asynchronously, the Python custom-call handler
#: this thread is in; None outside such handlers (see `handler_running_on_device`).
running_handlers_device: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "pjrt_handler_device", default=None)


#: One entry per handler now running for an asynchronous program, on any thread (only its
#: length counts): while it is empty, a launch need not ask which device the running
#: handler's program is on. A list, so that modules that take it by name see it change.
handlers_of_asynchronous_programs: list[int] = []


def handler_running_on_device(device_id: int | None) -> contextvars.Token:
    """Note that this thread runs a custom-call handler for a program running asynchronously
    on the device ``device_id`` (None: inline, or not known, or work that must not count as
    the handler's); `handler_finished` undoes it.

    XLA's CPU plugin runs the launches of one device in order, and the PJRT C API gives no way
    to queue a launch elsewhere, so a program launched on that device from inside the handler
    would start only after the program running the handler ends, which waits for the handler.
    `pjrt._runtime.handler_launches` runs such launches elsewhere; a wait on a program that
    still got queued there (launched by another thread, say) would never end, and
    `refuse_waiting_on_the_handlers_device` turns it into an error.
    """
    if device_id is not None:
        handlers_of_asynchronous_programs.append(device_id)
    return running_handlers_device.set(device_id)


def handler_finished(token: contextvars.Token) -> None:
    if running_handlers_device.get() is not None:
        handlers_of_asynchronous_programs.pop()
    running_handlers_device.reset(token)


def device_of_running_handler() -> int | None:
    """The id of the device whose asynchronous program runs the handler this thread is in
    (see `handler_running_on_device`); None outside such handlers."""
    return running_handlers_device.get()


def refuse_waiting_on_the_handlers_device(api: Api, buffers) -> None:
    """Raise RuntimeError if one of ``buffers`` (not computed yet) is on the device whose
    program runs the custom-call handler this thread is in (see `handler_running_on_device`)."""
    device_id = running_handlers_device.get()
    for buffer in buffers:
        device = api.call_new("PJRT_Buffer_Device", buffer=buffer).device
        description = api.call_new("PJRT_Device_GetDescription", device=device).device_description
        if api.call_new("PJRT_DeviceDescription_Id",
                        device_description=description).id == device_id:
            raise RuntimeError(
                f"a custom-call handler waits on a program running on device {device_id}, the "
                f"device whose program is running the handler: the plugin runs one device's "
                f"programs in order, so that program starts only after the handler returns, "
                f"and the wait would never end. Launch the handler's programs from the "
                f"handler itself with execute, execute_with_token or execute_sharded (pjrt "
                f"runs those elsewhere), or on another device (compiled for another of "
                f"client.devices())")

"""Waiting on the plugin without making the caller deaf to Ctrl-C.

A C call that blocks until a program finishes would hold off Python's signal handlers until it
returns, so a ``KeyboardInterrupt`` sent during a long ``block_until_ready()`` would arrive
seconds later. Instead, waits here happen in short slices (the plugin's ``OnReady`` callback
wakes a condition variable in the C helpers) with a return to Python between them, where a
pending signal is raised. The plugin's work itself goes on after an interrupted wait; the C
side frees what the abandoned wait leaves behind.

The rest of the story lives beside what it governs: a native call with no event to wait on runs
on a worker thread while the caller waits in slices (`pjrt._capi.off_thread`); the exit waits
for native work in flight within one budget (`pjrt._capi.exit_guard`); a wait inside a
custom-call handler on its own program's device is refused (`pjrt._capi.handler_devices`).
"""
from __future__ import annotations

import threading

from .api import Api
from .handler_devices import refuse_waiting_on_the_handlers_device, running_handlers_device
from .._pjrt_cffi import ffi, lib
from ..errors import consume

_NULL = ffi.NULL

#: How long one slice of a wait lasts: the longest a Ctrl-C waits to be noticed.
WAIT_SLICE_MS = 50

def wait_for_waiter(api: Api, waiter) -> None:
    """Wait until ``waiter`` (a ``pjrt_shim_waiter*``) fires; raise the event's error.

    A signal handler's exception (``KeyboardInterrupt``) raised between slices abandons the
    wait; the C side frees the waiter when the event fires.
    """
    try:
        while not lib.pjrt_shim_waiter_wait(waiter, WAIT_SLICE_MS):
            pass
    finally:
        error = lib.pjrt_shim_waiter_finish(waiter)
    if error != _NULL:
        raise consume(api, error)


def wait_event(api: Api, event) -> None:
    """Wait for ``event`` (a ``PJRT_Event*``, which this frees) and raise its error."""
    if not api.has("PJRT_Event_OnReady"):
        lib.pjrt_shim_event_await_and_destroy(api.table, event)  # cannot be sliced
        return
    error_out = ffi.new("PJRT_Error **")
    waiter = lib.pjrt_shim_waiter_start(api.table, event, error_out)
    if waiter == _NULL:
        if error_out[0] != _NULL:
            raise consume(api, error_out[0])
        raise MemoryError("out of host memory while waiting for the plugin")
    wait_for_waiter(api, waiter)


def wait_buffer_ready(api: Api, buffer) -> None:
    """Wait until ``buffer``'s value is computed; raise the computation's error.

    The first slice is waited in the same C call that asks for the buffer's event, so a
    value that is ready, or nearly, costs one call.
    """
    outs = getattr(_outs, "pair", None)
    if outs is None:
        outs = _outs.pair = (ffi.new("pjrt_shim_waiter **"), ffi.new("PJRT_Error **"))
    waiter_out, error_out = outs
    if lib.pjrt_shim_buffer_wait(api.table, buffer, WAIT_SLICE_MS, waiter_out, error_out):
        error = error_out[0]
        if error != _NULL:
            error_out[0] = _NULL
            raise consume(api, error)
        return
    waiter = waiter_out[0]
    waiter_out[0] = _NULL
    if running_handlers_device.get() is not None:
        try:
            refuse_waiting_on_the_handlers_device(api, (buffer,))
        except BaseException:
            _drop(api, lib.pjrt_shim_waiter_finish(waiter))
            raise
    wait_for_waiter(api, waiter)


def wait_buffers_ready(api: Api, buffers: list) -> None:
    """Wait until every one of ``buffers`` (the shards of one array) is computed; raise the
    error of the first, in order, whose computation failed.

    Several buffers are waited on together in C (``pjrt_spmd_buffers_wait``): one native call
    when they are ready, and one wake-up when the last one becomes ready rather than one per
    shard; further slices go back to Python in between, as `wait_buffer_ready` does.
    """
    if len(buffers) == 1:
        wait_buffer_ready(api, buffers[0])
        return
    outs = getattr(_outs, "group", None)
    if outs is None:
        outs = _outs.group = (ffi.new("pjrt_spmd_group **"), ffi.new("PJRT_Error **"))
    group_out, error_out = outs
    if lib.pjrt_spmd_buffers_wait(api.table, buffers, len(buffers), WAIT_SLICE_MS, group_out,
                                  error_out):
        error = error_out[0]
        if error != _NULL:
            error_out[0] = _NULL
            raise consume(api, error)
        return
    group = group_out[0]
    group_out[0] = _NULL
    try:
        if running_handlers_device.get() is not None:
            refuse_waiting_on_the_handlers_device(api, buffers)
        while not lib.pjrt_spmd_group_wait(group, WAIT_SLICE_MS):
            pass
    finally:
        error = lib.pjrt_spmd_group_finish(group)
    if error != _NULL:
        raise consume(api, error)


def _drop(api: Api, error) -> None:
    if error != _NULL:
        consume(api, error)


#: Each thread's out-parameters for `wait_buffer_ready` (allocating them per call
#: would cost more than a wait on a ready value).
_outs = threading.local()

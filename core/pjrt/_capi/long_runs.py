"""Programs a plugin runs inside ``execute()``: launched where Ctrl-C can still reach the caller.

XLA's CPU plugin runs a program it judges cheap on the calling thread, inside the execute call
itself; a ``while`` loop it misjudges keeps that call, and the Python thread making it, busy for
as long as the loop runs, deaf to Ctrl-C. Moving every launch to a worker thread would cost each
call a thread hop (tens of microseconds, more than the rest of a small call), so an executable
decides where to launch from what it has seen:

* its **first** call is launched on a worker thread (see `pjrt._capi.off_thread.call_off_thread`)
  while the caller waits in slices; when that launch returns within
  `INLINE_LIMIT_SECONDS`, later calls launch on the caller's thread, with no hop;
* a launch on the caller's thread that takes longer than that sends the calls after it back to
  the worker.

So a program that runs long inline can be interrupted from its first call on, and a program
whose running time depends on its data can be interrupted from the call after its first long
run. A launch the caller abandoned goes on in the background: it keeps its own copies of the
argument and output lists and its own ticket on the client (so nothing it reads is freed under
it), the outputs it makes are freed when it ends, and host-value copies made for the call are
freed after it (`free_after`).
"""
from __future__ import annotations

import threading
from typing import Callable

from .._pjrt_cffi import ffi, lib
from ..errors import consume
from .off_thread import call_off_thread, was_abandoned

_NULL = ffi.NULL
_POINTER_SIZE = ffi.sizeof("PJRT_Buffer*")

#: A launch on the caller's thread that takes longer than this (seconds) moves the
#: executable's later launches to a worker thread, where Ctrl-C can reach the caller.
INLINE_LIMIT_SECONDS = 0.25


class _AfterLaunch:
    """Clean-ups a caller hands over because its abandoned launch still runs: run when the
    launch ends (at once if it has)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._jobs: list | None = []

    def later(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._jobs is not None:
                self._jobs.append(job)
                return
        job()

    def finish(self) -> None:
        with self._lock:
            jobs, self._jobs = self._jobs or [], None
        for job in jobs:
            try:
                job()
            except Exception:  # noqa: BLE001 - nobody waits for this call any more
                pass


def free_after(call, free: Callable[[], None]) -> None:
    """Run ``free`` now, or when the launch of ``call`` (an executable's call struct) ends if
    its caller was interrupted while the plugin still runs it."""
    after = call.abandoned
    if after is None:
        free()
        return
    call.abandoned = None
    after(free)


def launch(handle, call) -> bool:
    """Run a prepared call through the one launcher (``pjrt_shim_call_run``, as
    `LoadedExecutable._launch` does on the caller's thread) on a worker thread; the outputs
    land in ``call.outputs``. ``call`` is an executable's call struct (``call.call``, a
    ``pjrt_shim_call*``, whose ``arguments`` and ``outputs`` it owns); the launch runs on
    copies of the struct and its lists, so that ``call`` can be reused once the caller has
    gone. Returns whether the launch was quick enough for the caller's thread.

    Raises:
      KeyboardInterrupt: Ctrl-C while the plugin runs the launch (it goes on; see above).
      MemoryError, XlaRuntimeError: as a launch on the caller's thread.
    """
    api = handle.api
    struct = call.call
    num_devices = max(int(struct.num_devices), 1)
    total_arguments = max(num_devices * int(struct.num_arguments), 1)
    total_outputs = max(num_devices * int(struct.num_outputs), 1)
    arguments = ffi.new("PJRT_Buffer*[]", total_arguments)
    ffi.memmove(arguments, struct.arguments, total_arguments * _POINTER_SIZE)
    outputs = ffi.new("PJRT_Buffer*[]", total_outputs)
    own = ffi.new("pjrt_shim_call *", struct[0])
    own.arguments, own.outputs, own.error = arguments, outputs, _NULL
    own.host_data = _NULL  # the Python path has copied its host values already
    keep = _NULL
    if struct.num_non_donatable:
        keep = ffi.new("int64_t[]", int(struct.num_non_donatable))
        ffi.memmove(keep, struct.non_donatable, ffi.sizeof(keep))
    own.non_donatable = keep
    events = _NULL  # the completion events the caller asked for, written here first
    if struct.complete_events != _NULL:
        events = ffi.new("PJRT_Event*[]", num_devices)
    own.complete_events = events
    after = _AfterLaunch()
    ticket = handle.begin()  # its own: the caller's may end before the launch does

    def work() -> int:
        return lib.pjrt_shim_call_run(own)

    def abandon(status) -> None:
        try:
            if own.error != _NULL:
                consume(api, own.error)  # destroys the plugin's error; nobody reads it
            elif isinstance(status, int) and not status & lib.PJRT_SHIM_CALL_ERROR:
                made = [outputs[i] for i in range(total_outputs) if outputs[i] != _NULL]
                if made:
                    lib.pjrt_shim_buffers_destroy(api.table, ffi.new("PJRT_Buffer*[]", made),
                                                  len(made))
                for d in range(num_devices if events != _NULL else 0):
                    lib.pjrt_shim_event_destroy(api.table, events[d])
        finally:
            after.finish()
            handle.end(ticket)

    try:
        status = call_off_thread(work, abandon)
    except BaseException as interrupt:
        if was_abandoned(interrupt):
            call.abandoned = after.later
        else:
            handle.end(ticket)
        raise
    handle.end(ticket)
    if status & lib.PJRT_SHIM_CALL_ERROR:
        if own.error == _NULL:
            raise MemoryError("out of host memory while preparing the execution")
        raise consume(api, own.error)
    ffi.memmove(struct.outputs, outputs, total_outputs * _POINTER_SIZE)
    if events != _NULL:
        ffi.memmove(struct.complete_events, events, num_devices * _POINTER_SIZE)
    return not status & lib.PJRT_SHIM_CALL_SLOW

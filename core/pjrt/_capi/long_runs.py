"""Programs a plugin runs inside ``execute()``: launched where Ctrl-C can still reach the caller.

XLA's CPU plugin runs a program it judges cheap on the calling thread, inside the execute call
itself; a ``while`` loop it misjudges keeps that call, and the Python thread making it, busy for
as long as the loop runs, deaf to Ctrl-C. Moving every launch to a worker thread would cost each
call a thread hop (tens of microseconds, more than the rest of a small call), so an executable
decides where to launch from what it has seen:

* its **first** call is launched on a worker thread (see `pjrt._capi.waits.call_off_thread`)
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
import time
from typing import Callable

from .._pjrt_cffi import ffi, lib
from ..errors import consume
from .waits import call_off_thread, was_abandoned

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


def free_after(scratch, free: Callable[[], None]) -> None:
    """Run ``free`` now, or when the launch that used ``scratch`` ends if its caller was
    interrupted while the plugin still runs it."""
    after = scratch.abandoned
    if after is None:
        free()
        return
    scratch.abandoned = None
    after(free)


def launch(handle, pointer, scratch, num_devices: int, num_arguments: int, num_outputs: int,
           keep: tuple) -> bool:
    """Run the executable ``pointer`` as `LoadedExecutable._launch` does, on a worker
    thread; the outputs land in ``scratch.outputs``. Returns whether the launch was quick
    enough for the caller's thread.

    Raises:
      KeyboardInterrupt: Ctrl-C while the plugin runs the launch (it goes on; see above).
      MemoryError, XlaRuntimeError: as a launch on the caller's thread.
    """
    api = handle.api
    total_arguments = max(num_devices * num_arguments, 1)
    total_outputs = max(num_devices * num_outputs, 1)
    arguments = ffi.new("PJRT_Buffer*[]", total_arguments)
    ffi.memmove(arguments, scratch.arguments, total_arguments * _POINTER_SIZE)
    outputs = ffi.new("PJRT_Buffer*[]", total_outputs)
    error = ffi.new("PJRT_Error **")
    keep_array = ffi.new("int64_t[]", keep) if keep else _NULL
    after = _AfterLaunch()
    ticket = handle.begin()  # its own: the caller's may end before the launch does

    def work() -> int:
        return lib.pjrt_shim_execute(api.table, pointer, arguments, num_devices, num_arguments,
                                     outputs, num_outputs, keep_array, len(keep), _NULL, _NULL,
                                     error)

    def abandon(status) -> None:
        try:
            if error[0] != _NULL:
                consume(api, error[0])  # destroys the plugin's error; nobody reads it
            elif status == 0:
                made = [outputs[i] for i in range(num_devices * num_outputs)
                        if outputs[i] != _NULL]
                if made:
                    lib.pjrt_shim_buffers_destroy(api.table, ffi.new("PJRT_Buffer*[]", made),
                                                  len(made))
        finally:
            after.finish()
            handle.end(ticket)

    started = time.monotonic()
    try:
        status = call_off_thread(work, abandon)
    except BaseException as interrupt:
        if was_abandoned(interrupt):
            scratch.abandoned = after.later
        else:
            handle.end(ticket)
        raise
    quick = time.monotonic() - started <= INLINE_LIMIT_SECONDS
    handle.end(ticket)
    if status != 0:
        raise MemoryError("out of host memory while preparing the execution")
    if error[0] != _NULL:
        raise consume(api, error[0])
    ffi.memmove(scratch.outputs, outputs, total_outputs * _POINTER_SIZE)
    return quick

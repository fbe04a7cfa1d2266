"""What launches one loaded executable: `Launcher` holds the ``PJRT_LoadedExecutable*`` it
launches, its description (`pjrt._runtime.executable_metadata.ExecutableMetadata`), the native
per-call plans, where launches run, and the call structs of the Python path.

A [`LoadedExecutable`][pjrt.executable.LoadedExecutable] holds one (and its description); its
``execute`` runs ``launcher.plan`` (the native per-call path) and its full paths fill a call
struct from `thread_call` and hand it to `launch`. `pjrt._runtime.global_calls` does the same
for ``execute_global``.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from .._capi import long_runs
from . import memory_headroom
from .._capi.native_runtime import CallPlan
from .._pjrt_cffi import ffi, lib
from .._profiling import recorder
from ..errors import consume
from .launches import Call, LaunchState

if TYPE_CHECKING:
    from .executable_metadata import ExecutableMetadata

_NULL = ffi.NULL
_call_run = lib.pjrt_shim_call_run
_CALL_ERROR = lib.PJRT_SHIM_CALL_ERROR
_CALL_SLOW = lib.PJRT_SHIM_CALL_SLOW
#: A call struct's host-value tables on the Python path, which copies host values itself.
_NO_HOST_VALUES = (_NULL, _NULL, _NULL)


class Launcher:
    """Launches of one loaded executable: the pointer, the per-call plans and the call
    structs, and the address-space check each launch passes."""

    def __init__(self, handle, pointer, metadata: "ExecutableMetadata"):
        self.handle = handle
        #: The ``PJRT_LoadedExecutable*``; NULL once unloaded (`release`).
        self.pointer = pointer
        #: What is launched: the facts a call needs, read once at load.
        self.metadata = metadata
        #: `execute`'s native per-call path (None: every call takes the full one).
        self.plan: CallPlan | None = None
        #: `execute_global`'s, made after its first call (`pjrt._runtime.global_calls`).
        self.global_plan: CallPlan | None = None
        self.global_plan_wanted = False
        #: Where launches run (``inline``) and whether the executable is loaded (``live``):
        #: the plan in use, which keeps both for its own calls, or a `LaunchState`.
        self.state: CallPlan | LaunchState = LaunchState()
        #: Bytes of address space a launch needs per device, from the first launch on.
        self.need: int | None = None
        self._thread_calls = threading.local()

    def use_plan(self, plan: CallPlan, *, global_plan: bool = False) -> None:
        """Launch through ``plan`` from now on (it keeps where launches run)."""
        plan.inline = self.state.inline
        self.state = plan
        if global_plan:
            self.global_plan = plan
        else:
            self.plan = plan
        if self.pointer == _NULL:  # unloaded meanwhile by another thread (see release)
            plan.live = 0

    def release(self) -> None:
        """The executable is being unloaded: a call that starts after this sees it."""
        self.pointer = _NULL
        self.state.live = 0

    @property
    def inline(self) -> bool:
        """Whether the next launch runs on the calling thread (see `pjrt._capi.long_runs`)."""
        return bool(self.state.inline)

    @inline.setter
    def inline(self, value: bool) -> None:
        self.state.inline = 1 if value else 0

    def thread_call(self, count: int, num_devices: int = 1) -> Call:
        """This thread's call struct for a call on the Python path (a fresh one if its own is
        in use, or sized otherwise)."""
        call = getattr(self._thread_calls, "call", None)
        if call is None or call.busy or call.size != (count, num_devices):
            call = Call(self.handle, self.pointer, _NULL, self.metadata.num_outputs, count,
                        _NO_HOST_VALUES, num_devices)
            if getattr(self._thread_calls, "call", None) is None or num_devices == 1:
                self._thread_calls.call = call
        call.busy = True
        return call

    def launch(self, call: Call, keep: tuple, events=_NULL) -> None:
        """Run ``call`` (its arguments placed) through the one launcher, here or on a worker
        thread (see `pjrt._capi.long_runs`); its outputs land in ``call.outputs``, and each
        device's completion event in ``events`` unless that is NULL."""
        started = recorder.now() if recorder.active else 0  # a trace records the launch
        struct = call.call
        struct.complete_events = events
        if self.need is None or self.need >= memory_headroom.CHECKED_FROM_BYTES:
            self.check_headroom(int(struct.num_devices))
        if keep:
            call.keep = ffi.new("int64_t[]", keep)
            struct.non_donatable, struct.num_non_donatable = call.keep, len(keep)
        try:
            if not self.inline:
                self.inline = long_runs.launch(self.handle, call)
                return
            status = _call_run(struct)
            if status & _CALL_SLOW:
                self.inline = False  # ran long on this thread: launch the next off it
            if status & _CALL_ERROR:
                error, struct.error = struct.error, _NULL
                if error == _NULL:
                    raise MemoryError("out of host memory while preparing the execution")
                raise consume(self.handle.api, error)
        finally:
            struct.complete_events = _NULL
            if keep:
                struct.non_donatable, struct.num_non_donatable = _NULL, 0
                call.keep = None
            if started:
                recorder.launched(self.metadata, started, "python")

    def check_headroom(self, num_devices: int) -> None:
        """The address-space check of a launch (`pjrt._runtime.memory_headroom`). The need is
        worked out at the first launch; one of `CHECKED_FROM_BYTES` or more per device leaves
        the per-call paths, so every launch comes here and is checked."""
        need = self.need
        if need is None:
            need = self.need = memory_headroom.launch_need(self.metadata)
            if need >= memory_headroom.CHECKED_FROM_BYTES:
                self.plan = self.global_plan = None
                self.global_plan_wanted = False
        if need >= memory_headroom.CHECKED_FROM_BYTES:
            memory_headroom.check_launch(self.metadata, need, num_devices)

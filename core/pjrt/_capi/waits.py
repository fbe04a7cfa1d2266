"""Waiting on the plugin without making the caller deaf to Ctrl-C.

A C call that blocks until a program finishes would hold off Python's signal handlers until it
returns, so a ``KeyboardInterrupt`` sent during a long ``block_until_ready()`` would arrive
seconds later. Instead, waits here happen in short slices (the plugin's ``OnReady`` callback
wakes a condition variable in the C helpers) with a return to Python between them, where a
pending signal is raised. The plugin's work itself goes on after an interrupted wait; the C
side frees what the abandoned wait leaves behind.

A native call that has no event to wait on (creating a client, compiling, a launch the plugin
runs inline) runs on a worker thread instead (`call_off_thread`), whose stack is large
enough for the plugin's recursive compiler on deeply nested programs, while the caller waits on
it in slices. At interpreter exit, such calls still running are given a moment to end (the exit's
one budget, `EXIT_WAIT_SECONDS`), and the process then ends without the teardown they could
meet (`_guard_exit`); so is other native work that may wait on the plugin, such as freeing a
client (`native_work`). A daemon thread whose call ends after the exit began does not return
from it (`exit_began`), and what the call made is freed for it.
"""
from __future__ import annotations

import atexit
import contextvars
import os
import queue
import threading
import time
from typing import Callable, TypeVar

from .api import Api
from .._pjrt_cffi import ffi, lib
from ..errors import ClosedClientError, consume

_NULL = ffi.NULL

#: How long one slice of a wait lasts: the longest a Ctrl-C waits to be noticed.
WAIT_SLICE_MS = 50

T = TypeVar("T")


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
    if _handler_device.get() is not None:
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
        if _handler_device.get() is not None:
            refuse_waiting_on_the_handlers_device(api, buffers)
        while not lib.pjrt_spmd_group_wait(group, WAIT_SLICE_MS):
            pass
    finally:
        error = lib.pjrt_spmd_group_finish(group)
    if error != _NULL:
        raise consume(api, error)


# -- waits inside custom-call handlers ---------------------------------------------------------

#: The id of the device whose program runs, asynchronously, the Python custom-call handler
#: this thread is in; None outside such handlers (see `handler_running_on_device`).
_handler_device: contextvars.ContextVar[int | None] = contextvars.ContextVar(
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
    return _handler_device.set(device_id)


def handler_finished(token: contextvars.Token) -> None:
    if _handler_device.get() is not None:
        handlers_of_asynchronous_programs.pop()
    _handler_device.reset(token)


def device_of_running_handler() -> int | None:
    """The id of the device whose asynchronous program runs the handler this thread is in
    (see `handler_running_on_device`); None outside such handlers."""
    return _handler_device.get()


def refuse_waiting_on_the_handlers_device(api: Api, buffers) -> None:
    """Raise RuntimeError if one of ``buffers`` (not computed yet) is on the device whose
    program runs the custom-call handler this thread is in (see `handler_running_on_device`)."""
    device_id = _handler_device.get()
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


def _drop(api: Api, error) -> None:
    if error != _NULL:
        consume(api, error)


#: Each thread's out-parameters for `wait_buffer_ready` (allocating them per call
#: would cost more than a wait on a ready value).
_outs = threading.local()


#: Stack of the worker threads. XLA's compiler recurses once per nested region of a program,
#: 3 to 5 KiB a level: 800 nested conditionals overflow 2 MiB and compile in 4 MiB, 1600 in
#: 8 MiB (and take 15 to 20 s to compile on both CPU builds; the time grows faster than the
#: depth). 64 MiB leaves room for programs far deeper than any that compiles in reasonable
#: time. Only the pages a compile touches are backed by memory, but the whole stack counts
#: against the process's address-space limit (``ulimit -v``), so it is no larger.
COMPILE_STACK_BYTES = 64 << 20


class _Worker:
    """One thread with a large stack that runs submitted functions in order."""

    def __init__(self, name: str, stack_bytes: int):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        #: Queue a function to run. The queue's own (C) ``put``, not a Python method: Python
        #: raises a pending KeyboardInterrupt only between bytecodes, so with no Python frame
        #: of its own a submission is either not begun or complete when one arrives.
        self.submit: Callable[[Callable[[], None]], None] = self._jobs.put
        previous = threading.stack_size()
        try:
            threading.stack_size(stack_bytes)
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()
        finally:
            threading.stack_size(previous)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            job()


_workers: list[_Worker] = []
_workers_lock = threading.Lock()
_idle_workers: list[_Worker] = []


def _take_worker() -> _Worker:
    with _workers_lock:
        if _idle_workers:
            return _idle_workers.pop()
        worker = _Worker(f"pjrt-compile-{len(_workers)}", COMPILE_STACK_BYTES)
        _workers.append(worker)
        return worker


def _return_worker(worker: _Worker) -> None:
    with _workers_lock:
        _idle_workers.append(worker)


def _forget_workers_after_fork() -> None:
    # Threads do not survive fork(): the child's copies of the workers would never run a job.
    global _workers_lock, _in_flight, _in_flight_lock, _idle
    _workers.clear()
    _idle_workers.clear()
    _workers_lock = threading.Lock()
    _in_flight = 0
    _in_flight_lock = threading.RLock()
    _idle = threading.Condition(_in_flight_lock)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers_after_fork)


def run_on_compile_thread(handle, ticket: int, work: Callable[[], T],
                          abandon: Callable[[T], None]) -> T:
    """Run ``work()`` on a large-stack thread and return its result; the caller waits so that
    Ctrl-C interrupts the caller, not the work.

    ``ticket`` is the caller's running call on ``handle`` (a
    `ClientHandle`), which keeps the client alive for the work. When this
    returns, the caller still holds the ticket (to wrap the result before ending it); when it
    raises, the ticket has been taken care of: ended, or, if the caller was interrupted while
    the work goes on, ended by the worker after ``abandon(result)`` has freed whatever
    ``work`` returned (an exception ``work`` raises is then dropped).
    """
    def abandoned(value) -> None:
        try:
            if value is not None:
                abandon(value)
        finally:
            handle.end(ticket)

    try:
        return call_off_thread(work, abandoned)
    except BaseException as error:
        if not was_abandoned(error):
            handle.end(ticket)
        raise


#: Native work the exit guard waits for: calls running on worker threads (interrupted ones
#: included) and the freeing of a client's objects on any thread (see `NativeWork`).
_in_flight = 0
# Re-entrant: the count may change again on the same thread while it holds the lock, when the
# collector runs an Array's finaliser there (an allocation in ``notify_all``) and that
# finaliser frees a client's objects (`native_work`).
_in_flight_lock = threading.RLock()
_idle = threading.Condition(_in_flight_lock)


def _count_in_flight(change: int) -> None:
    global _in_flight
    with _in_flight_lock:
        _in_flight += change
        if _in_flight == 0:
            _idle.notify_all()


class NativeWork:
    """``with native_work:`` counts the plugin calls made inside as in flight, so that the
    exit guard (`_guard_exit`) waits for them and, if they outlast its budget, ends the process
    without the plugins' teardown.

    For calls made with the GIL released on a thread the exit does not wait for: freeing a
    client's objects (and the client) may wait for the plugin's running programs, and may be
    done by whichever thread ends the last call of a closed client, a daemon thread included.
    Counted from before the work is visible to others (a client whose pointer is already NULL
    is still being freed while the count is up). Re-entrant: it is a count.
    """

    __slots__ = ()

    def __enter__(self) -> None:
        _count_in_flight(1)

    def __exit__(self, *exc_info) -> None:
        _count_in_flight(-1)


native_work = NativeWork()


def calls_in_flight() -> int:
    """How many native calls (of `call_off_thread`, or inside `native_work`) are running."""
    return _in_flight


def wait_until_idle(seconds: float) -> bool:
    """Wait up to ``seconds`` for all native work in flight to end; whether it did."""
    with _idle:
        return _idle.wait_for(lambda: _in_flight == 0, timeout=seconds)


def call_off_thread(work: Callable[[], T], abandon: Callable[[T | None], None] | None = None,
                    *, wait: Callable[[threading.Event], None] | None = None) -> T:
    """Run the native call ``work()`` on a large-stack worker thread and return what it returns
    (or raise what it raises); the caller waits in slices, so Ctrl-C reaches it.

    If the wait is left by an exception (a ``KeyboardInterrupt``, or one ``wait`` raises),
    that exception goes on up at once (`was_abandoned` says so of it) and
    ``abandon(result)`` (``result`` is None when the work raised) frees what the work produced:
    at once if it has just ended, else on the worker as soon as it ends, never under the
    running call. ``wait(done)``, when given, replaces the plain sliced wait for the event
    ``done`` (to bound it in time, or to report progress).
    """
    worker = _take_worker()
    done = threading.Event()
    outcome: dict = {}
    lock = threading.Lock()
    # The work sees the caller's context variables (how deep in custom-call handlers it is).
    context = contextvars.copy_context()
    # A daemon thread that finds the exit begun when its call returns never takes the result
    # (it is held, see `exit_began`): the result is then freed as an interrupted wait's is,
    # which ends the call's ticket, so the exit need not wait for a caller that never returns.
    daemon_caller = threading.current_thread().daemon
    _count_in_flight(1)

    def job() -> None:
        try:
            outcome["value"] = context.run(work)
        except BaseException as error:  # noqa: BLE001 - handed to the waiting caller
            outcome["error"] = error
        finally:
            with lock:
                if _exiting and daemon_caller:
                    outcome["abandoned"] = True
                abandoned = outcome.get("abandoned", False)
                done.set()
            if abandoned:
                _abandon(outcome, abandon)
            _count_in_flight(-1)
            _return_worker(worker)

    try:
        # Inside the try: a Ctrl-C that arrives as the job is queued is raised after the
        # queue's put returns, here, so the job is marked abandoned instead of running on
        # after its caller has gone (and ended the ticket the job's handles depend on).
        worker.submit(job)
        if wait is not None:
            wait(done)
        else:
            while not done.wait(WAIT_SLICE_MS / 1000):
                pass
    except BaseException as error:
        with lock:
            finished = done.is_set()
            outcome["abandoned"] = not finished
        _tag_abandoned(error)
        if finished:  # the result came with the signal: free it here
            _abandon(outcome, abandon)
        if _exiting and threading.current_thread().daemon:
            _hold_daemon_at_exit()  # (a daemon thread gets no signals: the exit woke it)
        raise
    if _exiting and daemon_caller:
        with lock:  # the worker has decided by now (before ``done``): free it unless it did
            freed_by_worker = outcome.get("abandoned", False)
            outcome["abandoned"] = True
        if not freed_by_worker:
            _abandon(outcome, abandon)
        _hold_daemon_at_exit()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


# -- daemon threads at exit ---------------------------------------------------------------------

#: Set once the interpreter's exit has begun (see `exit_began`).
_exiting = False
#: When the exit's waits end (``time.monotonic()``), set by `exit_began`.
_exit_deadline = 0.0

#: Seconds the interpreter's exit waits, in all, for pjrt's work still in flight to end:
#: native calls on worker threads (a compile or launch whose caller was interrupted, or a
#: daemon thread's), calls other threads are making, and programs and transfers the plugins
#: are still computing. One budget for all of them, counted from the first exit hook.
EXIT_WAIT_SECONDS = 5.0


def exit_began() -> None:
    """Note that the interpreter is exiting (called by the first of pjrt's exit hooks), and
    start the exit's time budget (`EXIT_WAIT_SECONDS`, see `exit_time_left`).

    From then on, a daemon thread whose native call ends (a compile the exit waited for, say) is
    held in that call until the process ends, instead of going back to its Python code. There
    it would meet a closed client, raise, and print the traceback while the interpreter
    finalises, and CPython aborts the process when the main thread then finds the thread holding
    stderr's lock ("_enter_buffered_busy"). CPython itself stops daemon threads that run on into
    finalisation; this stops them a little earlier, at a point where they hold nothing.

    A daemon thread that calls into pjrt only after the exit has closed the clients gets
    `ClosedClientError`; if nothing catches it, the thread is held the same way instead of
    printing it (see `_hold_daemons_closed_out`).
    """
    global _exiting, _exit_deadline
    if not _exiting:
        _exit_deadline = time.monotonic() + EXIT_WAIT_SECONDS
        threading.excepthook = _hold_daemons_closed_out(threading.excepthook)
    _exiting = True


def _hold_daemons_closed_out(previous: Callable) -> Callable:
    """``threading.excepthook`` for the exit: a daemon thread ended by `ClosedClientError`
    (its call came after the exit closed the client) is held where it stands, holding nothing,
    rather than printing its traceback while the interpreter finalises (the abort described in
    `exit_began`). Any other exception, or any thread the exit waits for, goes to ``previous``.
    """
    def excepthook(args) -> None:
        thread = args.thread
        if thread is not None and thread.daemon and isinstance(args.exc_value,
                                                               ClosedClientError):
            _hold_daemon_at_exit()
        previous(args)

    return excepthook


def exit_time_left() -> float:
    """Seconds left of the exit's budget for waiting on work in flight (0 once spent)."""
    return max(0.0, _exit_deadline - time.monotonic())


def _hold_daemon_at_exit() -> None:
    while True:
        threading.Event().wait(3600)


def _tag_abandoned(error: BaseException) -> None:
    try:
        error.__pjrt_abandoned__ = True  # pyright: ignore[reportAttributeAccessIssue]
    except AttributeError:  # an exception type with __slots__: the caller cannot tell
        pass


def was_abandoned(error: BaseException) -> bool:
    """Whether ``error`` left `call_off_thread`'s wait, so that its ``abandon``
    callback, not the caller, disposes of the call's result."""
    return getattr(error, "__pjrt_abandoned__", False)


def _abandon(outcome: dict, abandon: Callable | None) -> None:
    if abandon is None:
        return
    try:
        with native_work:  # freeing may be a plugin call the exit must not run over
            abandon(outcome.get("value"))
    except Exception:  # noqa: BLE001 - nobody is waiting for this result
        pass


# -- exit never meets work in flight ----------------------------------------------------------

@atexit.register
def _guard_exit() -> None:
    """At interpreter exit, wait (within the exit's budget) for native calls still running on
    worker threads; if some still are, end the process without the C library's exit handlers.

    Registered before the clients' exit hook (`pjrt._capi.handles.close_all_at_exit`), so it
    runs after it and shares what is left of its budget.
    """
    exit_began()
    if _in_flight == 0:
        return
    if wait_until_idle(exit_time_left()):
        return
    skip_native_teardown_at_exit()


def skip_native_teardown_at_exit() -> bool:
    """Make the process end, once Python has finalised, through ``_exit`` with the exit status
    it was going to have, skipping the C library's exit handlers and the libraries' static
    destructors; whether that could be arranged (it needs glibc's ``on_exit``).

    Those destructors (LLVM's, oneDNN's JIT kernels) tear down state that a plugin thread still
    running a compile or a program uses: a crash at exit. The C helper registers the handler
    again at the very end of Python's finalisation, after any destructor a running plugin
    thread registers meanwhile, so that it runs before them. Python's own buffers have been
    flushed by then.
    """
    return lib.pjrt_shim_skip_teardown_at_exit() == 0

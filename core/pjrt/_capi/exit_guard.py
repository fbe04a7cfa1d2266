"""The interpreter's exit never meets pjrt's native work in flight.

Native calls running on worker threads (`pjrt._capi.off_thread`) and the freeing of a client's
objects on any thread (`native_work`) are counted while they run. At interpreter exit, such work
still running is given a moment to end (the exit's one budget, `EXIT_WAIT_SECONDS`), and the
process then ends without the teardown it could meet (`_guard_exit`). A daemon thread whose
call ends after the exit began does not return from it (`exit_began`), and what the call made
is freed for it.
"""
from __future__ import annotations

import atexit
import os
import threading
import time
from typing import Callable

from .._pjrt_cffi import lib
from ..errors import ClosedClientError

#: Native work the exit guard waits for: calls running on worker threads (interrupted ones
#: included) and the freeing of a client's objects on any thread (see `NativeWork`).
_in_flight = 0
# Re-entrant: the count may change again on the same thread while it holds the lock, when the
# collector runs an Array's finaliser there (an allocation in ``notify_all``) and that
# finaliser frees a client's objects (`native_work`).
_in_flight_lock = threading.RLock()
_idle = threading.Condition(_in_flight_lock)


def count_in_flight(change: int) -> None:
    """Add ``change`` to the native work in flight (see `calls_in_flight`)."""
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
        count_in_flight(1)

    def __exit__(self, *exc_info) -> None:
        count_in_flight(-1)


native_work = NativeWork()


def calls_in_flight() -> int:
    """How many native calls (of `call_off_thread`, or inside `native_work`) are running."""
    return _in_flight


def wait_until_idle(seconds: float) -> bool:
    """Wait up to ``seconds`` for all native work in flight to end; whether it did."""
    with _idle:
        return _idle.wait_for(lambda: _in_flight == 0, timeout=seconds)


def _forget_work_after_fork() -> None:
    # Threads do not survive fork(): the child's count starts again from nothing.
    global _in_flight, _in_flight_lock, _idle
    _in_flight = 0
    _in_flight_lock = threading.RLock()
    _idle = threading.Condition(_in_flight_lock)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_work_after_fork)


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
            hold_daemon_at_exit()
        previous(args)

    return excepthook


def exiting() -> bool:
    """Whether the interpreter's exit has begun (see `exit_began`)."""
    return _exiting


def exit_time_left() -> float:
    """Seconds left of the exit's budget for waiting on work in flight (0 once spent)."""
    return max(0.0, _exit_deadline - time.monotonic())


def hold_daemon_at_exit() -> None:
    """Hold this (daemon) thread, holding nothing, until the process ends."""
    while True:
        threading.Event().wait(3600)


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

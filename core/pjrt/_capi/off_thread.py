"""Native calls with no event to wait on, run where Ctrl-C still reaches the caller.

Creating a client, compiling, a launch the plugin runs inline: such a call runs on a worker
thread (`call_off_thread`), whose stack is large enough for the plugin's recursive compiler on
deeply nested programs, while the caller waits in slices (`pjrt._capi.waits.WAIT_SLICE_MS`).
A caller interrupted meanwhile goes on at once, and what the call made is freed when it ends.
Each such call counts as native work in flight, which the exit waits for
(`pjrt._capi.exit_guard`).
"""
from __future__ import annotations

import contextvars
import os
import queue
import threading
from typing import Callable, TypeVar

from . import exit_guard
from .exit_guard import count_in_flight, hold_daemon_at_exit, native_work
from .waits import WAIT_SLICE_MS

T = TypeVar("T")


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
    global _workers_lock
    _workers.clear()
    _idle_workers.clear()
    _workers_lock = threading.Lock()


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
    count_in_flight(1)

    def job() -> None:
        try:
            outcome["value"] = context.run(work)
        except BaseException as error:  # noqa: BLE001 - handed to the waiting caller
            outcome["error"] = error
        finally:
            with lock:
                if exit_guard.exiting() and daemon_caller:
                    outcome["abandoned"] = True
                abandoned = outcome.get("abandoned", False)
                done.set()
            if abandoned:
                _abandon(outcome, abandon)
            count_in_flight(-1)
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
        if exit_guard.exiting() and threading.current_thread().daemon:
            hold_daemon_at_exit()  # (a daemon thread gets no signals: the exit woke it)
        raise
    if exit_guard.exiting() and daemon_caller:
        with lock:  # the worker has decided by now (before ``done``): free it unless it did
            freed_by_worker = outcome.get("abandoned", False)
            outcome["abandoned"] = True
        if not freed_by_worker:
            _abandon(outcome, abandon)
        hold_daemon_at_exit()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


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

"""Bringing a backend up within a time limit, and saying so when it is slow.

A plugin may take minutes to make its first client (libtpu off Google Cloud asks a metadata
server that is not there, over and over) or may never answer. The registry therefore runs each
backend's factory on a worker thread (see `pjrt._capi.off_thread.call_off_thread`) and waits for it
in slices:

* after `SLOW_NOTICE_SECONDS` a line on stderr names the backend, what it is doing and
  how to skip it;
* after the time limit (``PJRT_BACKEND_INIT_TIMEOUT``, default `DEFAULT_INIT_TIMEOUT`
  seconds) the wait gives up with `BackendStartupTimeout`, which the registry records
  as the backend's reason, and the other backends come up;
* Ctrl-C ends the wait at once with ``KeyboardInterrupt``.

The native call cannot be stopped: it goes on in the background. A client that arrives after
its caller gave up is closed on the worker thread as soon as it arrives; nothing else ever sees
it. Code on the bring-up path reports what it is doing through `stage_reporter`, so the message
says where the time went.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Callable, ContextManager, TypeVar

from .._capi.off_thread import call_off_thread
from .._capi.waits import WAIT_SLICE_MS

T = TypeVar("T")

#: Seconds a backend may take to come up before it is given up; ``0`` waits for ever.
INIT_TIMEOUT_ENV = "PJRT_BACKEND_INIT_TIMEOUT"
DEFAULT_INIT_TIMEOUT = 30.0

#: Seconds after which a backend still coming up says so on stderr.
SLOW_NOTICE_SECONDS = 5.0


class BackendStartupTimeout(TimeoutError):
    """A backend did not come up within its time limit; the message says what it was doing."""


def init_timeout(environ=None) -> float | None:
    """The bring-up time limit in seconds from ``PJRT_BACKEND_INIT_TIMEOUT`` (None: no limit).

    Raises:
      ValueError: the variable is not a number of seconds (0 or more).
    """
    raw = (environ if environ is not None else os.environ).get(INIT_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_INIT_TIMEOUT
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:  # also refuses NaN
        raise ValueError(f"{INIT_TIMEOUT_ENV}={raw!r} is not a number of seconds; set it to "
                         f"how long a backend may take to come up (e.g. 120), or 0 for no limit")
    return None if seconds == 0 or seconds == float("inf") else seconds


class _Progress:
    __slots__ = ("stage",)

    def __init__(self):
        self.stage = "calling its factory"


_current = threading.local()


def stage_reporter() -> Callable[[str], None]:
    """A function that records what the backend being brought up on this thread is doing
    now (e.g. "creating its client (PJRT_Client_Create)"), callable from any thread the
    bring-up hands work to; it does nothing outside a bring-up."""
    progress = getattr(_current, "progress", None)
    if progress is None:
        return _ignore

    def report(stage: str) -> None:
        progress.stage = stage
    return report


def _ignore(stage: str) -> None:
    pass


def bring_up(name: str, factory: Callable[[], T], *, timeout: float | None,
             close: Callable[[T], None],
             keep_output: Callable[[], ContextManager] = contextlib.nullcontext) -> T:
    """``factory()`` run on a worker thread, waited for at most ``timeout`` seconds.

    ``keep_output()`` is entered around the wait (the registry keeps a quiet plugin's stderr
    there); the slow notice goes to the stderr that was in place before it.

    Raises:
      BackendStartupTimeout: the factory has not returned after ``timeout`` seconds. It goes
        on in the background; ``close(result)`` disposes of a late result.
      KeyboardInterrupt: Ctrl-C during the wait (the factory goes on, as above).
      Exception: whatever the factory raised.
    """
    progress = _Progress()

    def work():
        _current.progress = progress
        try:
            return factory()
        finally:
            _current.progress = None

    def dispose(result) -> None:
        if result is not None:
            close(result)

    notices = _notice_stream()
    started = time.monotonic()

    def wait(done: threading.Event) -> None:
        noticed = False
        while not done.wait(WAIT_SLICE_MS / 1000):
            elapsed = time.monotonic() - started
            if not noticed and elapsed >= SLOW_NOTICE_SECONDS:
                noticed = True
                _say(notices, _slow_notice(name, progress.stage, elapsed, timeout))
            if timeout is not None and elapsed >= timeout:
                raise BackendStartupTimeout(
                    f"backend {name!r} did not come up within {timeout:g} s (it was "
                    f"{progress.stage}); it was left running in the background and its client "
                    f"is dropped if it arrives. Set {INIT_TIMEOUT_ENV} to a longer time in "
                    f"seconds (0: no limit) to wait for it, or PJRT_PLATFORMS to the platforms "
                    f"you want to leave it out")

    try:
        with keep_output():
            return call_off_thread(work, dispose, wait=wait)
    finally:
        if notices is not None:
            notices.close()


def _slow_notice(name: str, stage: str, elapsed: float, timeout: float | None) -> str:
    limit = (f"it is given up after {timeout:g} s ({INIT_TIMEOUT_ENV})" if timeout is not None
             else f"{INIT_TIMEOUT_ENV}=0: no time limit")
    return (f"pjrt: backend {name!r} is still coming up after {elapsed:.0f} s ({stage}); "
            f"{limit}. To skip it, set PJRT_PLATFORMS to the platforms you want (e.g. "
            f"PJRT_PLATFORMS=cpu); Ctrl-C stops waiting.\n")


def _notice_stream():
    """A copy of the current stderr descriptor, so that the notice reaches the terminal even
    while a plugin's own output is being kept back (which redirects descriptor 2)."""
    try:
        return os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    except OSError:  # no stderr at all
        return None


def _say(stream, text: str) -> None:
    if stream is None:
        return
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):
        pass

"""Worker processes end with the process that started them.

pjrt starts helper processes in sessions of their own (a plugin that crashes or hangs there
must not take its parent along): `pjrt conform`'s check workers and the crash-isolated
compile worker. A parent that is killed (SIGKILL, an OOM kill) runs no clean-up, and a worker
busy in a plugin call (a hung check, a long compile) would then run on as an orphan of init,
unnoticed. `end_with_parent` makes the worker end within about a second of its parent:

* on Linux, when the thread that started the worker lives as long as the worker is wanted
  (``thread_bound``), the kernel sends SIGKILL at the parent's death
  (``prctl(PR_SET_PDEATHSIG)``); that also ends a stopped worker;
* everywhere, a daemon thread compares ``os.getppid()`` with the parent's pid every
  `POLL_SECONDS` (a process whose parent died is handed to init, or to a subreaper) and
  ends the process with SIGKILL when they differ.

A parent already gone when the worker calls this (it died during the worker's start-up) is
caught by the same comparison, made once more after the kernel's signal is armed.
"""
from __future__ import annotations

import os
import signal
import threading
import time

from .._capi.python_api import set_parent_death_signal

#: How often the watch thread looks at the parent (seconds).
POLL_SECONDS = 0.5


def end_with_parent(parent: int, *, thread_bound: bool = False) -> None:
    """End this process (SIGKILL, no clean-up) when the process ``parent`` ends.

    ``thread_bound``: the parent's thread that started this process lives until it has
    ended this process, so the kernel's parent-death signal (which follows that thread, not
    the whole process) may be used as well.
    """
    if thread_bound:
        _arm_death_signal()
    _end_if_orphaned(parent)  # after arming: a parent dying in between is seen either way
    watch = threading.Thread(target=_watch, args=(parent,), name="pjrt-parent-watch",
                             daemon=True)
    watch.start()


def _arm_death_signal() -> bool:
    return set_parent_death_signal(int(signal.SIGKILL))


def _end_if_orphaned(parent: int) -> None:
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def _watch(parent: int) -> None:
    while True:
        time.sleep(POLL_SECONDS)
        _end_if_orphaned(parent)

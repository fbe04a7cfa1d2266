"""Who owns each C handle of a client, and when it may be freed.

One `ClientHandle` per ``PJRT_Client*`` owns the client and every buffer and executable
made through it. The rules it keeps:

* **Freed exactly once.** Each buffer list and executable is registered under its owner's id;
  whoever takes the entry out of the registry (``dict.pop`` is atomic) is the one that frees it.
* **Never freed under a running call.** Every native call on the client's objects runs in a
  ``with handle.calling():`` block (`ClientHandle.calling`), which numbers it with a ticket. A
  handle released while calls are running is parked with the next ticket number and freed once
  every call older than it has ended, so a ``delete()`` in one thread never frees a buffer
  another thread is passing to the plugin. ``close()`` only marks the client closed: later calls
  raise [`ClosedClientError`][pjrt.errors.ClosedClientError] before touching a pointer, and the last running call frees
  everything on its way out.
* **Never freed under a numpy view.** A buffer that numpy reads without a copy stays until the
  last such view goes; the client is freed after it.
* **Never freed in a forked child or under a thread at exit.** After ``fork()`` the child's copy
  of every client is marked unusable and is never freed (the plugin's threads did not survive
  the fork, so freeing would hang or crash); at interpreter exit, clients are freed only when no
  call is running, and leaked otherwise.

The bookkeeping on the hot path is a ticket from ``itertools.count`` and one dict insertion and
deletion (each atomic under the GIL), done by `HandleCore` in C (see
`pjrt._capi.native_runtime`): the one implementation of the tickets and of the release of buffers, for Python and C callers
alike. The lock is taken only to free things.
"""
from __future__ import annotations

import atexit
import enum
import itertools
import os
import threading
import weakref
from typing import Callable

from .api import Api
from .._pjrt_cffi import ffi, lib
from ..errors import ClosedClientError, check
from .native_runtime import HandleCore
from .python_api import keep_forever
from .exit_guard import exit_began, exit_time_left, native_work, skip_native_teardown_at_exit

_NULL = ffi.NULL
_destroy_buffer = lib.pjrt_shim_buffer_destroy
_destroy_buffers = lib.pjrt_shim_buffers_destroy

#: Incremented in a child process after ``fork()``; a handle made in another generation
#: belongs to the parent.
_fork_generation = 0

#: Every handle not yet freed, so that a fork or the end of the interpreter can reach them.
_live_handles: "weakref.WeakSet[ClientHandle]" = weakref.WeakSet()


class HostBufferSemantics(enum.IntEnum):
    """How long the plugin may read the host memory handed to ``buffer_from_pyval``.

    Defined here, beside the holds on host memory it decides, so that transfers and clients
    both take it from below. Plain ints (PJRT's values) are accepted wherever it is.
    """

    #: The plugin copies the data before the call returns.
    IMMUTABLE_ONLY_DURING_CALL = 0
    #: The call returns once the plugin has finished reading the host data.
    IMMUTABLE_UNTIL_TRANSFER_COMPLETES = 1
    #: The device buffer may alias the host memory; the array keeps it alive.
    ZERO_COPY = 2


#: Called with each block of host memory a plugin has finished reading (see
#: `ClientHandle.hold_host_memory`); the transfer layer sets it to recycle its staging.
host_memory_released: Callable[[object], None] | None = None


def fork_generation() -> int:
    """How many ``fork()`` calls separate this process from the one that loaded pjrt."""
    return _fork_generation


class ClientHandle(HandleCore):
    """Owns one ``PJRT_Client*`` and every buffer and executable made through it.

    Attributes:
      api: the plugin's `Api`.
      table: its ``PJRT_Api*`` (``api.table``).
      pointer: the ``PJRT_Client*`` (NULL once freed).
      closed: set by `close`, by a fork, or at exit; calls then raise.
      buffers: owner id -> the ``PJRT_Buffer*`` list it owns (one per device).
      executables: owner id -> ``(PJRT_LoadedExecutable*, PJRT_Executable*)``.
    """

    # The fields are HandleCore's (pjrt._capi.native_runtime), where C reads them when an
    # Array is freed; they behave as slots.
    __slots__ = ("__weakref__",)

    def __init__(self, api: Api, pointer):
        self.api = api
        #: ``api.table``, read on every buffer freed
        self.table = api.table
        self._table_address = int(ffi.cast("uintptr_t", api.table))
        self.pointer = pointer
        self.closed = False
        #: What a call on a closed client is told.
        self.closed_reason = "the client has been closed; make a new client"
        self.buffers: dict[int, list] = {}
        self.executables: dict[int, tuple] = {}
        #: owner id -> weak references to the objects numpy views of its buffers keep alive
        self.viewed: dict[int, list] = {}
        #: owner id -> the owner, while the buffer protocol exports its memory (a
        #: ``np.asarray`` or ``memoryview`` of it is alive: see ``_native/host_views.c``)
        self.buffer_exports: dict[int, object] = {}
        #: owners whose buffers go when their last numpy view does
        self.released_while_viewed: set[int] = set()
        #: owner id -> [(host array, PJRT_Event* or NULL)] its buffers may be reading
        self.holds: dict[int, list] = {}
        #: host memory of freed buffers whose plugin event has not fired yet
        self.pending_holds: list = []
        #: tickets of the calls running now, oldest first (a dict keeps insertion order)
        self.active: dict[int, None] = {}
        self.tickets = itertools.count()
        #: (ticket, kind, payload): released handles waiting for older calls to end
        self.parked: list = []
        self.generation = _fork_generation
        #: What the plugin may call back into while the client lives (key-value callbacks).
        self.keep_alive: object = None
        self._lock = threading.Lock()
        _live_handles.add(self)

    # -- calls -----------------------------------------------------------------------------

    # The call tickets and the release of buffers are HandleCore's (pjrt._capi.native_runtime), the
    # one implementation of both rules, which the per-call path in C uses too:
    # ``take_ticket()`` registers a running call, ``end(ticket)`` ends it (and settles what
    # waited for it), ``release_buffers(owner_id)`` frees an owner's buffers at once when no
    # other call is running and the client is open, and parks them otherwise.

    def begin(self) -> int:
        """Start a native call on this client; returns its ticket for ``end``. For a ticket
        handed to a worker thread, which may end it after the caller has gone; a call that
        ends where it began is bracketed by `calling`.

        Raises:
          ClosedClientError: the client is closed (or belongs to the parent of a fork).
        """
        ticket = self.take_ticket()
        if self.closed:
            self.end(ticket)
            raise ClosedClientError(self.closed_reason)
        return ticket

    def calling(self, closed_ok: bool = False) -> "_Call":
        """``with handle.calling():``, the one way a native call on this client is bracketed:
        checks that the client is open (`ClosedClientError` otherwise, before any pointer is
        read) and counts the call in flight until the block ends, so nothing it reads is
        freed under it.

        ``closed_ok=True`` skips the check, for a block that runs on a closed client (closing
        it) or words a closed client's error itself (an Array's reads and waits, in jaxlib's
        words). `begin`/`end` are left for a ticket that outlives the block: one handed to a
        worker thread, which ends it when an abandoned launch or compile finishes.
        """
        return _Call(self, closed_ok)

    # -- releasing -------------------------------------------------------------------------

    def release_executable(self, owner_id: int) -> None:
        """Like `release_buffers`, for the executable of ``owner_id``."""
        pointers = self.executables.pop(owner_id, None)
        if pointers is not None:
            self._park("executable", pointers)

    def _park(self, kind: str, payload) -> None:
        self.parked.append((next(self.tickets), kind, payload))
        self.settle()

    def close(self, reason: str | None = None) -> None:
        """Mark the client closed and free everything as soon as no call is running."""
        if reason is not None and not self.closed:
            self.closed_reason = reason
        self.closed = True
        self.settle()

    def settle(self) -> None:
        """Free what no running call can be using any more; frees the client once it is
        closed, idle and owns nothing numpy still reads.

        Never blocks: if another thread (or a finaliser interrupting this one) is freeing,
        that one sees the new work before it lets go.
        """
        while self._lock.acquire(blocking=False):
            try:
                # Counted as native work in flight: the exit must not run the plugins'
                # teardown while this thread frees the client (which waits for its programs).
                with native_work:
                    self._settle_locked()
            finally:
                self._lock.release()
            if not self._has_freeable():
                return

    def _has_freeable(self) -> bool:
        if self.generation != _fork_generation or self.pointer == _NULL:
            return False
        oldest = _oldest(self.active)
        if any(oldest is None or entry[0] < oldest for entry in self.parked):
            return True
        if not self.closed or oldest is not None:
            return False
        # Buffers numpy still reads wait for their views; anything else can go now. The keys
        # are copied in one step: other threads add arrays while this looks at views.
        return bool(self.executables) or any(not self._is_viewed(o) for o in list(self.buffers))

    def _settle_locked(self) -> None:
        if self.generation != _fork_generation or self.pointer == _NULL:
            return  # the parent's client, or already freed: nothing may be called
        # ``oldest`` is read after ``limit`` is taken, so it covers every running call older
        # than an entry parked before ``limit``; entries parked later wait for the next round
        # (settle() loops), since a call may have begun after ``oldest`` was read.
        limit = next(self.tickets)
        oldest = _oldest(self.active)
        if self.parked:
            # Removed one by one from the same list: other threads append to it without the
            # lock, and an append to a list replaced meanwhile would be lost.
            for entry in [e for e in self.parked
                          if e[0] < limit and (oldest is None or e[0] < oldest)]:
                self.parked.remove(entry)
                self._free(entry[1], entry[2])
        # Freeing the entries above released the GIL and may have run Python code (a DLPack
        # producer's deleter, a view's callback): calls may have begun and the client may
        # have been closed meanwhile, so ``oldest`` is read again. ``closed`` is read first:
        # a call that begins after both reads sees it and raises before touching a pointer.
        if self.closed and _oldest(self.active) is None:
            self._tear_down()

    def _free(self, kind: str, payload) -> None:
        try:
            if kind == "buffers":
                buffers, holds = payload
                if len(buffers) == 1:
                    _destroy_buffer(self.api.table, buffers[0])
                else:
                    _destroy_buffers(self.api.table, ffi.new("PJRT_Buffer*[]", buffers),
                                     len(buffers))
                if holds or self.pending_holds:
                    self._let_go_of_host_memory(holds or ())
            else:
                _destroy_executable(self.api, *payload)
        except Exception:  # noqa: BLE001 - a plugin's error on destroy has no caller to reach
            pass

    def _tear_down(self) -> None:
        for owner_id in list(self.executables):
            pointers = self.executables.pop(owner_id, None)
            if pointers is not None:
                self._free("executable", pointers)
        for owner_id in list(self.buffers):
            if self._is_viewed(owner_id):
                continue  # freed when its last numpy view goes
            buffers = self.buffers.pop(owner_id, None)
            if buffers is not None:
                self.viewed.pop(owner_id, None)
                self._free("buffers", (buffers, self.holds.pop(owner_id, None)))
        # Freeing the above ran plugin code without the GIL: look again at what is left.
        if self.buffers or self.parked or _oldest(self.active) is not None:
            return
        pointer, self.pointer = self.pointer, _NULL
        if pointer == _NULL:
            return
        _live_handles.discard(self)
        # Every buffer is gone, so each event fires once the programs reading it are done.
        self._let_go_of_host_memory((), wait=True)
        try:
            self._destroy_pointer(pointer)
        except Exception:  # noqa: BLE001 - nothing to report a failed destroy to
            pass

    def _destroy_pointer(self, pointer) -> None:
        args = self.api.new_args("PJRT_Client_Destroy_Args")
        args.client = pointer
        check(self.api, self.api.table.PJRT_Client_Destroy(args))

    def wait_while_computing(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for every program and transfer still producing a buffer
        owned here, and for the plugin to finish reading the host memory of freed buffers;
        whether all of it has ended (True for a freed client or a parent's, whose work is not
        this process's to wait for).

        Buffers already freed need no wait here: destroying the client waits for the work
        still writing them.
        """
        import time

        deadline = time.monotonic() + seconds
        api = self.api
        owned = []  # ready events made here, destroyed here
        # The events are asked for under the lock, so no other thread is freeing the client's
        # objects meanwhile (a daemon thread that ended the last call of the closed client,
        # at exit, frees them under it), and under a ticket of this wait's own, so that a
        # buffer released by another thread meanwhile is parked, not freed under the question.
        if not self._lock.acquire(timeout=seconds):
            return False  # another thread is still freeing them
        try:
            if self.pointer == _NULL or self.generation != _fork_generation:
                return True
            ticket = self.take_ticket()
            try:
                for buffers in list(self.buffers.values()):
                    for buffer in buffers:
                        owned.append(api.call_new("PJRT_Buffer_ReadyEvent", buffer=buffer).event)
            except Exception:  # noqa: BLE001 - when in doubt at exit, leave the client alone
                self._destroy_events(owned)
                return False
            finally:
                # Ended without `end`, which would settle: what it parked is freed by the
                # caller's settle, once the events asked for here are no longer needed.
                del self.active[ticket]
        finally:
            self._lock.release()
        try:
            unfinished = owned
            while True:
                unfinished = [event for event in unfinished if not _event_is_ready(api, event)]
                reading = self._host_memory_in_use(deadline)
                if not unfinished and not reading:
                    return True
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.002)
        except Exception:  # noqa: BLE001 - when in doubt at exit, leave the client alone
            return False
        finally:
            self._destroy_events(owned)

    def _destroy_events(self, events: list) -> None:
        for event in events:
            lib.pjrt_shim_event_destroy(self.api.table, event)

    def _host_memory_in_use(self, deadline: float) -> bool:
        """Whether the plugin may still read the host memory of a freed buffer. Asked under
        the lock: the events are freed by whoever lets go of that memory (under the lock)."""
        import time

        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return True
        try:
            return any(event != _NULL and not _event_is_ready(self.api, event)
                       for _, event in self.pending_holds)
        finally:
            self._lock.release()

    # -- host memory the plugin reads ------------------------------------------------------

    def hold_host_memory(self, owner_id: int, holds: list) -> None:
        """Keep ``(host array, PJRT_Event*)`` pairs until each event fires."""
        self.holds[owner_id] = holds

    def keep_host_memory_until_done(self, holds: list) -> None:
        """Keep ``(host array, PJRT_Event*)`` pairs of buffers already freed until each event
        fires (the plugin may still read the memory for a program it is running)."""
        with self._lock:  # settle() replaces the list: an append racing with it would be lost
            self.pending_holds.extend(holds)

    def _let_go_of_host_memory(self, holds, wait: bool = False) -> None:
        """Drop host memory whose plugin event has fired (all of it, waiting, with ``wait``)."""
        self.pending_holds.extend(holds)
        still_needed = []
        for host, event in self.pending_holds:
            if event != _NULL:
                if wait:
                    lib.pjrt_shim_event_await_and_destroy(self.api.table, event)
                elif not _event_is_ready(self.api, event):
                    still_needed.append((host, event))
                    continue
                else:
                    lib.pjrt_shim_event_destroy(self.api.table, event)
            if host_memory_released is not None:
                host_memory_released(host)
        self.pending_holds = still_needed

    def recycle_host_memory(self) -> None:
        """Let go of host memory the plugin has finished reading since the last time."""
        if self.pending_holds and self._lock.acquire(blocking=False):
            try:
                if self.pointer != _NULL and self.generation == _fork_generation:
                    self._let_go_of_host_memory(())
            finally:
                self._lock.release()

    # -- numpy views -----------------------------------------------------------------------

    def add_view(self, owner_id: int, memory) -> None:
        """Record that numpy views of ``owner_id``'s buffers keep ``memory`` alive."""
        self.viewed.setdefault(owner_id, []).append(
            weakref.ref(memory, lambda ref, owner_id=owner_id: self._view_gone(owner_id, ref)))

    def release_when_unviewed(self, owner_id: int) -> None:
        """Release ``owner_id``'s buffers (see `release_buffers`) as soon as no numpy
        view reads them: now, or when the last view goes."""
        self.released_while_viewed.add(owner_id)
        self._view_gone(owner_id)

    def _view_gone(self, owner_id: int, gone=None) -> None:
        references = self.viewed.get(owner_id)
        if gone is not None and references is not None:
            # Forget the dead reference, so that an array read over and over (each read a new
            # view) does not collect them. remove() is one step: appends of other threads stay.
            try:
                references.remove(gone)
            except ValueError:
                pass
        if ((owner_id in self.released_while_viewed or self.closed)
                and not self._is_viewed(owner_id)):
            self.released_while_viewed.discard(owner_id)
            self.release_buffers(owner_id)

    def is_viewed(self, owner_id: int) -> bool:
        """Whether numpy views of ``owner_id``'s buffers are still in use."""
        return self._is_viewed(owner_id)

    def _is_viewed(self, owner_id: int) -> bool:
        if owner_id in self.buffer_exports:
            return True
        references = self.viewed.get(owner_id)
        return bool(references) and any(r() is not None for r in references)

    def __del__(self):
        # Reached only when nothing refers to the handle: no array, executable or client.
        if not self.closed:
            self.close()


class TopologyHandle(ClientHandle):
    """Owns a ``PJRT_TopologyDescription*`` under the same rules: calls take tickets, and
    ``close()`` frees it once no call is running (never after a fork)."""

    __slots__ = ()

    def _destroy_pointer(self, pointer) -> None:
        args = self.api.new_args("PJRT_TopologyDescription_Destroy_Args")
        args.topology = pointer
        check(self.api, self.api.table.PJRT_TopologyDescription_Destroy(args))


class _Call:
    """One native call's bracket (`ClientHandle.calling`). The ticket is taken when the
    bracket is made, which ``with handle.calling():`` does right before entering it (one
    Python call fewer per native call than taking it in ``__enter__``)."""

    __slots__ = ("handle", "ticket")

    def __init__(self, handle: ClientHandle, closed_ok: bool):
        self.handle = handle
        self.ticket = ticket = handle.take_ticket()
        if handle.closed and not closed_ok:
            handle.end(ticket)
            raise ClosedClientError(handle.closed_reason)

    def __enter__(self) -> ClientHandle:
        return self.handle

    def __exit__(self, kind, error, traceback) -> None:
        self.handle.end(self.ticket)


def _oldest(active: dict) -> int | None:
    """The ticket of the oldest running call in ``active``, or None when none runs.

    Other threads add and remove tickets without a lock, and a dict iterator whose dict
    changed size since it was made raises RuntimeError: retry then (a thread switch can fall
    between ``iter()`` and ``next()``).
    """
    while True:
        try:
            return next(iter(active), None)
        except RuntimeError:
            continue


def _live_handles_now() -> list:
    """Every live handle; retried if another thread adds or frees one meanwhile (iterating
    a WeakSet is not one step, and its set must not change size under the walk)."""
    while True:
        try:
            return list(_live_handles)
        except RuntimeError:
            continue


def _event_is_ready(api: Api, event) -> bool:
    args = api.new_args("PJRT_Event_IsReady_Args")
    args.event = event
    check(api, api.table.PJRT_Event_IsReady(args))
    return bool(args.is_ready)


def destroy_loaded_executable(api: Api, loaded) -> None:
    """Free a ``PJRT_LoadedExecutable*`` that no Python object owns yet."""
    _destroy_executable(api, loaded, _NULL)


def _destroy_executable(api: Api, loaded, executable) -> None:
    try:
        if executable != _NULL:
            args = api.new_args("PJRT_Executable_Destroy_Args")
            args.executable = executable
            check(api, api.table.PJRT_Executable_Destroy(args))
    finally:
        args = api.new_args("PJRT_LoadedExecutable_Destroy_Args")
        args.executable = loaded
        check(api, api.table.PJRT_LoadedExecutable_Destroy(args))


def _after_fork_in_child() -> None:
    global _fork_generation
    _fork_generation += 1
    for handle in _live_handles_now():
        handle.closed = True
        handle.closed_reason = (
            "this client was created in the parent process before os.fork(); a forked child "
            "cannot use it (the plugin's threads do not survive a fork). Create clients after "
            "forking, or start workers with the 'spawn' or 'forkserver' method")


def _warn_before_fork() -> None:
    if any(not handle.closed for handle in _live_handles_now()):
        import warnings

        warnings.warn("os.fork() was called while pjrt clients are open; the plugins run "
                      "threads of their own, which the child does not get, so the child cannot "
                      "use those clients (or make new ones of the same plugins). Fork before "
                      "creating clients, or use the 'spawn' start method.", RuntimeWarning,
                      stacklevel=2)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_warn_before_fork, after_in_child=_after_fork_in_child)


@atexit.register
def close_all_at_exit() -> None:
    """Close every client at interpreter exit, and free each once nothing of it still runs.

    Within the exit's budget (`pjrt._capi.exit_guard.EXIT_WAIT_SECONDS`), calls other threads are
    making may end, and programs and transfers the plugin is still computing may finish; a
    client is then freed (and with it the plugin's threads). A client with a call or a
    computation still running after that is leaked, and the process ends without the plugins'
    teardown: their libraries' destructors would tear down what the running work uses.
    """
    import time

    exit_began()  # daemon threads whose calls end from now on stay in them (see there)
    handles = _live_handles_now()
    for handle in handles:
        handle.closed = True
        if handle.generation == _fork_generation:  # a parent's client keeps its fork reason
            handle.closed_reason = "the interpreter is exiting; pjrt clients are closed"
    for handle in handles:
        if handle.generation != _fork_generation:
            # The parent's, inherited through fork(): nothing of it is freed here, and the
            # calls its threads were making when the parent forked stay counted in ``active``
            # with no thread here to end them, so there is nothing to wait for. With such a
            # call, the plugin's state is mid-call: its teardown must not run on it.
            if handle.active:
                skip_native_teardown_at_exit()
            continue
        while handle.active and exit_time_left() > 0:
            time.sleep(0.005)
        if handle.active or not handle.wait_while_computing(exit_time_left()):
            # Nothing of it is freed any more, even by arrays collected later in the exit
            # (as for a client inherited through fork), and the handle itself outlives the
            # interpreter's teardown: it holds the host memory the running work may read.
            handle.generation = -1
            keep_forever(handle)
            skip_native_teardown_at_exit()
        else:
            handle.settle()

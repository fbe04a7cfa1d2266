"""A plugin's transfer manager (``PJRT_AsyncHostToDeviceTransferManager``): its C calls and
who owns it.

A transfer manager holds buffers on one device whose bytes the host sends later, in pieces
(see `pjrt.streaming`, the public face). This module is the only one that touches the C
handle, and it keeps the rules `pjrt._capi.handles` keeps for buffers and executables:

* **Freed exactly once**, by whoever takes the pointer out of `ManagerState.pointer` under
  the manager's lock: `ManagerState.close`, called by the user, by the public object's
  finaliser, by `Client.close` (`close_managers_of`) or at interpreter exit.
* **Never freed under a running call.** Every call on the manager holds a ticket on its
  client (`ClientHandle.begin`) and the manager's lock; ``close`` takes the same lock, so it
  waits for a call in flight. The calls are short: the plugin only queues each transfer.
* **Before its client.** The plugin's manager refers to its client, so `Client.close`
  closes the client's managers first, under a ticket of its own that keeps the client alive
  meanwhile (`close_managers_of`); a manager made while the client closes sees the closed
  client after registering itself and goes at once.
* **Leaked, never freed, where freeing could crash:** in a child after ``fork()`` (the
  plugin's threads did not survive it), and at interpreter exit when another thread is still
  in a call on it. What the plugin may still read is leaked with it.

The host memory of each transfer is the caller's own, read by the plugin later. It is kept
(`Chunk`) until the transfer's done event fires; the event is turned into a
``pjrt_shim_waiter`` at once, so that waiting on it needs no call on the client and can be
given up between slices (Ctrl-C).
"""
from __future__ import annotations

import atexit
import os
import threading
import weakref
from typing import Any, Callable, TypeVar

from .api import HEADER_VERSION, Api, struct_size
from .handles import ClientHandle, fork_generation
from .native_runtime import programs_may_call_python
from .python_api import keep_forever
from .exit_guard import exit_began, exit_time_left
from .waits import WAIT_SLICE_MS
from .._pjrt_cffi import ffi, lib
from ..errors import (ClosedClientError, ErrorCode, UnsupportedFeatureError, XlaRuntimeError,
                      check, consume)

_NULL = ffi.NULL

#: The PJRT C API version from which this side drives transfer managers: their structs have
#: had the layout of our header since then.
MIN_MINOR = 60

#: The entries a manager needs, checked before one is made. ``PJRT_Event_OnReady`` tells when
#: the plugin has finished reading a transfer's host memory without a call on the client.
REQUIRED_FUNCTIONS = (
    "PJRT_Client_CreateBuffersForAsyncHostToDevice",
    "PJRT_AsyncHostToDeviceTransferManager_Destroy",
    "PJRT_AsyncHostToDeviceTransferManager_TransferData",
    "PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer",
    "PJRT_AsyncHostToDeviceTransferManager_Device",
    "PJRT_AsyncHostToDeviceTransferManager_BufferSize",
    "PJRT_AsyncHostToDeviceTransferManager_SetBufferError",
    "PJRT_Event_OnReady",
)

#: One byte to point an empty transfer at (the plugin reads none of it).
_EMPTY = bytes(1)

T = TypeVar("T")

_CREATE = "PJRT_Client_CreateBuffersForAsyncHostToDevice"
_WHY = "streamed host-to-device transfers (create_buffers_for_async_host_to_device) need it"


def require_streaming(api: Api) -> None:
    """Raise [`UnsupportedFeatureError`][pjrt.errors.UnsupportedFeatureError], naming the
    plugin and its API version, unless the plugin can drive transfer managers."""
    if api.version < (0, MIN_MINOR):
        raise UnsupportedFeatureError(
            _CREATE, api.plugin_name, api.version, HEADER_VERSION,
            why=f"pjrt drives transfer managers from PJRT C API 0.{MIN_MINOR} on, whose "
                f"structs this plugin predates; use a newer build of the plugin, or place "
                f"whole arrays with device_put")
    for function in REQUIRED_FUNCTIONS:
        api.require(function, why=_WHY)


class Chunk:
    """The host memory of one transfer, kept until the plugin has read it.

    ``waiter`` is a ``pjrt_shim_waiter*`` on the transfer's done event, owned here and
    finished exactly once, under ``lock``, by whoever sees it fire; ``host`` is dropped then.
    Without a waiter (the plugin gave no event, or refused to report on it) the memory is kept
    until the manager is closed: its Destroy waits for every transfer in flight.

    In a child after ``fork()``, a chunk handed over in the parent is left alone: what was
    known at the fork is answered, and a wait on a chunk the plugin had not yet read raises
    `ClosedClientError` (its event never fires here, and the lock may be held by a thread
    of the parent).
    """

    __slots__ = ("api", "handle", "generation", "host", "waiter", "error", "lock")

    def __init__(self, handle: ClientHandle, host: object, waiter):
        self.api = handle.api
        self.handle = handle
        self.generation = fork_generation()
        self.host = host
        self.waiter = waiter
        #: The transfer's error, once it has fired with one (an exception object).
        self.error: BaseException | None = None
        self.lock = threading.Lock()

    def poll(self, wait_ms: int) -> bool:
        """Wait up to ``wait_ms`` for the plugin to finish reading; whether it has.

        Raises:
          ClosedClientError: in a forked child, for a chunk of the parent's that the plugin
            had not been seen to finish reading.
        """
        if self.generation != fork_generation():
            if self.waiter is None and self.host is None:
                return True  # read before the fork
            raise ClosedClientError(self.handle.closed_reason)
        with self.lock:
            return self._poll_locked(wait_ms)

    def poll_if_free(self) -> bool:
        """`poll` without waiting; False while another thread waits on this chunk."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            return self._poll_locked(0)
        finally:
            self.lock.release()

    def _poll_locked(self, wait_ms: int) -> bool:
        waiter = self.waiter
        if waiter is None:
            return self.host is None
        if not lib.pjrt_shim_waiter_wait(waiter, wait_ms):
            return False
        self.waiter = None
        self.host = None
        error = lib.pjrt_shim_waiter_finish(waiter)
        if error != _NULL:
            self.error = consume(self.api, error)
        return True

    def wait(self, seconds: float | None = None) -> bool:
        """Wait in slices (Ctrl-C ends the wait, not the transfer) until the plugin has read
        the memory, for at most ``seconds`` when given; whether it has."""
        import time

        deadline = None if seconds is None else time.monotonic() + seconds
        while True:
            left = WAIT_SLICE_MS if deadline is None else min(
                WAIT_SLICE_MS, int(max(0.0, deadline - time.monotonic()) * 1000))
            if self.poll(left):
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def release_after_destroy(self) -> None:
        """The manager is gone, so the plugin reads this memory no longer (Destroy waited for
        the transfers in flight): a chunk that has no waiter lets go of it now."""
        with self.lock:
            if self.waiter is None:
                self.host = None


class ManagerState:
    """Everything of one transfer manager that outlives its public object until it is
    closed: the pointer, the calls in flight on it, what each buffer has been sent, and the
    host memory of the transfers still being read.

    It also keeps the plugin's rules for the manager, which XLA's managers leave unchecked or
    check with assertions that end the process: an index in range (the caller checks it); a
    buffer retrieved once; no chunk after a buffer's last one or after an error was set on it;
    the last chunk, or an error, only once every other chunk of that buffer has been handed to
    the plugin; no chunk after one the plugin refused (its count of pending buffers no longer
    holds). Calls on different buffers, and chunks of one buffer, run in parallel: the plugin
    copies them concurrently.

    Attributes:
      handle: the client's `ClientHandle` (kept alive by this object).
      api: the plugin's `Api`.
      pointer: the ``PJRT_AsyncHostToDeviceTransferManager*`` (NULL once closed).
      sizes: each buffer's size in bytes, as the plugin reports it.
      chunks: the transfers whose host memory the plugin may still read.
    """

    __slots__ = ("handle", "api", "pointer", "sizes", "chunks", "leaked", "_cond", "_calls",
                 "_closing", "_sent", "_finished", "_dispatching", "_retrieved", "_refused",
                 "__weakref__")

    def __init__(self, handle: ClientHandle, pointer, sizes: list[int]):
        self.handle = handle
        self.api = handle.api
        self.pointer = pointer
        self.sizes = tuple(sizes)
        self.chunks: list[Chunk] = []
        #: Set when the manager was left to the process instead of being freed.
        self.leaked = False
        #: Guards everything below; waited on for calls and dispatches to end.
        self._cond = threading.Condition(threading.Lock())
        self._calls = 0  # native calls on the manager running now
        self._closing = False
        count = len(sizes)
        self._sent: list[list[list[int]]] = [[] for _ in range(count)]  # byte ranges, merged
        self._finished: list[str | None] = [None] * count  # why a buffer takes no more chunks
        self._dispatching = [0] * count  # chunks being handed to the plugin, per buffer
        self._retrieved = [False] * count
        self._refused: str | None = None

    @property
    def closed(self) -> bool:
        return self.pointer == _NULL or self._closing

    # -- calls -----------------------------------------------------------------------------

    def _begin_locked(self):
        """Count a call in (under the condition); the pointer to use."""
        if self._closing or self.pointer == _NULL:
            raise ValueError("this transfer manager is closed; make a new one with "
                             "client.create_buffers_for_async_host_to_device(...)")
        self._calls += 1
        return self.pointer

    def _end(self, index: int | None = None, chunk: Chunk | None = None) -> None:
        """Count a call out; ``chunk``, the host memory of a transfer it made, is kept from
        then on (in the same step, so that a `close` waiting for the call sees it)."""
        with self._cond:
            if chunk is not None:
                # Forget what the plugin has read meanwhile (not waiting for chunks another
                # thread is waiting on).
                self.chunks = [c for c in self.chunks if not c.poll_if_free()]
                self.chunks.append(chunk)
            self._calls -= 1
            if index is not None:
                self._dispatching[index] -= 1
            self._cond.notify_all()

    def _check_takes_data_locked(self, index: int) -> None:
        if self._refused is not None:
            raise RuntimeError(
                f"the plugin refused a chunk of this manager earlier ({self._refused}), after "
                f"which its count of pending buffers no longer holds and it may end the "
                f"process: the manager takes no more chunks; close it and make a new one")
        if self._finished[index] is not None:
            raise ValueError(f"buffer {index} takes no more chunks: {self._finished[index]}")

    def _finish_locked(self, index: int, reason: str) -> None:
        """Mark buffer ``index`` finished, then wait until no chunk of it is being handed to
        the plugin (an interrupted wait undoes the mark)."""
        self._finished[index] = reason
        try:
            while self._dispatching[index]:
                self._cond.wait()
        except BaseException:
            self._finished[index] = None
            raise

    def transfer(self, index: int, host: object, offset: int, size: int,
                 is_last: bool | None) -> tuple[Chunk, bool]:
        """Hand the ``size`` bytes of ``host`` (an object with the buffer protocol, contiguous)
        to the plugin for buffer ``index`` at byte ``offset``, which the caller checked lie
        inside it.

        ``is_last`` None: the chunk is the last when, with it, every byte of the buffer has
        been sent. Returns the `Chunk` keeping ``host`` and whether it was the last.

        Raises:
          ValueError: the buffer takes no more chunks, or the manager is closed.
          RuntimeError: the plugin refused a chunk before.
          ClosedClientError: the client is closed.
          XlaRuntimeError: the plugin refuses this one (the manager then takes no more).
        """
        data = ffi.from_buffer(host) if size else ffi.from_buffer(_EMPTY)
        with self.handle.calling():
            with self._cond:
                pointer = self._begin_locked()
                try:
                    self._check_takes_data_locked(index)
                    before = self._sent[index]
                    sent = _merged(before, offset, offset + size)
                    total = self.sizes[index]
                    last = (sent == [[0, total]] or total == 0) if is_last is None else is_last
                    self._sent[index] = sent
                    if last:
                        try:
                            self._finish_locked(index, "its last chunk was sent")
                        except BaseException:
                            self._sent[index] = before
                            raise
                except BaseException:
                    self._calls -= 1
                    self._cond.notify_all()
                    raise
                self._dispatching[index] += 1
            accepted = False
            try:
                api = self.api
                args = api.new_args("PJRT_AsyncHostToDeviceTransferManager_TransferData_Args")
                args.transfer_manager = pointer
                args.buffer_index = index
                args.data = data
                args.offset = offset
                args.transfer_size = size
                args.is_last_transfer = last
                try:
                    check(api, api.table.PJRT_AsyncHostToDeviceTransferManager_TransferData(args))
                except XlaRuntimeError as error:
                    # XLA's managers count a refused chunk as a finished buffer and end the
                    # process when that count runs out later: no more calls on this one.
                    with self._cond:
                        self._refused = f"{error.code_name}: {error.plugin_message}"
                    raise
                accepted = True
                chunk = Chunk(self.handle, (host, data),
                              _waiter(api, args.done_with_h2d_transfer))
            except BaseException:
                # Interrupted after the plugin took the chunk: its memory stays until close.
                self._end(index, Chunk(self.handle, (host, data), None) if accepted else None)
                raise
            self._end(index, chunk)
            return chunk, last

    def set_buffer_error(self, index: int, code: ErrorCode, message: bytes) -> None:
        """Fail buffer ``index`` with ``code`` and ``message`` (see `transfer` for the
        errors)."""
        with self.handle.calling():
            with self._cond:
                pointer = self._begin_locked()
                try:
                    self._check_takes_data_locked(index)
                    self._finish_locked(index, "an error was set on it")
                except BaseException:
                    self._calls -= 1
                    self._cond.notify_all()
                    raise
            try:
                text = ffi.from_buffer(message)
                self.api.call_new("PJRT_AsyncHostToDeviceTransferManager_SetBufferError",
                                  transfer_manager=pointer, buffer_index=index,
                                  error_code=int(code), error_message=text,
                                  error_message_size=len(message))
            finally:
                self._end()

    def retrieve(self, index: int, adopt: Callable[[Any], T]) -> T:
        """``adopt(buffer)``, which takes over the ``PJRT_Buffer*`` of buffer ``index`` (handed
        out once); the buffer is freed if ``adopt`` raises.

        Raises:
          ValueError: it was retrieved before, or the manager is closed.
          ClosedClientError: the client is closed.
        """
        with self.handle.calling():
            with self._cond:
                pointer = self._begin_locked()
                if self._retrieved[index]:
                    self._calls -= 1
                    self._cond.notify_all()
                    raise ValueError(f"buffer {index} was already retrieved: a manager hands "
                                     f"each buffer out once (keep the Array it returned)")
                self._retrieved[index] = True
            try:
                buffer = self.api.call_new("PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer",
                                           transfer_manager=pointer,
                                           buffer_index=index).buffer_out
            finally:
                self._end()
            try:
                return adopt(buffer)
            except BaseException:
                lib.pjrt_shim_buffer_destroy(self.api.table, buffer)
                raise

    # -- closing ---------------------------------------------------------------------------

    def close(self, *, timeout: float | None = None) -> None:
        """Free the manager (idempotent), once the calls on it in other threads have ended:
        the plugin first finishes the chunks it was given; buffers not fully sent then fail
        with the plugin's error. The host memory goes once each chunk's done event fires.

        ``timeout``: at exit, how long to wait for calls in flight on other threads and for
        the done events, after which the manager and the memory are leaked instead.
        """
        import time

        if self.handle.generation != fork_generation():
            # The parent's manager, inherited through fork(): nothing of it may be called here.
            # Checked first: a call another thread of the parent was making when it forked
            # stays counted in `_calls` (and may hold the lock) with no thread here to end it.
            self.pointer = _NULL
            self.leak()
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._cond.acquire(timeout=-1 if timeout is None else timeout):
            self.leak()
            return
        try:
            if self.pointer == _NULL:
                return
            self._closing = True  # no call begins from now on
            while self._calls:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    self.leak()
                    return
                self._cond.wait(left)
            handle = self.handle
            # The ticket comes before the manager leaves the registry: close_managers_of,
            # which keeps the client while it closes what it finds there, either finds this
            # one or finds the client held by this ticket.
            with handle.calling(closed_ok=True):
                pointer, self.pointer = self.pointer, _NULL
                _unregister(self)
                if handle.pointer == _NULL:
                    self.leak()  # the client is already gone (it cannot be, by the rules)
                    return
                _destroy(self.api, pointer)
        finally:
            self._cond.release()
        for chunk in list(self.chunks):
            chunk.release_after_destroy()
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not chunk.wait(left):
                self.leak()
                return
        self.chunks = []

    def leak(self) -> None:
        """Keep this state, and the host memory its transfers may read, for the life of the
        process; the manager itself is never freed."""
        if not self.leaked:
            self.leaked = True
            keep_forever(self)


def _waiter(api: Api, event):
    """A ``pjrt_shim_waiter*`` on ``event`` (which it frees), or None when there is no event
    or the plugin will not report on it."""
    if event == _NULL:
        return None
    error_out = ffi.new("PJRT_Error **")
    waiter = lib.pjrt_shim_waiter_start(api.table, event, error_out)
    if error_out[0] != _NULL:
        lib.pjrt_shim_error_destroy(api.table, error_out[0])
    return None if waiter == _NULL else waiter


def _merged(ranges: list[list[int]], start: int, end: int) -> list[list[int]]:
    """``ranges`` (sorted, disjoint ``[start, end)`` pairs) with ``[start, end)`` added."""
    if start == end:
        return ranges
    merged: list[list[int]] = []
    for low, high in sorted([*ranges, [start, end]]):
        if merged and low <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], high)
        else:
            merged.append([low, high])
    return merged


# -- making one --------------------------------------------------------------------------------

def create(handle: ClientHandle, specs: list[tuple[tuple[int, ...], int]],
           memory_pointer) -> tuple[ManagerState, object]:
    """Make a transfer manager for buffers of ``specs`` (``(dimensions, PJRT_Buffer_Type)``
    pairs) in the memory ``memory_pointer``.

    Returns the manager's state (registered with its client; ``state.sizes`` are the buffers'
    sizes in bytes as the plugin reports them) and the ``PJRT_Device*`` they live on.

    Raises:
      UnsupportedFeatureError: the plugin cannot make transfer managers (too old, an entry
        missing, or it answers UNIMPLEMENTED).
      ClosedClientError: the client is closed (or was closed meanwhile).
    """
    api = handle.api
    require_streaming(api)
    dims = [ffi.new("int64_t[]", shape) if shape else _NULL for shape, _ in specs]
    shape_specs = ffi.new("PJRT_ShapeSpec[]", max(1, len(specs)))
    for spec, (shape, buffer_type), spec_dims in zip(shape_specs, specs, dims):
        spec.struct_size = struct_size("PJRT_ShapeSpec")
        spec.dims = spec_dims
        spec.num_dims = len(shape)
        spec.element_type = buffer_type
    args = api.new_args("PJRT_Client_CreateBuffersForAsyncHostToDevice_Args")
    args.shape_specs = shape_specs if specs else _NULL
    # Programs may wait on these buffers, which Python fills: launches let the GIL go from
    # now on (see CallPlan).
    programs_may_call_python()
    args.num_shape_specs = len(specs)
    args.memory = memory_pointer
    with handle.calling():
        args.client = handle.pointer
        try:
            check(api, api.table.PJRT_Client_CreateBuffersForAsyncHostToDevice(args))
        except UnsupportedFeatureError:
            raise
        except XlaRuntimeError as error:
            if error.code != ErrorCode.UNIMPLEMENTED:
                raise
            raise UnsupportedFeatureError(
                _CREATE, api.plugin_name, api.version, HEADER_VERSION,
                why=f"the plugin answered UNIMPLEMENTED: {error.plugin_message}") from None
        pointer = args.transfer_manager
        try:
            sizes = [int(api.call_new("PJRT_AsyncHostToDeviceTransferManager_BufferSize",
                                      transfer_manager=pointer, buffer_index=i).buffer_size)
                     for i in range(len(specs))]
            device = api.call_new("PJRT_AsyncHostToDeviceTransferManager_Device",
                                  transfer_manager=pointer).device_out
        except BaseException:
            _destroy(api, pointer)
            raise
        state = ManagerState(handle, pointer, sizes)
        _register(state)
        if handle.closed:
            # Closed while this call ran: close_managers_of may have looked before the
            # registration above, so the manager goes now, while this call keeps the client.
            state.close()
            raise ClosedClientError(handle.closed_reason)
    return state, device


def _destroy(api: Api, pointer) -> None:
    try:
        api.call_new("PJRT_AsyncHostToDeviceTransferManager_Destroy", transfer_manager=pointer)
    except XlaRuntimeError:
        pass  # nothing to report a failed destroy to


# -- every open manager, for Client.close and the interpreter's exit ---------------------------

#: client handle -> the states of its open managers (held strongly until each is closed, so
#: that a manager whose public object was collected is still closed before its client).
_open: "weakref.WeakKeyDictionary[ClientHandle, set[ManagerState]]" = weakref.WeakKeyDictionary()
_open_lock = threading.Lock()


def _register(state: ManagerState) -> None:
    with _open_lock:
        _open.setdefault(state.handle, set()).add(state)


def _unregister(state: ManagerState) -> None:
    with _open_lock:
        states = _open.get(state.handle)
        if states is not None:
            states.discard(state)


def _open_states(handle: ClientHandle | None = None) -> list[ManagerState]:
    with _open_lock:
        if handle is not None:
            return list(_open.get(handle, ()))
        return [state for states in list(_open.values()) for state in states]


def close_managers_of(handle: ClientHandle) -> None:
    """Mark the client closed and close its transfer managers, before anything of the client
    is freed (called by `Client.close`).

    The client is marked closed under a ticket of this call: no manager can be made or used
    from then on, and the client itself cannot be freed until the managers are gone.
    """
    with handle.calling(closed_ok=True):
        handle.close()
        for state in _open_states(handle):
            state.close()


def _forget_after_fork() -> None:
    # The parent's managers are left alone in a child (see ManagerState.close), and a thread
    # of the parent may have held the registry's lock when it forked.
    global _open_lock
    _open_lock = threading.Lock()
    _open.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


@atexit.register
def _close_all_at_exit() -> None:
    """Close every open manager at exit, before the clients' exit hook frees their clients
    (registered after it, so run before it). One in a call on another thread is leaked."""
    exit_began()
    for state in _open_states():
        try:
            state.close(timeout=exit_time_left())
        except Exception:  # noqa: BLE001 - at exit, leave what cannot be closed
            state.leak()

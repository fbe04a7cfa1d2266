"""Awaiting arrays from asyncio: ``await array`` and `ready`, with no thread per wait.

Each buffer still being computed gets a wait on its ready event (``PJRT_Event_OnReady``)
whose callback is C (``_native/ready_notifier.c``): it appends the wait to its loop's
notifier and makes the notifier's descriptor readable. The loop watches that descriptor
(``add_reader``) and, on its own thread, takes the fired waits and resolves the futures.

Why C and not a Python callback (cffi's ``def_extern``) handing over with
``call_soon_threadsafe``: the callback runs on a plugin thread at any time, also after the
loop has closed or while the interpreter exits. A Python callback must take the GIL there,
and a thread that asks for the GIL after finalisation has begun is ended by CPython in the
middle of the plugin's own code (from Python 3.14, blocked for good); nor can it tell a loop
that is closing from one that is not without a race. The C callback touches nothing but memory it owns (the notifier is
reference-counted: the loop's side holds one reference, each pending wait one) and a
non-blocking write, so a callback that comes late is harmless, and each ready event is
destroyed once, when its wait is set up.

One notifier serves each event loop while it has waits pending; it goes when the last of them
has fired (so ``asyncio.run`` after ``asyncio.run`` leaves nothing behind). A loop closed
with waits pending keeps its notifier until the next wait in any loop notices, which lets it
go (the C side frees it when the last pending callback has come).

A plugin without ``PJRT_Event_OnReady`` (older than any tested one) is waited for by
``block_until_ready`` on the loop's default executor instead.
"""
from __future__ import annotations

import itertools
import os
import threading
from typing import TYPE_CHECKING, Any, Generator, Protocol, Sequence, TypeVar

from .._pjrt_cffi import ffi, lib
from ..errors import DeletedArrayError, consume

if TYPE_CHECKING:
    import asyncio

    from .handles import ClientHandle

_NULL = ffi.NULL

#: Fired waits taken from a notifier per C call.
_TAKE_BATCH = 64


class _Waitable(Protocol):
    """What a wait needs of an array (pjrt.array.Array, which this layer does not import)."""

    @property
    def client(self) -> Any: ...

    def live_buffers(self) -> list: ...

    def block_until_ready(self) -> Any: ...


A = TypeVar("A", bound=_Waitable)


async def ready(*arrays: A) -> tuple[A, ...]:
    """Wait, without blocking the event loop, until every array's value is computed; returns
    the arrays (a tuple, in the order given).

    ``await pjrt.ready(a, b)`` waits for all of them (every shard of each); when computations
    failed, it raises the error of the first failed one in argument order (and shard order
    within an array), as ``pjrt.block_until_ready([a, b])`` does. ``await x`` does the same
    for one array and returns it. Arrays already computed are not waited for and do not
    involve the event loop at all.

    Cancelling the await cancels only the wait: the computations go on and the arrays stay
    valid.

    Raises:
      TypeError: an argument is not a pjrt Array.
      DeletedArrayError: an array was deleted or donated.
      ClosedClientError: an array's client is closed.
      XlaRuntimeError: a computation failed.
    """
    for position, array in enumerate(arrays):
        if not callable(getattr(array, "live_buffers", None)):
            raise TypeError(f"pjrt.ready takes pjrt Arrays; argument {position} is "
                            f"{type(array).__module__}.{type(array).__qualname__}")
    await _Readiness(arrays)
    return arrays


class _Readiness:
    __slots__ = ("arrays",)

    def __init__(self, arrays: Sequence[_Waitable]):
        self.arrays = arrays

    def __await__(self) -> Generator[Any, None, None]:
        return wait_until_ready(self.arrays)


def wait_until_ready(arrays: Sequence[_Waitable]) -> Generator[Any, None, None]:
    """The body of ``await``: a generator to ``yield from`` inside ``__await__``.

    Asks each buffer whether it is ready, under a ticket of its client (as
    ``block_until_ready`` does, so that a buffer released meanwhile is not freed under the
    question); buffers that are not get a wait on the running loop. Returns when all are done;
    raises the first error in order. When nothing is pending it returns before yielding: the
    loop is not asked for.
    """
    errors: dict[int, BaseException] = {}  # slot (shard, in argument order) -> its error
    wait: _Wait | None = None
    slot = 0
    try:
        for array in arrays:
            handle = _handle_of(array)
            with handle.calling(closed_ok=True):
                buffers = _buffers_of(array)  # raises once the client is closed
                api = handle.api
                watchable = api.has("PJRT_Event_OnReady")
                for index, buffer in enumerate(buffers):
                    if not _ask(api, buffer, slot + index, errors):
                        wait = wait or _Wait(_running_loop(), errors)
                        if not watchable:  # the rest of the array, by block_until_ready
                            wait.through_executor(slot + index, array)
                            break
                        _watch(api, buffer, slot + index, wait)
                slot += len(buffers)
    except BaseException:
        if wait is not None:
            wait.abandon()  # what was watched is dropped as it fires
        raise
    if wait is not None:
        wait.settle()  # (done already if every shard watched was done by then)
        yield from wait.future
    elif errors:
        raise errors[min(errors)]


def _ask(api, buffer, slot: int, errors: dict) -> bool:
    """Whether ``buffer`` is done; its error, if it failed, goes in ``errors[slot]``."""
    error_out = _error_out()
    state = lib.pjrt_ready_notifier_watch(api.table, buffer, _NULL, 0, error_out)
    if state == 2:
        return False
    _raise_if_no_memory(state)
    _keep_error(api, error_out, slot, errors)
    return True


def _watch(api, buffer, slot: int, wait: "_Wait") -> None:
    """Have the loop's notifier tell ``wait`` when ``buffer`` is done (or note its error at
    once if it is done by now)."""
    watches = _watches_for(wait.loop)
    token = next(_tokens)
    error_out = _error_out()
    state = lib.pjrt_ready_notifier_watch(api.table, buffer, watches.notifier, token, error_out)
    if state == 0:
        wait.pending += 1
        wait.tokens.append(token)
        watches.add(token, wait, slot, api)
        return
    _raise_if_no_memory(state)
    _keep_error(api, error_out, slot, wait.errors)


def _raise_if_no_memory(state: int) -> None:
    if state == -1:
        raise MemoryError("out of host memory while setting up a wait for the plugin")


def _keep_error(api, error_out, slot: int, errors: dict) -> None:
    error = error_out[0]
    if error != _NULL:  # failed (or the plugin refused the question)
        error_out[0] = _NULL
        errors[slot] = consume(api, error)


# -- one await ---------------------------------------------------------------------------------

class _Wait:
    """The shards one ``await`` waits for: a future on the running loop, resolved when the
    last is done, with the error of the first (in slot order) that failed."""

    __slots__ = ("loop", "future", "errors", "pending", "tokens")

    def __init__(self, loop: "asyncio.AbstractEventLoop", errors: dict):
        self.loop = loop
        self.future: asyncio.Future = loop.create_future()
        self.future.add_done_callback(self._cancelled)
        #: slot -> the exception its computation raised (shared with the caller, which adds
        #: the errors of shards that were done at once)
        self.errors: dict[int, BaseException] = errors
        self.pending = 0
        #: the tokens of its shards the loop's notifier watches
        self.tokens: list[int] = []

    def _cancelled(self, future: "asyncio.Future") -> None:
        if future.cancelled() and self.tokens:
            watches = _registry.get(self.loop)
            if watches is not None:
                watches.forget(self.tokens)

    def done(self, slot: int, error: BaseException | None) -> None:
        if error is not None:
            self.errors[slot] = error
        self.pending -= 1
        self.settle()

    def settle(self) -> None:
        """Resolve the future once nothing is pending (unless it was cancelled)."""
        if self.pending == 0 and not self.future.done():
            if self.errors:
                self.future.set_exception(self.errors[min(self.errors)])
            else:
                self.future.set_result(None)

    def abandon(self) -> None:
        self.future.cancel()

    def through_executor(self, slot: int, array: _Waitable) -> None:
        """Wait for ``array`` with ``block_until_ready`` on the loop's default executor (for
        a plugin without ``PJRT_Event_OnReady``)."""
        self.pending += 1
        waiting = self.loop.run_in_executor(None, array.block_until_ready)

        def finished(done: "asyncio.Future") -> None:
            error = None if done.cancelled() else done.exception()
            self.done(slot, error)

        waiting.add_done_callback(finished)


def _handle_of(array: _Waitable) -> "ClientHandle":
    return array.client.raw_handle


def _buffers_of(array: _Waitable) -> list:
    try:
        return array.live_buffers()
    except DeletedArrayError as deleted:  # in jaxlib's words, as block_until_ready says it
        raise DeletedArrayError("BlockHostUntilReady() called on deleted or donated "
                                f"buffer: {deleted.plugin_message}") from None


def _running_loop() -> "asyncio.AbstractEventLoop":
    import asyncio  # only when something must be waited for

    return asyncio.get_running_loop()


def _error_out():
    out = getattr(_per_thread, "error_out", None)
    if out is None:
        out = _per_thread.error_out = ffi.new("PJRT_Error **")
    return out


_per_thread = threading.local()
#: Tokens naming waits to the notifiers (unique in the process).
_tokens = itertools.count(1)


# -- one loop's notifier ---------------------------------------------------------------------

class _LoopWatches:
    """A loop's notifier and the waits it watches: token -> (wait, slot, api)."""

    __slots__ = ("loop", "notifier", "fd", "waits", "forgotten", "_tokens_out", "_errors_out")

    def __init__(self, loop: "asyncio.AbstractEventLoop"):
        notifier = lib.pjrt_ready_notifier_new()
        if notifier == _NULL:
            number = ffi.errno
            raise OSError(number, f"cannot make the descriptor that wakes the event loop when "
                                  f"a result is ready: {os.strerror(number)}")
        self.loop = loop
        self.notifier = notifier
        self.fd = lib.pjrt_ready_notifier_fd(notifier)
        self.waits: dict[int, tuple[_Wait, int, Any]] = {}
        #: token -> api, of the waits cancelled before their events fired
        self.forgotten: dict[int, Any] = {}
        self._tokens_out = ffi.new("uint64_t[]", _TAKE_BATCH)
        self._errors_out = ffi.new("PJRT_Error *[]", _TAKE_BATCH)
        try:
            loop.add_reader(self.fd, self._fired)
        except BaseException:
            lib.pjrt_ready_notifier_release(notifier)
            raise

    def add(self, token: int, wait: _Wait, slot: int, api) -> None:
        self.waits[token] = (wait, slot, api)

    def forget(self, tokens: list[int]) -> None:
        """A cancelled wait's tokens: their errors are dropped as they come; once only such
        tokens are left, the notifier goes (and frees what still comes itself)."""
        for token in tokens:
            entry = self.waits.pop(token, None)
            if entry is not None:
                self.forgotten[token] = entry[2]
        if not self.waits:
            self.close()

    def _fired(self) -> None:
        """The descriptor is readable: resolve the waits that fired (on the loop's thread)."""
        while True:
            count = lib.pjrt_ready_notifier_take(self.notifier, self._tokens_out,
                                                 self._errors_out, _TAKE_BATCH)
            for i in range(count):
                token, error = int(self._tokens_out[i]), self._errors_out[i]
                entry = self.waits.pop(token, None)
                if entry is None:  # its wait was cancelled: the error is dropped
                    api = self.forgotten.pop(token, None)
                    if error != _NULL and api is not None:
                        lib.pjrt_shim_error_destroy(api.table, error)
                    continue
                wait, slot, api = entry
                try:
                    exception = consume(api, error) if error != _NULL else None
                except Exception as unreadable:  # noqa: BLE001 - the waiter gets it instead
                    exception = unreadable
                wait.done(slot, exception)
            if count < _TAKE_BATCH:
                break
        if not self.waits:
            self.close()

    def close(self) -> None:
        """Stop watching and let go of the notifier (its pending callbacks free it)."""
        with _registry_lock:
            if _registry.get(self.loop) is self:
                del _registry[self.loop]
            notifier, self.notifier = self.notifier, _NULL
        if notifier == _NULL:
            return  # closed already
        if not self.loop.is_closed():
            self.loop.remove_reader(self.fd)
        lib.pjrt_ready_notifier_release(notifier)


#: The loops with waits pending, and their notifiers.
_registry: dict[Any, _LoopWatches] = {}
_registry_lock = threading.Lock()


def _watches_for(loop: "asyncio.AbstractEventLoop") -> _LoopWatches:
    watches = _registry.get(loop)
    if watches is not None:
        return watches
    with _registry_lock:
        closed = [w for w in _registry.values() if w.loop.is_closed()]
    for stale in closed:  # closed with waits pending: nothing will read their descriptors
        stale.close()
    watches = _LoopWatches(loop)
    with _registry_lock:
        _registry[loop] = watches
    return watches


def _forget_after_fork() -> None:
    # The parent's notifiers and loops are not the child's; their memory is simply left.
    global _registry_lock
    _registry.clear()
    _registry_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)

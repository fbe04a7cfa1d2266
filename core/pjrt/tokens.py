"""Tokens of a program's run (jaxlib's ``Token`` and ``ShardedToken``): the plugin's
completion events of one launch, one per device, which fire when the program has finished on
that device (side effects included, which its outputs' readiness does not promise).

Any number of threads may wait on one token, on one ``ShardedToken``, or on several tokens of
one launch at once: each wait returns only once the run has finished on its device, and each
raises the program's error there if it failed. A wait ended by Ctrl-C (``KeyboardInterrupt``)
leaves the event in place: the other waits go on, and a later wait waits again.

The tokens of a launch own its ``PJRT_Event*`` handles. Each is freed once, under a ticket on
the client (`ClientHandle.begin`): by the first wait on it that ends with the run, or, if no
wait did, when the last token of the launch goes while the client is open. A closed client's
unwaited events are left to the plugin, since nothing may be called on it any more.
"""
from __future__ import annotations

import threading
import weakref

from ._capi.waits import wait_for_waiter
from ._pjrt_cffi import ffi, lib
from .errors import ClosedClientError, consume

_NULL = ffi.NULL


class _Events:
    """The completion events of one launch: what its tokens wait for, and what the
    finaliser of the tokens' `_Launch` frees.

    ``events[i]`` is device ``i``'s ``PJRT_Event*`` until the run's outcome there is known;
    then it is NULL, and ``errors`` holds the program's error there if it failed. Each thread
    that waits starts a wait of its own on the event (the C helper's waiter, which outlives
    the event), so an interrupted wait disturbs no other.
    """

    def __init__(self, handle, events: list):
        self.handle = handle
        self.events = events  # device index -> PJRT_Event* (NULL once the outcome is known)
        self.errors: dict[int, BaseException] = {}
        self.lock = threading.Lock()  # guards events and errors; never held over a wait
        #: One blocking ``PJRT_Event_Await`` at a time, for plugins without OnReady (the
        #: event may not be freed under an Await of another thread).
        self.awaiting = threading.Lock()

    def wait(self, index: int) -> None:
        """Wait until device ``index``'s event has fired; raise the program's error there."""
        with self.handle.calling() as handle:  # before the event is read: a closed
            api = handle.api                     # client's stays, to be left alone
            if not api.has("PJRT_Event_OnReady"):
                self._await(api, index)
            else:
                error_out = ffi.new("PJRT_Error **")
                with self.lock:
                    event = self.events[index]
                    waiter = (_NULL if event == _NULL
                              else lib.pjrt_shim_waiter_watch(api.table, event, error_out))
                if event != _NULL:
                    if waiter == _NULL:  # the plugin refused the wait: nothing is known yet
                        if error_out[0] != _NULL:
                            raise consume(api, error_out[0])
                        raise MemoryError("out of host memory while waiting for the plugin")
                    # A KeyboardInterrupt leaves from here: the waiter is freed by the C side
                    # when the event fires, and the event stays for later waits.
                    try:
                        wait_for_waiter(api, waiter)
                    except Exception as error:  # noqa: BLE001 - the program's error there
                        self._settle(api, index, error)
                        raise  # this wait's own copy of it
                    self._settle(api, index, None)
        error = self.errors.get(index)
        if error is not None:
            raise error

    def _await(self, api, index: int) -> None:
        """The wait on a plugin without ``PJRT_Event_OnReady``: one thread awaits the event
        (not in slices: the plugin gives no way to), the others wait for that one."""
        with self.awaiting:
            event = self.events[index]
            if event == _NULL:
                return
            args = api.new_args("PJRT_Event_Await_Args")
            args.event = event
            error = api.table.PJRT_Event_Await(args)
            self._settle(api, index, None if error == _NULL else consume(api, error))

    def _settle(self, api, index: int, error: BaseException | None) -> None:
        """Record the outcome of device ``index``'s run and free its event (once: the first
        wait to see the outcome does). Called under the waiting call's ticket."""
        with self.lock:
            event = self.events[index] if index < len(self.events) else _NULL
            if event == _NULL:
                return  # another wait settled it (or every token has gone)
            if error is not None:
                self.errors[index] = error
            self.events[index] = _NULL
            lib.pjrt_shim_event_destroy(api.table, event)

    def free(self) -> None:
        """Free the events no wait settled (every token of the launch is gone)."""
        with self.lock:
            events, self.events = [e for e in self.events if e != _NULL], []
        if not events:
            return
        try:
            with self.handle.calling() as handle:
                for event in events:
                    lib.pjrt_shim_event_destroy(handle.api.table, event)
        except ClosedClientError:
            pass  # the client is gone: nothing of it may be called


class _Launch:
    """The object a launch's tokens share; when the last goes, its events are freed."""

    __slots__ = ("events", "__weakref__")

    def __init__(self, events: _Events):
        self.events = events
        weakref.finalize(self, events.free).atexit = False


class Token:
    """The completion of one program's run on one device (jaxlib's ``Token``)."""

    def __init__(self, launch: _Launch, index: int = 0):
        self._launch = launch
        self._index = index

    def block_until_ready(self) -> None:
        """Wait until the run has finished on the device; raise its error if it failed.

        Raises:
          XlaRuntimeError: the program failed.
          ClosedClientError: the client was closed before the wait.
        """
        self._launch.events.wait(self._index)


class ShardedToken:
    """The completion of one program's run on each of its devices (jaxlib's
    ``ShardedToken``)."""

    def __init__(self, launch: _Launch, device_ids: list[int]):
        self._launch = launch
        self._device_ids = list(device_ids)

    def block_until_ready(self) -> None:
        """Wait until the run has finished on every device; then raise the error of the first
        device, in the token's device order, where it failed.

        Raises:
          XlaRuntimeError: the program failed on a device.
          ClosedClientError: the client was closed before the wait.
        """
        errors = []
        for index in range(len(self._device_ids)):
            try:
                self._launch.events.wait(index)
            except KeyboardInterrupt:
                raise
            except Exception as error:  # noqa: BLE001 - raised after every device is waited for
                errors.append(error)
        if errors:
            raise errors[0]

    def get_token_for_device_id(self, device_id: int) -> Token:
        """The token of the run on the device with this id.

        Raises:
          ValueError: the program did not run on that device.
        """
        try:
            return Token(self._launch, self._device_ids.index(device_id))
        except ValueError:
            raise ValueError(f"the program ran on devices {self._device_ids}, not on device "
                             f"{device_id}") from None


def finished(handle, count: int) -> _Launch:
    """What tokens of a launch on ``count`` devices that has already finished are made from
    (one run on a stand-in, `pjrt._runtime.handler_launches`): no event to wait for."""
    return _Launch(_Events(handle, [_NULL] * count))


def take_events(handle, slots, count: int) -> _Launch:
    """Own the ``count`` completion events a launch wrote into ``slots``; tokens are made
    from the returned object, and the events nobody waited for are freed with the last."""
    return _Launch(_Events(handle, [slots[i] for i in range(count)]))

"""Tokens of a program's run (jaxlib's ``Token`` and ``ShardedToken``): the plugin's
completion events of one launch, one per device, which fire when the program has finished on
that device (side effects included, which its outputs' readiness does not promise).

A token owns its ``PJRT_Event*`` handles. Each is waited for once, under a ticket on the
client (`ClientHandle.begin`), and freed by that wait; events nobody waited for are freed
when the token goes, while the client is open (a closed client's are left to the plugin,
since nothing may be called on it any more).
"""
from __future__ import annotations

import threading
import weakref

from ._capi.waits import wait_event
from ._pjrt_cffi import ffi, lib
from .errors import ClosedClientError

_NULL = ffi.NULL


class _Events:
    """The completion events of one launch: what its tokens wait for, and what the
    finaliser of the tokens' `_Launch` frees."""

    def __init__(self, handle, events: list):
        self.handle = handle
        self.events = events  # device index -> PJRT_Event* (NULL once waited for)
        self.errors: dict[int, BaseException] = {}
        self.lock = threading.Lock()

    def wait(self, index: int) -> None:
        """Wait for device ``index``'s event (once); raise the program's error there."""
        with self.handle.calling() as handle:  # before the event is taken: a closed
            with self.lock:                      # client's stays, to be left alone
                event, self.events[index] = self.events[index], _NULL
            if event != _NULL:
                # (Ctrl-C during the wait leaves the event to the plugin's callback, which
                # frees it when it fires: a later wait on this token then returns at once.)
                try:
                    wait_event(handle.api, event)
                except Exception as error:  # noqa: BLE001 - kept for every later wait
                    self.errors[index] = error
        if index in self.errors:
            raise self.errors[index]

    def free(self) -> None:
        """Free the events nobody waited for (every token of the launch is gone)."""
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
        """Wait until the run has finished on every device; raise the first error."""
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

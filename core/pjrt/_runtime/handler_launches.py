"""Programs a custom-call handler launches on the device whose program is running it.

A program that XLA's CPU plugin runs asynchronously (any program costly enough, such as one
with a product before the custom call) calls its Python handlers on the plugin's own threads,
and pjrt knows the device from the plugin
(`pjrt._capi.handler_devices.handler_running_on_device`). The plugin runs one device's
launches in order, each after the one before has ended, and the PJRT C API has no way to ask
for another queue; so a program the handler launched on that device would
start only after the program that waits for the handler: never.

`LoadedExecutable.execute`, ``execute_with_token`` and ``execute_sharded`` send such a launch
to a stand-in instead: another client of the same plugin, made with the same options
(`stand_in`), whose devices have queues of their own. The executable is loaded there from its
serialized form (once per stand-in and executable), the arguments are copied through host memory, and the
results are copied back to the devices the caller asked for, as Arrays of the caller's own
client. The answer is the same; the price is the copies, and the first launch of each
executable pays for loading it again.

A handler of a program running on a stand-in may do the same: each level of such nesting
takes the next stand-in whose devices are free, up to `MAX_STAND_INS`, past which the launch
raises RecursionError.

This module sits below the client, so it cannot make one: `pjrt.client` registers how
(`make_client_like`) when it is imported, and closes a client's stand-ins with it
(`close_stand_ins`).
"""
from __future__ import annotations

import os
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .._capi.handler_devices import (device_of_running_handler, handler_finished,
                                      handler_running_on_device)

if TYPE_CHECKING:
    import numpy as np

    from ..device import ClientView, Device

#: The most stand-in clients one client makes: handlers nested this deep, each launching on
#: the device of the program running it, are as deep as pjrt goes (each stand-in is a whole
#: client, with the plugin's threads).
MAX_STAND_INS = 4

#: Makes a new client of the same plugin, with the same create options, as the client given;
#: registered by `pjrt.client` (a hook, since the client lies above this module).
make_client_like: "Callable[[ClientView], Any] | None" = None

_lock = threading.Lock()
#: client -> its stand-ins, in index order; they close with it (`close_stand_ins`).
_stand_ins: "weakref.WeakKeyDictionary[Any, list]" = weakref.WeakKeyDictionary()
#: Held while a stand-in is made (a whole client: slow), not `_lock`.
_making = threading.Lock()
#: (id of a stand-in client, device id) for each device of a stand-in running a launch now.
_busy: set[tuple[int, int]] = set()
#: executable -> {stand-in index: the executable loaded on that stand-in}.
_loaded: "weakref.WeakKeyDictionary[Any, dict[int, Any]]" = weakref.WeakKeyDictionary()


#: The platforms whose launches from a handler on its own device go to a stand-in: XLA's CPU
#: plugin, where the queueing was measured and a second client costs threads and no more. A
#: GPU client reserves most of its device's memory when it starts, so a second one is no way
#: out there; such a launch keeps the plugin's order (and a wait on it is refused).
STAND_IN_PLATFORMS = frozenset({"cpu"})


def launch_waits_for_its_handler(devices: Sequence["Device"]) -> bool:
    """Whether a launch on ``devices``, from this thread, would queue behind the program
    running the handler this thread is in (it is on that program's device), on a platform
    that takes stand-ins."""
    device_id = device_of_running_handler()
    return device_id is not None and any(
        device.id == device_id and device.client.platform in STAND_IN_PLATFORMS
        for device in devices)


def run_on_stand_in(executable, client: "ClientView", devices: Sequence["Device"],
                    arguments: Sequence[Sequence[Any]], portable: bool) -> list[list[np.ndarray]]:
    """Run ``executable`` of ``client`` on a stand-in, on the devices with the ids of
    ``devices``; ``arguments[d][i]`` is argument ``i`` on device ``d`` (an Array or a host
    value). Returns ``outputs[d][i]``, on the host. ``portable``: the executable has no
    devices of its own and runs on ``devices[0]``."""
    import numpy as np  # not at import: `pjrt.client` imports this module, and a client
    # is made without numpy.

    # Read while this thread still counts as the handler: an argument queued behind the
    # program running the handler is refused, not waited for.
    values = [[np.asarray(argument) for argument in shard] for shard in arguments]
    ids = [device.id for device in devices]
    index, stand_in = _reserve(client, ids)
    not_a_handler = handler_running_on_device(None)  # the stand-in's queues are free
    try:
        loaded = _loaded_on(executable, stand_in, index)
        places = [stand_in.lookup_device(device_id) for device_id in ids]
        if len(places) == 1:
            inputs = [stand_in.buffer_from_pyval(value, places[0]) for value in values[0]]
            outputs = [loaded.execute(inputs, device=places[0] if portable else None)]
        else:
            inputs = [[stand_in.buffer_from_pyval(values[d][i], place)
                       for d, place in enumerate(places)] for i in range(len(values[0]))]
            by_output = loaded.execute_sharded(inputs).disassemble_into_single_device_arrays()
            outputs = [list(shard) for shard in zip(*by_output)] if by_output else [
                [] for _ in places]
        # Copies: the stand-in's buffers go when this returns.
        return [[np.array(output) for output in shard] for shard in outputs]
    finally:
        handler_finished(not_a_handler)
        with _lock:
            _busy.difference_update((id(stand_in), device_id) for device_id in ids)


def _reserve(client: "ClientView", ids: list[int]) -> tuple[int, Any]:
    """The first stand-in of ``client`` none of whose devices with ``ids`` runs a launch for
    a handler now, with those devices marked busy."""
    for index in range(MAX_STAND_INS):
        stand_in = stand_in_of(client, index)
        wanted = {(id(stand_in), device_id) for device_id in ids}
        with _lock:
            if not wanted & _busy:
                _busy.update(wanted)
                return index, stand_in
    raise RecursionError(
        f"custom-call handlers nested {MAX_STAND_INS + 1} deep each launch a program on the "
        f"device whose program is running them (device ids {ids}); pjrt runs each level on a "
        f"stand-in client of its own and stops at {MAX_STAND_INS} "
        f"(pjrt._runtime.handler_launches.MAX_STAND_INS): end the recursion in the handler "
        f"sooner")


def _loaded_on(executable, stand_in, index: int):
    """``executable`` loaded on the stand-in ``index`` (``stand_in``), loaded on first use."""
    with _lock:
        loaded = _loaded.setdefault(executable, {}).get(index)
    if loaded is None or loaded.is_deleted():
        # The same plugin build in the same process made the bytes: nothing to verify.
        loaded = stand_in.deserialize_executable(executable.serialize(), trust_unverified=True,
                                                 isolate=False)
        with _lock:
            _loaded.setdefault(executable, {})[index] = loaded
    return loaded


def stand_in_of(client: "ClientView", index: int) -> Any:
    """The ``index``-th stand-in of ``client``, made on first use: another client of the same
    plugin, made with the same options, whose devices have launch queues of their own. It
    closes with ``client``.

    Raises:
      TypeError: ``index`` is not an int.
      ValueError: ``index`` is negative, or not below `MAX_STAND_INS`.
      ClosedClientError: ``client`` is closed.
      RuntimeError: the client spans processes (a stand-in could not join them).
    """
    if not isinstance(index, int) or isinstance(index, bool):
        raise TypeError(f"a stand-in's index is an int, not {type(index).__name__}")
    if not 0 <= index < MAX_STAND_INS:
        raise ValueError(f"a client has stand-ins 0 to {MAX_STAND_INS - 1} "
                         f"(pjrt._runtime.handler_launches.MAX_STAND_INS), not {index}")
    with _making:
        made = _stand_ins.setdefault(client, [])
        while len(made) <= index:
            client.handle  # noqa: B018 - raises ClosedClientError once closed
            if len(client.devices()) != len(client.local_devices()):
                raise RuntimeError(
                    f"a custom-call handler launched a program on the device whose program is "
                    f"running it, on a {client.platform} client spanning processes: pjrt can "
                    f"run such a launch only on a client of one process. Launch it on another "
                    f"device (compiled for another of client.devices())")
            if make_client_like is None:
                raise RuntimeError("no way to make a stand-in client is registered (pjrt.client "
                                   "registers it when imported)")
            made.append(make_client_like(client))
        return made[index]


def _forget_stand_ins_after_fork() -> None:
    # The parent's stand-ins are its clients, closed by the fork and left alone here; a thread
    # of the parent may have been making one (holding the lock) when it forked.
    global _making
    _making = threading.Lock()
    _stand_ins.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_stand_ins_after_fork)


def close_stand_ins(client: "ClientView") -> None:
    """Close the stand-ins of ``client`` (when it closes)."""
    with _making:
        made = _stand_ins.pop(client, [])
    for stand_in in made:
        stand_in.close()

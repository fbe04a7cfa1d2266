"""Global arrays whose shards live in several processes, built from each process's part.

In a job of several processes (see [`pjrt.distributed`][pjrt.distributed]) a sharding names devices of every
process, and each process holds only the shards of its own (addressable) devices. The
functions here are called by every process with the same global shape and sharding, each
passing its own data, as in jax:

* [`make_array_from_process_local_data`][pjrt.global_arrays.make_array_from_process_local_data]: this process's block of the global value.
* [`make_array_from_single_device_arrays`][pjrt.global_arrays.make_array_from_single_device_arrays]: one single-device Array per addressable device.
* [`make_array_from_callback`][pjrt.global_arrays.make_array_from_callback]: a function giving the data of any index.

An Array that spans other processes answers ``shape``, ``sharding``, ``devices()`` and
``addressable_shards``; reading its whole value on the host is refused (its other shards are
in other processes).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .array import Array, native_host, put_buffer
from .sharding import Sharding
from .transfers import batched_device_put

__all__ = ["make_array_from_process_local_data", "make_array_from_single_device_arrays",
           "make_array_from_callback"]

#: A trial extent divisible by every tile count up to 16, to count a sharding's tiles.
_TRIAL_EXTENT = 720720


def _bounds(index, extent: int) -> tuple[int, int]:
    start, stop, _ = index.indices(extent)
    return start, stop


def _infer_global_shape(sharding: Sharding, local_shape: tuple) -> tuple:
    """The global shape whose addressable blocks make up ``local_shape``: along each dimension,
    the local extent times (tiles in the whole sharding / distinct tiles held here)."""
    ndim = len(local_shape)
    trial = (_TRIAL_EXTENT,) * ndim
    tile = sharding.shard_shape(trial)
    local_map = sharding.addressable_devices_indices_map(trial)
    shape = []
    for dim in range(ndim):
        tiles = trial[dim] // tile[dim]
        held = len({_bounds(index[dim], trial[dim]) for index in local_map.values()})
        total = local_shape[dim] * tiles
        if total % held:
            raise ValueError(f"cannot infer the global shape: dimension {dim} of the local data "
                             f"({local_shape[dim]}) does not split into the {held} blocks this "
                             f"process holds; pass global_shape")
        shape.append(total // held)
    return tuple(shape)


def make_array_from_process_local_data(sharding: Sharding, local_data,
                                       global_shape: Sequence[int] | None = None) -> Array:
    """A global Array from this process's part of it.

    Along each dimension ``local_data`` is either the whole global extent (every process
    passes the same data there) or exactly the contiguous block this process's devices hold.

    Args:
      sharding: the global array's sharding (over devices of every process).
      local_data: this process's block, a numpy array or anything ``np.asarray`` takes.
      global_shape: the global shape; inferred from the sharding when None.

    Raises:
      ValueError: ``local_data`` does not match this process's block along some dimension
        (the message names it), or the sharding has no device in this process.
    """
    local = native_host(local_data)
    if global_shape is None:
        global_shape = _infer_global_shape(sharding, local.shape)
    global_shape = tuple(int(d) for d in global_shape)
    if len(global_shape) != local.ndim:
        raise ValueError(f"local data has {local.ndim} dimensions, the global shape "
                         f"{global_shape} has {len(global_shape)}")
    indices = sharding.addressable_devices_indices_map(global_shape)
    if not indices:
        raise ValueError("the sharding has no device in this process")
    offsets = []
    for dim, extent in enumerate(global_shape):
        bounds = [_bounds(index[dim], extent) for index in indices.values()]
        start, stop = min(b[0] for b in bounds), max(b[1] for b in bounds)
        if local.shape[dim] == extent:
            offsets.append(0)
        elif local.shape[dim] == stop - start:
            offsets.append(start)
        else:
            raise ValueError(f"dimension {dim} of the local data is {local.shape[dim]}; this "
                             f"process holds [{start}:{stop}] of the global {extent}, so pass "
                             f"{stop - start} (its block) or {extent} (all of it)")
    devices = list(indices)
    shards = []
    for device in devices:
        index = indices[device]
        local_index = tuple(slice(b[0] - o, b[1] - o) for b, o in
                            ((_bounds(s, e), o) for s, e, o in
                             zip(index, global_shape, offsets)))
        shards.append(local[local_index])
    return batched_device_put(global_shape, sharding, shards, devices)


def make_array_from_callback(shape: Sequence[int], sharding: Sharding,
                             data_callback: Callable) -> Array:
    """A global Array whose addressable shards are ``data_callback(index)`` (``index`` a tuple
    of slices of the global array), called once per addressable device."""
    shape = tuple(int(d) for d in shape)
    indices = sharding.addressable_devices_indices_map(shape)
    devices = list(indices)
    return batched_device_put(shape, sharding, [data_callback(indices[d]) for d in devices],
                              devices)


def make_array_from_single_device_arrays(shape: Sequence[int], sharding: Sharding,
                                         arrays: Sequence[Array]) -> Array:
    """A global Array from one single-device Array per addressable device of ``sharding``.

    The arrays stay usable: the global array holds copies of their buffers (made device to
    device where the plugin can, through the host otherwise).

    Raises:
      ValueError: the arrays' devices are not the sharding's addressable devices, or a shard
        has the wrong shape or dtype.
    """
    shape = tuple(int(d) for d in shape)
    indices = sharding.addressable_devices_indices_map(shape)
    by_device = {}
    for array in arrays:
        if len(array.shard_devices) != 1:
            raise ValueError(f"each array must be on one device; one is on "
                             f"{len(array.shard_devices)}")
        by_device[array.shard_devices[0]] = array
    if set(by_device) != set(indices) or len(arrays) != len(indices):
        raise ValueError(f"pass one array per addressable device of the sharding "
                         f"({sorted(d.id for d in indices)}); got arrays on "
                         f"{[a.shard_devices[0].id for a in arrays]}")
    expected = tuple(sharding.shard_shape(shape))
    dtype = arrays[0].dtype
    for device, array in by_device.items():
        if tuple(array.shape) != expected or array.dtype != dtype:
            raise ValueError(f"the array on {device} is {array.dtype}{list(array.shape)}; the "
                             f"sharding needs {dtype}{list(expected)} shards of {shape}")
    devices = list(indices)
    client = devices[0].client
    api = client.plugin.api
    device_to_device = api.has("PJRT_Buffer_CopyToDevice")
    buffers, holds = [], []
    try:
        with client.raw_handle.calling():
            for device in devices:
                source = by_device[device]
                if device_to_device:
                    copied = api.call_new("PJRT_Buffer_CopyToDevice",
                                          buffer=source.live_buffers()[0],
                                          dst_device=device.pointer)
                    buffers.append(copied.dst_buffer)
                    holds.append(None)
                else:
                    buffer, hold = put_buffer(client, np.asarray(source), device, 0)
                    buffers.append(buffer)
                    holds.append(hold)
    except BaseException:
        from ._pjrt_cffi import lib

        for buffer in buffers:
            lib.pjrt_shim_buffer_destroy(api.table, buffer)
        raise
    return Array(client, buffers, tuple(devices), shape, dtype, holds, sharding)

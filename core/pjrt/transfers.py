"""Placing values on devices: ``device_put`` and the batched transfers behind it.

A host value is cut into the shards a sharding asks for and each shard is sent to its device;
an Array already on devices is copied device to device where a shard with the same index
exists, and taken through the host only for shards that do not.
"""
from __future__ import annotations

import enum
import os
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ._pjrt_cffi import lib
from .array import Array, array_from_host, block_arrays_until_ready, native_host, put_buffer
from ._capi.handles import HostBufferSemantics
from ._capi.staging import (TRANSFER_THREAD_PREFIX, SharedStaging, adoptable_copy, should_stage,
                      staging_pool, staging_size)
from .device import Device
from .errors import UnsupportedFeatureError, XlaRuntimeError
from .sharding import GSPMDSharding, PmapSharding, Sharding

if TYPE_CHECKING:
    from .device import ClientView


class ArrayCopySemantics(enum.IntEnum):
    """What a copy to new shardings may do with its input (jaxlib's enum)."""

    #: Always make new buffers, even where the input is already placed as asked.
    ALWAYS_COPY = 0
    #: Return the input itself where it is already placed as asked (the default).
    REUSE_INPUT = 1
    #: Like REUSE_INPUT, and an input that was copied is deleted afterwards.
    DONATE_INPUT = 2


def _client_of(sharding: Sharding) -> "ClientView":
    devices = sharding.ordered_devices
    client = devices[0].client
    for device in devices:
        if device.client is not client:
            raise ValueError("a sharding's devices must all belong to one client")
    return client


def _memory_for(sharding: Sharding, device: Device):
    """The memory of ``device`` that ``sharding``'s memory kind names; None for the device's
    default memory (so that plugins without memory spaces keep working)."""
    kind = sharding.memory_kind
    if kind is None:
        return None
    memory = device.memory(kind)
    return None if memory == device.default_memory() else memory


def in_default_memory(sharding: Sharding) -> bool:
    """Whether ``sharding`` places its shards in each device's default memory (a plugin
    without memories has no other)."""
    try:
        return all(_memory_for(sharding, device) is None
                   for device in sharding.ordered_devices if device.is_addressable)
    except (UnsupportedFeatureError, XlaRuntimeError):
        return True


def _index_key(index) -> tuple:
    return tuple((s.start, s.stop, s.step) if isinstance(s, slice) else s for s in index)


def batched_device_put(shape: Sequence[int], sharding: Sharding, shards: Sequence,
                       devices: Sequence[Device]) -> Array:
    """Build a global Array of ``shape`` from host ``shards``, ``shards[i]`` going to
    ``devices[i]`` (the sharding's addressable devices, in its order).

    Raises:
      ValueError: a shard's shape is not the sharding's shard shape, or the devices are not
        the sharding's addressable devices.
    """
    shape = tuple(int(d) for d in shape)
    expected = tuple(sharding.shard_shape(shape))
    order = [d for d in sharding.ordered_devices if d.is_addressable]
    if list(devices) != order:
        raise ValueError("batched_device_put needs one shard per addressable device of the "
                         "sharding, in the sharding's device order")
    client = _client_of(sharding)
    hosts = [native_host(host) for host in shards]
    for host, device in zip(hosts, devices):
        if host.shape != expected:
            raise ValueError(f"the shard for {device} has shape {host.shape}; the sharding "
                             f"gives shards of shape {expected} for an array of {shape}")
        if host.dtype != hosts[0].dtype:
            raise ValueError(f"shards disagree on dtype: {hosts[0].dtype} and {host.dtype}")
    # One native call on the client for all the shards (the worker threads run inside it).
    with client.raw_handle.calling():
        placed: list = [None] * len(hosts)

        memories = [_memory_for(sharding, device) for device in devices]

        def put(i: int) -> None:
            placed[i] = put_buffer(client, hosts[i], devices[i],
                                   HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL, memories[i])

        try:
            if (len(hosts) > 1 and sum(h.nbytes for h in hosts) >= _PARALLEL_THRESHOLD_BYTES
                    and staging_pool.available(staging_size(hosts[0].nbytes)) < len(hosts)):
                # Copies into fresh memory are bound by page faults, which the cores take in
                # parallel (numpy's copy and the plugin's release the GIL); recycled memory
                # copies at memcpy speed on one thread.
                import concurrent.futures  # only large transfers need threads

                with concurrent.futures.ThreadPoolExecutor(
                        _copy_workers(), thread_name_prefix=TRANSFER_THREAD_PREFIX) as pool:
                    list(pool.map(put, range(len(hosts))))
            else:
                for i in range(len(hosts)):
                    put(i)
        except BaseException:
            made = [p for p in placed if p is not None]
            _free(client, [p[0] for p in made], [p[1] for p in made])
            raise
        buffers = [p[0] for p in placed]
        holds = [p[1] for p in placed]
        return Array(client, buffers, tuple(devices), shape, hosts[0].dtype, holds, sharding)


#: Shards of at least this many bytes in all are copied to their devices in parallel.
_PARALLEL_THRESHOLD_BYTES = 8 << 20


def _copy_workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def _free(client: "ClientView", buffers: list, holds: list) -> None:
    """Free buffers made before a failure, then wait until the plugin is done with their host
    memory (the caller's references keep it alive until then)."""
    table = client.plugin.api.table
    for buffer in buffers:
        lib.pjrt_shim_buffer_destroy(table, buffer)
    for hold in holds:
        if hold is not None:
            lib.pjrt_shim_event_await_and_destroy(table, hold[1])


def device_put(x, device: Device | Sharding | None = None) -> Array:
    """Place ``x`` (a host value or an Array) on a device or with a sharding.

    Args:
      x: a numpy array (or anything ``np.asarray`` takes) or a pjrt Array.
      device: a Device, a Sharding, or None for the default backend's first device.

    Returns:
      An Array; ``x`` itself when it is already placed that way.

    Raises:
      IndivisibleError: a dimension does not divide among its shards.
      ValueError: the target's devices span several clients.
    """
    if device is None:
        from .registry import get_backend

        device = get_backend().local_devices()[0]
    if isinstance(device, Device):
        if isinstance(x, Array) and x.shard_devices == (device,):
            return x
        if isinstance(x, Array) and len(x.shard_devices) == 1:
            return x.copy_to_device(device)
        return array_from_host(device.client, x, device,
                               HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL)
    if not isinstance(device, Sharding):
        raise TypeError(f"device_put places on a Device or a Sharding, not {type(device).__name__}")
    sharding = device
    if isinstance(x, Array):
        return batched_copy_array_to_devices_with_sharding([x], [sharding])[0]
    host = native_host(x)
    indices = sharding.addressable_devices_indices_map(host.shape)
    devices = list(indices)
    if (len(devices) > 1 and should_stage(devices[0].platform, host)
            and sharding.is_fully_replicated and in_default_memory(sharding)):
        return _put_replicated(host, sharding, devices)
    return batched_device_put(host.shape, sharding, [host[indices[d]] for d in devices], devices)


def _put_replicated(host: np.ndarray, sharding: Sharding, devices: list[Device]) -> Array:
    """``host`` whole on every device, copied from the host once: the devices all adopt one
    staging block (the CPU plugins treat adopted memory as immutable: a program given such a
    buffer to donate copies it rather than write into it)."""
    client = _client_of(sharding)
    with client.raw_handle.calling():
        client.raw_handle.recycle_host_memory()
        staged = adoptable_copy(host)
        shared = SharedStaging(staged, len(devices))
        buffers: list = []
        holds: list = []
        try:
            for device in devices:
                buffer, hold = put_buffer(client, staged, device, HostBufferSemantics.ZERO_COPY)
                buffers.append(buffer)
                holds.append((shared, hold[1]) if hold is not None else None)
        except BaseException:
            _free(client, buffers, holds)
            raise
        return Array(client, buffers, tuple(devices), host.shape, host.dtype, holds, sharding)


def batched_copy_array_to_devices_with_sharding(
        arrays: Sequence[Array], shardings: Sequence[Sharding],
        array_copy_semantics: Sequence[ArrayCopySemantics] | None = None) -> list[Array]:
    """Reshard each array to its sharding: shard by shard, device to device where the source
    has a shard with the same index, through the host otherwise.

    Args:
      arrays, shardings: one target sharding per array.
      array_copy_semantics: one [`ArrayCopySemantics`][pjrt.transfers.ArrayCopySemantics] per array (REUSE_INPUT when
        None).

    Raises:
      ValueError: a target sharding's devices belong to another client, or the sequences
        differ in length.
    """
    if array_copy_semantics is None:
        array_copy_semantics = [ArrayCopySemantics.REUSE_INPUT] * len(arrays)
    if not len(arrays) == len(shardings) == len(array_copy_semantics):
        raise ValueError(f"{len(arrays)} arrays, {len(shardings)} shardings and "
                         f"{len(array_copy_semantics)} copy semantics: give one of each per "
                         f"array")
    results = []
    for array, sharding, semantics in zip(arrays, shardings, array_copy_semantics):
        semantics = ArrayCopySemantics(semantics)
        if semantics == ArrayCopySemantics.ALWAYS_COPY:
            results.append(_reshard(array, sharding))
            continue
        if is_placed_as(array, sharding):
            results.append(array)
            continue
        results.append(_reshard(array, sharding))
        if semantics == ArrayCopySemantics.DONATE_INPUT:
            array.delete()
    return results


def is_placed_as(array: Array, sharding: Sharding) -> bool:
    """Whether ``array`` is laid out as ``sharding`` says, so that ``device_put(array,
    sharding)`` returns it as it is: its sharding is ``sharding`` or an equal one, or an
    equivalent one (`Sharding.is_equivalent_to`) with the shards in the sharding's device
    order and in the memory kind it names.

    Cheap when asked again for the same objects (a program call asks it of each argument)."""
    mine = array.sharding
    if mine is sharding:
        return True
    if not mine.is_equivalent_to(sharding, array.ndim):
        return mine == sharding
    # Equivalent: the same devices in the same order, though the shards may be listed in
    # another order, and the buffers may sit in another memory than their sharding says.
    return ((array.shard_devices == tuple(sharding.ordered_devices)
             and _same_memory(array, sharding)) or mine == sharding)


def _same_memory(array: Array, sharding: Sharding) -> bool:
    kind = sharding.memory_kind
    if kind is None:
        return True
    return array.memory_kind == kind  # (asked of the plugin once, then kept on the Array)


def _reshard(array: Array, sharding: Sharding) -> Array:
    client = _client_of(sharding)
    target = sharding.addressable_devices_indices_map(array.shape)
    sources = {}
    # Device-side copies keep a layout other than row-major; the new array's shards must all
    # be laid out alike, so such an array is resharded through the host (row-major).
    same_client = client is array.client and array.stored_order is None
    if same_client:
        for shard in array.addressable_shards:
            sources.setdefault(_index_key(shard.index), {})[shard.device] = shard
    with client.raw_handle.calling():  # one native call for every copy and transfer
        host = None
        buffers, holds = [], []
        api = client.plugin.api
        try:
            for device, index in target.items():
                candidates = sources.get(_index_key(index), {})
                shard = candidates.get(device) or next(iter(candidates.values()), None)
                memory = _memory_for(sharding, device)
                if shard is not None:
                    source = shard.data.live_buffers()[0]
                    if memory is not None:
                        copied = api.call_new("PJRT_Buffer_CopyToMemory", buffer=source,
                                              dst_memory=memory.pointer)
                    else:
                        copied = api.call_new("PJRT_Buffer_CopyToDevice", buffer=source,
                                              dst_device=device.pointer)
                        if sharding.memory_kind is not None and \
                                shard.data.memory_kind != sharding.memory_kind:
                            # A copy to a device lands in its default memory; from a host memory
                            # back to device memory, ask for that memory by name.
                            lib.pjrt_shim_buffer_destroy(api.table, copied.dst_buffer)
                            copied = api.call_new("PJRT_Buffer_CopyToMemory", buffer=source,
                                                  dst_memory=device.default_memory().pointer)
                    buffers.append(copied.dst_buffer)
                    holds.append(None)
                    continue
                if host is None:
                    host = np.asarray(array)
                buffer, hold = put_buffer(client, np.ascontiguousarray(host[index]) if host.ndim
                                          else host, device,
                                          HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL, memory)
                buffers.append(buffer)
                holds.append(hold)
        except BaseException:
            _free(client, buffers, holds)
            raise
        return Array(client, buffers, tuple(target), array.shape, array.dtype, holds, sharding)


def reorder_shards(x: Array, dst_sharding: Sharding,
                   array_copy_semantics: ArrayCopySemantics = ArrayCopySemantics.REUSE_INPUT
                   ) -> Array:
    """``x`` with its shards moved to ``dst_sharding``'s devices (same layout, other order)."""
    return batched_copy_array_to_devices_with_sharding([x], [dst_sharding],
                                                       [array_copy_semantics])[0]


def replicate(x, devices: Sequence[Device]) -> Array:
    """A global Array holding the whole of ``x`` on every device in ``devices``."""
    return device_put(x, GSPMDSharding.get_replicated(list(devices)))


def shard_along_axis(x, devices: Sequence[Device], axis: int = 0) -> Array:
    """A global Array with ``x[i]`` (along ``axis``) on ``devices[i]`` (a PmapSharding)."""
    return device_put(x, PmapSharding(list(devices), axis))


def batched_block_until_ready(arrays: Sequence[Array]) -> list[Array]:
    """Wait until every array's value is computed; returns them.

    Arrays of one client are waited on together, in one native wait (see
    `pjrt.array.block_arrays_until_ready`); any other value by its own
    ``block_until_ready()``.
    """
    arrays = list(arrays)
    if all(type(array) is Array for array in arrays):
        block_arrays_until_ready(arrays)
    else:
        for array in arrays:
            array.block_until_ready()
    return arrays


block_until_ready = batched_block_until_ready

__all__ = ["ArrayCopySemantics", "device_put", "batched_device_put", "batched_copy_array_to_devices_with_sharding",
           "is_placed_as", "reorder_shards", "replicate", "shard_along_axis", "batched_block_until_ready",
           "block_until_ready"]

"""Staging memory for host-to-device copies on plugins whose device memory is host memory.

A CPU plugin copies a host array it is given at about half of memcpy speed; pjrt instead copies
a large array once into an aligned block the plugin adopts as the device buffer. When the
plugin lets go of a block (its done-with-host-buffer event fires), the block goes back to a
pool, so a later transfer of the same size writes into pages that are already faulted in.
"""
from __future__ import annotations

import os
import threading

import numpy as np

from . import handles

#: Host arrays at least this large are copied to staging memory by several threads.
PARALLEL_COPY_BYTES = 16 << 20
#: Host arrays at least this large go through staging memory. Below it, XLA's CPU plugin
#: copies them itself as fast (about 5 µs up to 64 KiB); above its own small-copy limit
#: (100 KiB) it copies into fresh pages at a few GB/s, 8x slower than a staging copy.
STAGING_THRESHOLD_BYTES = 100 << 10
#: The same for a program call's own numpy arguments (pjrt._runtime.numpy_arguments), one
#: device each. The plugin frees its copy as soon as the program is done, and its allocator
#: hands that warm memory back on the next call, so its own copy keeps up with staging until
#: its allocator maps fresh pages instead (measured: 1 MiB 0.22 against 0.28 ms staged,
#: 16 MiB 3.2 against 2.5 ms, 64 MiB 44 against 8.5 ms).
CALL_STAGING_THRESHOLD_BYTES = 8 << 20
#: Dtypes packed below a byte on the device: the plugin converts them, so it must copy.
PACKED_DTYPE_NAMES = frozenset({"int4", "uint4", "int2", "uint2", "float4_e2m1fn"})
#: Alignment XLA's CPU runtime needs to adopt host memory instead of copying it.
ADOPTABLE_ALIGNMENT = 64
#: Names of the threads that place shards in parallel (they copy without more threads).
TRANSFER_THREAD_PREFIX = "pjrt-transfer"


class StagingBlock(np.ndarray):
    """Host memory pjrt allocated for a plugin to adopt as a device buffer.

    The type marks it, so that when the plugin is done with it the block goes back to
    `staging_pool` instead of to the allocator: a later transfer of the same size then
    writes into pages that are already faulted in, at memcpy speed.
    """


class StagingPool:
    """Recycled staging blocks, by size, within a cap on the memory kept idle."""

    def __init__(self, per_size: int, max_bytes: int):
        self._per_size = per_size
        self._max_bytes = max_bytes
        self._blocks: dict[int, list] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray | None:
        with self._lock:
            blocks = self._blocks.get(nbytes)
            if not blocks:
                return None
            self._bytes -= nbytes
            return blocks.pop()

    def available(self, nbytes: int) -> int:
        """How many idle blocks of ``nbytes`` there are."""
        with self._lock:
            return len(self._blocks.get(nbytes, ()))

    def give_back(self, host) -> None:
        if not isinstance(host, StagingBlock):
            return  # the caller's own memory (ZERO_COPY): never reused
        block = host
        while isinstance(block.base, np.ndarray):
            block = block.base
        nbytes = block.nbytes
        with self._lock:
            blocks = self._blocks.setdefault(nbytes, [])
            if len(blocks) < self._per_size and self._bytes + nbytes <= self._max_bytes:
                blocks.append(block)
                self._bytes += nbytes

    def clear(self) -> None:
        """Return every idle block to the allocator."""
        with self._lock:
            self._blocks.clear()
            self._bytes = 0


#: Staging blocks kept for reuse: enough for a sharded placement over 8 devices, capped.
staging_pool = StagingPool(per_size=8, max_bytes=512 << 20)


def should_stage(platform: str, host: np.ndarray, threshold: int | None = None) -> bool:
    """Whether a copy of ``host`` to a ``platform`` device goes through staging memory
    (``threshold``: the smallest size that does, `STAGING_THRESHOLD_BYTES` if None)."""
    return (host.nbytes >= (STAGING_THRESHOLD_BYTES if threshold is None else threshold)
            and platform == "cpu" and host.dtype.name not in PACKED_DTYPE_NAMES)


class SharedStaging:
    """One staging block adopted by several device buffers (a replicated value copied from
    the host once): it goes back to the pool when the last of them lets go."""

    __slots__ = ("block", "users", "_lock")

    def __init__(self, block: np.ndarray, users: int):
        self.block = block
        self.users = users
        self._lock = threading.Lock()

    def let_go(self) -> None:
        with self._lock:
            self.users -= 1
            last = self.users == 0
        if last:
            staging_pool.give_back(self.block)


def staging_size(nbytes: int) -> int:
    """The size of the staging block a host array of ``nbytes`` is copied into."""
    return nbytes + ADOPTABLE_ALIGNMENT


def recycle_staging(host) -> None:
    """Called when a plugin no longer needs host memory it adopted."""
    if type(host) is SharedStaging:
        host.let_go()
    else:
        staging_pool.give_back(host)


handles.host_memory_released = recycle_staging


def release_staging_memory() -> None:
    """Free the host memory pjrt keeps for reuse by later host-to-device transfers."""
    staging_pool.clear()


#: Threads a large copy into fresh staging memory is split over (os.cpu_count() is a system
#: call: read once).
_COPY_WORKERS = min(os.cpu_count() or 1, 8)


def adoptable_copy(host: np.ndarray) -> np.ndarray:
    """A copy of ``host`` aligned so that a CPU plugin can use it as the device buffer.

    The memory comes from recycled staging blocks when one of the size is idle. Large copies
    into fresh memory are split over threads: the time goes into faulting in its pages, which
    the cores do in parallel (numpy's copy releases the GIL).
    """
    size = staging_size(host.nbytes)
    raw = staging_pool.take(size)
    fresh = raw is None
    if fresh:
        raw = np.empty(size, np.uint8)
    offset = -raw.ctypes.data % ADOPTABLE_ALIGNMENT
    staged = raw.view(StagingBlock)[offset:offset + host.nbytes].view(host.dtype).reshape(host.shape)
    workers = _COPY_WORKERS
    # Threads pay off only against page faults: recycled memory copies at memcpy speed.
    if (not fresh or host.nbytes < PARALLEL_COPY_BYTES or workers < 2 or host.ndim == 0
            or threading.current_thread().name.startswith(TRANSFER_THREAD_PREFIX)):
        np.copyto(staged, host)
        return staged
    source, target = host.reshape(-1), staged.reshape(-1)
    bounds = np.linspace(0, source.size, workers + 1, dtype=np.int64)

    def copy(i: int) -> None:
        np.copyto(target[bounds[i]:bounds[i + 1]], source[bounds[i]:bounds[i + 1]])

    import concurrent.futures  # only large copies need threads; keep it off the import path

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(copy, range(workers)))
    return staged

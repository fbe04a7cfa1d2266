"""Staging memory (staging.py): the aligned host blocks a CPU plugin adopts as device buffers,
recycled once the plugin lets go of them, on the real CPU plugins."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import pjrt
from pjrt._capi import staging

LARGE = 1 << 17  # float32 elements: 512 KiB, above the size read through a view


@pytest.fixture
def empty_pool():
    """The process's staging pool, emptied before and after the test."""
    staging.release_staging_memory()
    yield staging.staging_pool
    staging.release_staging_memory()


def test_large_host_array_is_copied_once_and_not_aliased(client):
    host = np.arange(LARGE, dtype=np.float32)
    array = client.buffer_from_pyval(host)
    host[:] = -1  # the default semantics copy: later changes to the source do not show
    np.testing.assert_array_equal(np.asarray(array)[:5], np.arange(5, dtype=np.float32))


def test_staging_memory_is_recycled_and_never_the_callers(client):
    """Large transfers reuse staging blocks the plugin let go of; a caller's own memory handed
    over with ZERO_COPY is never reused for anything else."""
    from pjrt._capi import staging

    staging.release_staging_memory()
    size = staging.staging_size(LARGE * 4 * 8)
    first = client.buffer_from_pyval(np.full(LARGE * 8, 1.0, np.float32))
    first.delete()
    gc.collect()
    assert staging.staging_pool.available(size) == 1
    second = client.buffer_from_pyval(np.full(LARGE * 8, 2.0, np.float32))
    assert staging.staging_pool.available(size) == 0  # the block was taken again
    np.testing.assert_array_equal(np.asarray(second)[:3], [2, 2, 2])

    mine = np.full(LARGE * 8, 5.0, np.float32)
    adopted = client.buffer_from_pyval(mine, host_buffer_semantics=pjrt.HostBufferSemantics.ZERO_COPY)
    adopted.delete()
    gc.collect()
    third = client.buffer_from_pyval(np.full(LARGE * 8, 7.0, np.float32))
    np.testing.assert_array_equal(mine[:3], [5, 5, 5])  # untouched by the later transfer
    np.testing.assert_array_equal(np.asarray(third)[:3], [7, 7, 7])
    staging.release_staging_memory()


@pytest.mark.parametrize("shape, dtype", [
    ((), np.float64), ((7,), np.int8), ((3, 5), np.complex64), ((1 << 18,), np.float32),
    ((5 << 20,), np.float32),  # 20 MiB: copied by several threads into fresh memory
])
def test_adoptable_copy_is_aligned_and_exact(empty_pool, shape, dtype):
    host = np.random.default_rng(5).standard_normal(shape).astype(dtype)
    staged = staging.adoptable_copy(host)
    assert isinstance(staged, staging.StagingBlock)
    assert staged.ctypes.data % staging.ADOPTABLE_ALIGNMENT == 0
    assert staged.shape == host.shape and staged.dtype == host.dtype
    assert not np.shares_memory(staged, host)
    np.testing.assert_array_equal(staged, host)


def test_a_block_given_back_is_taken_again(empty_pool):
    host = np.arange(LARGE, dtype=np.float32)
    size = staging.staging_size(host.nbytes)
    assert size == host.nbytes + staging.ADOPTABLE_ALIGNMENT
    first = staging.adoptable_copy(host)
    address = first.ctypes.data
    staging.recycle_staging(first)
    del first
    assert empty_pool.available(size) == 1
    second = staging.adoptable_copy(host[::-1].copy())
    assert empty_pool.available(size) == 0
    assert second.ctypes.data == address  # the same pages, already faulted in
    np.testing.assert_array_equal(second, host[::-1])


def test_the_pool_keeps_only_staging_blocks_within_its_caps():
    pool = staging.StagingPool(per_size=2, max_bytes=3 * (1024 + staging.ADOPTABLE_ALIGNMENT))
    pool.give_back(np.zeros(1024, np.uint8))  # the caller's own memory: never kept
    assert pool.available(1024) == 0
    blocks = [np.empty(1024 + staging.ADOPTABLE_ALIGNMENT, np.uint8).view(staging.StagingBlock)
              for _ in range(4)]
    size = blocks[0].nbytes
    for block in blocks[:3]:
        pool.give_back(block[8:16])  # a view: the whole block goes back
    assert pool.available(size) == 2  # per_size
    other = np.empty(2 * size, np.uint8).view(staging.StagingBlock)
    pool.give_back(other)
    assert pool.available(2 * size) == 0  # over max_bytes
    assert pool.take(size) is not None and pool.available(size) == 1
    pool.clear()
    assert pool.available(size) == 0 and pool.take(size) is None


@pytest.mark.parametrize("elements", [1 << 18, 5 << 20])
def test_large_transfers_through_staging_arrive_exactly(client, empty_pool, elements):
    """1 MiB and more go through a staging block (20 MiB: copied by several threads)."""
    host = np.random.default_rng(2).standard_normal(elements).astype(np.float32)
    array = client.buffer_from_pyval(host, client.devices()[1])
    np.testing.assert_array_equal(np.asarray(array), host)
    array.delete()


def test_packed_dtypes_are_not_staged(client, empty_pool):
    """Sub-byte types are packed by the plugin, so their host copy cannot be adopted."""
    import ml_dtypes

    host = (np.arange(2 << 20) % 8).astype(ml_dtypes.int4)
    array = client.buffer_from_pyval(host)
    assert array.on_device_size_in_bytes() < host.nbytes
    np.testing.assert_array_equal(np.asarray(array).view(np.int8), host.view(np.int8))
    array.delete()
    gc.collect()
    assert empty_pool.available(staging.staging_size(host.nbytes)) == 0


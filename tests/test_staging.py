"""Staging memory (staging.py): the aligned host blocks a CPU plugin adopts as device buffers,
recycled once the plugin lets go of them, on the real CPU plugins."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import pjrt
from pjrt import staging

LARGE = 1 << 17  # float32 elements: 512 KiB, above the size read through a view


def test_large_host_array_is_copied_once_and_not_aliased(client):
    host = np.arange(LARGE, dtype=np.float32)
    array = client.buffer_from_pyval(host)
    host[:] = -1  # the default semantics copy: later changes to the source do not show
    np.testing.assert_array_equal(np.asarray(array)[:5], np.arange(5, dtype=np.float32))


def test_staging_memory_is_recycled_and_never_the_callers(client):
    """Large transfers reuse staging blocks the plugin let go of; a caller's own memory handed
    over with ZERO_COPY is never reused for anything else."""
    from pjrt import staging

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

"""Arrays: host transfers of every dtype, lifetimes, copies, readiness."""
from __future__ import annotations

import gc

import ml_dtypes
import numpy as np
import pytest

import pjrt

STANDARD_DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                   np.uint32, np.uint64, np.float16, np.float32, np.float64, np.complex64,
                   np.complex128, ml_dtypes.bfloat16]
FLOAT8_DTYPES = [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3b11fnuz,
                 ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2fnuz]
# Held one element per byte on the host and packed on the device; the plugin converts.
SUB_BYTE_DTYPES = [ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2,
                   ml_dtypes.float4_e2m1fn]


def _sample(dtype, shape=(3, 5)):
    rng = np.random.default_rng(7)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -100), min(info.max, 100), shape).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", STANDARD_DTYPES + FLOAT8_DTYPES, ids=lambda d: np.dtype(d).name)
def test_round_trip_every_dtype(client, dtype):
    host = _sample(dtype)
    array = client.buffer_from_pyval(host)
    assert array.shape == host.shape and array.dtype == host.dtype
    assert array.nbytes == host.nbytes
    back = np.asarray(array)
    assert back.dtype == host.dtype
    np.testing.assert_array_equal(back.view(np.uint8), host.view(np.uint8))


@pytest.mark.parametrize("dtype", SUB_BYTE_DTYPES, ids=lambda d: np.dtype(d).name)
def test_round_trip_sub_byte_dtypes(client, dtype):
    host = np.array([[1, 0, 1], [0, 1, 1], [1, 1, 0]], dtype=dtype)  # representable in all
    array = client.buffer_from_pyval(host)
    assert array.dtype == host.dtype and array.shape == (3, 3)
    assert array.on_device_size_in_bytes() < host.nbytes  # packed on the device
    np.testing.assert_array_equal(np.asarray(array).view(np.uint8), host.view(np.uint8))


@pytest.mark.parametrize("shape", [(), (0,), (0, 3), (1,), (2, 3, 4), (1, 1, 1, 1, 7)])
def test_round_trip_shapes(client, shape):
    host = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    array = client.buffer_from_pyval(host)
    assert array.shape == shape and array.ndim == len(shape)
    np.testing.assert_array_equal(np.asarray(array), host)


def test_non_contiguous_input(client):
    host = np.arange(24, dtype=np.int32).reshape(4, 6)[:, ::2].T
    np.testing.assert_array_equal(np.asarray(client.buffer_from_pyval(host)), host)


def test_python_scalars_and_lists(client):
    assert np.asarray(client.buffer_from_pyval(3.5)) == 3.5
    np.testing.assert_array_equal(np.asarray(client.buffer_from_pyval([[1, 2], [3, 4]])),
                                  [[1, 2], [3, 4]])


def test_unsupported_dtype_is_a_type_error(client):
    with pytest.raises(TypeError, match="dtype object"):
        client.buffer_from_pyval(np.array(["a", "b"], dtype=object))


@pytest.mark.parametrize("semantics", list(pjrt.HostBufferSemantics))
def test_every_host_buffer_semantics(client, semantics):
    host = np.arange(1024, dtype=np.float32)
    array = client.buffer_from_pyval(host, host_buffer_semantics=semantics)
    del host
    gc.collect()
    np.testing.assert_array_equal(np.asarray(array), np.arange(1024, dtype=np.float32))


def test_host_reads_are_read_only_views_of_the_buffer(client):
    array = client.buffer_from_pyval(np.arange(4.0))
    first = np.asarray(array)
    assert np.shares_memory(np.asarray(array), first)
    assert first.ctypes.data == array.unsafe_buffer_pointer()
    with pytest.raises(ValueError):
        first[0] = 7
    assert np.asarray(array, dtype=np.float32).dtype == np.float32


def test_delete_and_use_after_delete(client):
    array = client.buffer_from_pyval(np.ones(3))
    array.delete()
    array.delete()
    assert array.is_deleted()
    for use in (np.asarray, lambda a: a.block_until_ready(), lambda a: a.copy_to_device(a.client.devices()[1])):
        with pytest.raises(pjrt.DeletedArrayError, match="deleted"):
            use(array)
    assert "deleted" in repr(array)


def test_copy_to_device(client):
    source = client.buffer_from_pyval(np.arange(10, dtype=np.int64), client.devices()[0])
    target = client.devices()[6]
    copy = source.copy_to_device(target)
    assert copy.device is target and source.device is client.devices()[0]
    np.testing.assert_array_equal(np.asarray(copy), np.arange(10))
    source.delete()
    np.testing.assert_array_equal(np.asarray(copy), np.arange(10))


def test_block_until_ready_and_is_ready(client):
    array = client.buffer_from_pyval(np.arange(6.0))
    assert array.block_until_ready() is array
    assert array.is_ready()
    assert pjrt.block_until_ready([array]) == [array]


def test_memory_kind_and_sizes(client):
    array = client.buffer_from_pyval(np.zeros((4, 4), np.float32))
    assert array.memory_kind == "device"
    assert array.on_device_size_in_bytes() >= 64
    assert array.unsafe_buffer_pointer() != 0


def test_arrays_are_freed_when_garbage_collected(client):
    gc.collect()  # arrays earlier tests left in reference cycles
    before = len(client.live_arrays())
    for _ in range(500):
        client.buffer_from_pyval(np.ones(16, np.float32))
    gc.collect()
    assert len(client.live_arrays()) == before


def test_scalar_conversions(client):
    array = client.buffer_from_pyval(np.float32(2.5))
    assert float(array) == 2.5 and array.item() == 2.5
    assert int(client.buffer_from_pyval(np.int32(7))) == 7
    assert len(client.buffer_from_pyval(np.arange(5))) == 5
    with pytest.raises(TypeError):
        len(array)


LARGE = 1 << 17  # float32 elements: 512 KiB


def test_large_host_resident_array_is_read_without_a_copy(client):
    array = client.buffer_from_pyval(np.arange(LARGE, dtype=np.float32))
    view = np.asarray(array)
    assert view.ctypes.data == array.unsafe_buffer_pointer()
    assert not view.flags.writeable
    np.testing.assert_array_equal(view, np.arange(LARGE, dtype=np.float32))
    assert np.asarray(array).ctypes.data == view.ctypes.data  # every read: the buffer


def test_donating_a_viewed_array_copies_instead(client):
    text = """
    func.func public @main(%x: tensor<131072xf32> {tf.aliasing_output = 0 : i32}) -> tensor<131072xf32> {
      %one = stablehlo.constant dense<1.0> : tensor<131072xf32>
      %0 = stablehlo.add %x, %one : tensor<131072xf32>
      return %0 : tensor<131072xf32>
    }"""
    executable = client.compile_and_load(text)
    x = client.buffer_from_pyval(np.zeros(LARGE, np.float32))
    view = np.asarray(x)
    (y,) = executable.execute([x])
    np.testing.assert_array_equal(np.asarray(y)[:3], [1, 1, 1])
    assert not x.is_deleted()  # not consumed: numpy was reading it
    np.testing.assert_array_equal(view[:3], [0, 0, 0])
    del view
    gc.collect()
    (z,) = executable.execute([x])
    assert x.is_deleted()  # nothing views it now: donated as the program asks
    np.testing.assert_array_equal(np.asarray(z)[:3], [1, 1, 1])


def test_a_deleted_array_is_not_read_from_its_cache(client):
    array = client.buffer_from_pyval(np.arange(4.0))
    np.asarray(array)
    array.delete()
    with pytest.raises(pjrt.DeletedArrayError):
        np.asarray(array)


def test_asarray_refuses_a_conversion_when_no_copy_is_allowed(client):
    array = client.buffer_from_pyval(np.arange(4, dtype=np.float32))
    with pytest.raises(ValueError, match="copy=False"):
        np.asarray(array, dtype=np.int32, copy=False)
    assert np.asarray(array, dtype=np.int32).dtype == np.int32


def test_big_endian_input_is_stored_in_native_order(client):
    host = np.arange(6, dtype=">f4")
    array = client.buffer_from_pyval(host)
    assert array.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(array), np.arange(6, dtype=np.float32))

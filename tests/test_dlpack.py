"""DLPack both ways, against the real CPU plugins, with numpy and jax as the other side."""
from __future__ import annotations

import gc
import sys

import ml_dtypes
import numpy as np
import pytest

import pjrt
from pjrt.dlpack import SUPPORTED_DTYPES, from_dlpack

jax = pytest.importorskip("jax")
jnp = jax.numpy

#: dtypes numpy's own from_dlpack takes (DLPack's int, uint, float, complex and bool).
NUMPY_DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                np.uint32, np.uint64, np.float16, np.float32, np.float64, np.complex64,
                np.complex128]


def _values(dtype, shape=(3, 5)) -> np.ndarray:
    rng = np.random.default_rng(7)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _bits(value) -> bytes:
    return np.ascontiguousarray(np.asarray(value)).view(np.uint8).tobytes()


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_reads_an_array_without_a_copy_bit_exact(device, dtype):
    host = _values(dtype)
    array = device.client.buffer_from_pyval(host, device)
    seen = np.from_dlpack(array)
    assert seen.dtype == host.dtype and seen.shape == host.shape
    assert _bits(seen) == _bits(host)
    assert seen.ctypes.data == array.unsafe_buffer_pointer()
    assert not seen.flags.writeable  # an Array never changes


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_from_dlpack_of_numpy_bit_exact(device, dtype):
    host = _values(dtype)
    array = from_dlpack(host, device)
    assert array.dtype == host.dtype and array.shape == host.shape
    assert _bits(array) == _bits(host)


def test_every_supported_dtype_round_trips(device):
    # ml_dtypes' types (bfloat16, float8) travel through pjrt's own capsules both ways.
    assert np.dtype(ml_dtypes.bfloat16) in SUPPORTED_DTYPES
    for dtype in SUPPORTED_DTYPES:
        host = _values(np.float32).astype(dtype) if dtype.kind not in "biuc" else _values(dtype)
        array = device.client.buffer_from_pyval(host, device)
        again = from_dlpack(array, device)
        assert again.dtype == dtype
        assert _bits(again) == _bits(host), dtype


def _aligned(count: int, dtype, alignment: int = 64, offset: int = 0) -> np.ndarray:
    """``count`` elements at ``offset`` bytes past an ``alignment`` boundary."""
    itemsize = np.dtype(dtype).itemsize
    raw = np.zeros(count * itemsize + 2 * alignment, np.uint8)
    start = (-raw.ctypes.data) % alignment + offset
    out = raw[start:start + count * itemsize].view(dtype)
    out[...] = np.arange(count)
    return out


def test_zero_copy_from_aligned_numpy_and_lifetime(device):
    host = _aligned(4096, np.float32)
    before = sys.getrefcount(host)
    array = from_dlpack(host, device)
    assert array.unsafe_buffer_pointer() == host.ctypes.data  # a view, no copy
    assert sys.getrefcount(host) > before  # the producer's capsule keeps numpy's array
    host[0] = 42.0  # the producer may change its memory: the view shows it (as in jax)
    assert float(np.asarray(array)[0]) == 42.0
    del array
    gc.collect()
    assert sys.getrefcount(host) == before  # freed through the client: the deleter ran


def test_misaligned_memory_is_copied_or_refused(device):
    host = _aligned(1000, np.float32, offset=4)  # XLA's CPU buffers must be aligned
    array = from_dlpack(host, device)
    assert np.array_equal(np.asarray(array), host)
    if array.unsafe_buffer_pointer() != host.ctypes.data:
        with pytest.raises(BufferError, match="cannot view"):
            from_dlpack(host, device, copy=False)


def test_copy_true_copies_and_strided_input_is_copied(device):
    host = np.arange(32, dtype=np.int32)
    copied = from_dlpack(host, device, copy=True)
    assert copied.unsafe_buffer_pointer() != host.ctypes.data
    strided = from_dlpack(host[::2], device)
    assert np.array_equal(np.asarray(strided), host[::2])
    assert strided.unsafe_buffer_pointer() != host.ctypes.data
    with pytest.raises(BufferError, match="row-major"):
        from_dlpack(host[::2], device, copy=False)


def test_transposed_and_scalar_inputs(device):
    host = np.arange(12.0).reshape(3, 4)
    assert np.array_equal(np.asarray(from_dlpack(host.T, device)), host.T)
    scalar = from_dlpack(np.array(2.5), device)
    assert scalar.shape == () and float(scalar) == 2.5
    empty = from_dlpack(np.zeros((0, 3), np.float32), device)
    assert empty.shape == (0, 3)


def test_exported_buffer_outlives_delete_and_client_keeps_it(client):
    device = client.local_devices()[1]
    array = client.buffer_from_pyval(np.arange(100_000, dtype=np.float64), device)
    seen = np.from_dlpack(array)
    array.delete()
    assert array.is_deleted()
    del array
    gc.collect()
    assert seen[-1] == 99_999.0  # the capsule's hold kept the buffer
    assert float(seen.sum()) == float(np.arange(100_000).sum())


def test_capsule_protocol_versions(device):
    array = device.client.buffer_from_pyval(np.ones(4, np.float32), device)
    assert type(array.__dlpack__()).__name__ == "PyCapsule"
    assert array.__dlpack_device__() == (1, 0)
    legacy = array.__dlpack__()
    versioned = array.__dlpack__(max_version=(1, 0))
    del legacy, versioned  # unconsumed capsules delete their tensors
    gc.collect()
    assert np.array_equal(np.from_dlpack(array), np.ones(4))
    with pytest.raises(BufferError, match="stream"):
        array.__dlpack__(stream=1)
    host_copy = np.from_dlpack(array, copy=True)
    assert host_copy.ctypes.data != array.unsafe_buffer_pointer()
    assert np.from_dlpack(array, device="cpu").ctypes.data == array.unsafe_buffer_pointer()


def test_legacy_capsule_accepted_once(device):
    capsule = np.arange(3.0).__dlpack__()
    array = from_dlpack(capsule, device)
    assert array.tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(BufferError, match="consumed at most once") as raised:
        from_dlpack(capsule, device)
    # jaxlib raises a RuntimeError here: code written for it catches this one too.
    assert isinstance(raised.value, pjrt.errors.ConsumedCapsuleError)
    assert isinstance(raised.value, RuntimeError)


def test_sharded_arrays_are_refused(client):
    devices = client.local_devices()[:2]
    array = pjrt.replicate(np.ones(4), devices)
    with pytest.raises(BufferError, match="shards"):
        array.__dlpack__()
    shard = array.addressable_shards[1].data
    assert np.array_equal(np.from_dlpack(shard), np.ones(4))


def test_bad_inputs(device):
    with pytest.raises(TypeError, match="__dlpack__"):
        from_dlpack([1, 2, 3], device)
    with pytest.raises(TypeError, match="Device"):
        from_dlpack(np.ones(2), device="cpu")


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_, np.complex64,
                                   ml_dtypes.bfloat16, np.uint8, np.float16],
                         ids=lambda d: np.dtype(d).name)
def test_jax_both_ways(device, dtype):
    host = _values(np.float32).astype(dtype) if np.dtype(dtype).kind == "V" or \
        np.dtype(dtype) == ml_dtypes.bfloat16 else _values(dtype)
    # jax reads a pjrt Array ...
    array = device.client.buffer_from_pyval(host, device)
    seen = jnp.from_dlpack(array)
    assert _bits(seen) == _bits(host)
    # ... and pjrt reads a jax array, without a copy.
    source = jnp.asarray(host)
    taken = from_dlpack(source, device)
    assert _bits(taken) == _bits(host)
    assert taken.unsafe_buffer_pointer() == source.unsafe_buffer_pointer()
    del source
    gc.collect()
    assert _bits(taken) == _bits(host)  # the jax buffer lives while pjrt's view does


def test_torch_both_ways(device):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed in this environment")
    tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    array = from_dlpack(tensor, device)
    assert array.unsafe_buffer_pointer() == tensor.data_ptr()
    back = torch.from_dlpack(array)
    assert torch.equal(back, tensor)
    assert back.data_ptr() == array.unsafe_buffer_pointer()
    for dtype in (torch.bfloat16, torch.float16, torch.int8, torch.bool, torch.complex64,
                  torch.uint8, torch.int64, torch.float64):
        source = (torch.randn(5, 3) * 7).to(dtype)
        mine = from_dlpack(source, device)
        assert _bits(mine) == source.view(torch.uint8).numpy().tobytes() if dtype not in (
            torch.bool,) else np.array_equal(np.asarray(mine), source.numpy())
        assert torch.equal(torch.from_dlpack(mine), source)


def test_default_device_is_the_cpu_backends_first():
    array = from_dlpack(np.arange(3.0))
    assert array.device == pjrt.get_backend("cpu").local_devices()[0]
    assert array.tolist() == [0.0, 1.0, 2.0]

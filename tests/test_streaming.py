"""Streamed host-to-device transfers (pjrt.streaming, pjrt._capi.transfer_manager) on both
real CPU plugins: buffers filled chunk by chunk reassemble to the right values, programs
launched before the last chunk compute the right result, producers' errors reach readers, bad
input is refused before the plugin sees it (XLA's managers end the process on most misuse),
and the manager is freed once, before its client, at close, collection, client close and
exit, leaving nothing behind."""
from __future__ import annotations

import gc
import itertools
import json
import os
import shutil
import threading
import weakref

import ml_dtypes
import numpy as np
import pytest

import pjrt
from pjrt._capi import transfer_manager
from pjrt._pjrt_cffi import ffi
from pjrt.shapes import Shape
from pjrt.streaming import Transfer, TransferManager

from conftest import child_env, cpu_plugin_path, run_python


def affine_program(shape: tuple, dtype: str = "f32") -> str:
    """``x * 2 + 1`` of one array of ``shape``."""
    tensor = f"tensor<{'x'.join(map(str, shape))}{'x' if shape else ''}{dtype}>"
    return f"""
func.func public @main(%x: {tensor}) -> {tensor} {{
  %two = stablehlo.constant dense<2.0> : {tensor}
  %one = stablehlo.constant dense<1.0> : {tensor}
  %0 = stablehlo.multiply %x, %two : {tensor}
  %1 = stablehlo.add %0, %one : {tensor}
  return %1 : {tensor}
}}"""


def make_manager(client, specs, device=None) -> TransferManager:
    device = device or client.local_devices()[0]
    return client.create_buffers_for_async_host_to_device(specs, device.default_memory())


def values(shape: tuple, dtype) -> np.ndarray:
    """Distinct values of ``dtype`` (so that a misplaced chunk shows)."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    if dtype == np.bool_:
        return (np.arange(count) % 3 == 0).reshape(shape)
    if dtype.kind == "c":
        return (np.arange(count) + 1j * np.arange(count)[::-1]).astype(dtype).reshape(shape)
    if dtype.kind in "iu":
        return (np.arange(count) % 120).astype(dtype).reshape(shape)
    return (np.arange(count) / 8).astype(dtype).reshape(shape)


# -- the entry, on both plugins ----------------------------------------------------------------

def test_both_cpu_plugins_provide_transfer_managers(cpu_plugin):
    api = cpu_plugin.api
    assert api.version >= (0, transfer_manager.MIN_MINOR)
    assert all(api.has(function) for function in transfer_manager.REQUIRED_FUNCTIONS)
    transfer_manager.require_streaming(api)  # raises nothing


def test_a_manager_describes_its_buffers(client):
    device = client.local_devices()[1]
    memory = device.default_memory()
    with client.create_buffers_for_async_host_to_device(
            [((4, 3), np.float32), ((5,), "int16"), Shape("f64[2,2]")], memory) as manager:
        assert manager.buffer_count == 3
        assert [manager.buffer_size(i) for i in range(3)] == [48, 10, 32]
        assert manager.device is device and manager.memory is memory
        assert manager.client is client
        assert manager.shapes == (((4, 3), np.dtype(np.float32)), ((5,), np.dtype(np.int16)),
                                  ((2, 2), np.dtype(np.float64)))
        assert not manager.closed
        assert repr(manager) == ("TransferManager([float32[4, 3], int16[5], float64[2, 2]], "
                                 f"device={device}, memory='device')")
    assert manager.closed
    assert repr(manager) == "TransferManager(<closed>, 3 buffers)"


# -- values ------------------------------------------------------------------------------------

DTYPES = [np.float32, np.float64, np.float16, np.int8, np.int32, np.int64, np.uint16, np.bool_,
          np.complex64, ml_dtypes.bfloat16]
SHAPES = [(), (7,), (3, 5), (2, 3, 4), (33, 17)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_chunks_reassemble_to_the_array(client, dtype, shape):
    expected = values(shape, dtype)
    with make_manager(client, [(shape, dtype)]) as manager:
        array = manager.retrieve_buffer(0)
        flat = expected.reshape(-1)
        # Chunks of 1, 2, 4, ... elements, cutting across rows.
        start, size, transfers = 0, 1, []
        while start < flat.size:
            piece = flat[start:start + size]
            transfers.append(manager.transfer_data(0, piece, offset=start * expected.itemsize))
            start, size = start + piece.size, size * 2
        assert [t.is_last for t in transfers] == [False] * (len(transfers) - 1) + [True]
        for transfer in transfers:
            assert transfer.block_until_ready() is transfer and transfer.is_ready()
    result = np.asarray(array)
    assert result.dtype == expected.dtype and result.shape == expected.shape
    np.testing.assert_array_equal(result, expected)


def test_chunks_in_any_order_and_raw_bytes(client):
    expected = values((64, 9), np.int32)
    raw = expected.tobytes()
    pieces = [(i, raw[i:i + 200]) for i in range(0, len(raw), 200)]
    with make_manager(client, [((64, 9), np.int32)]) as manager:
        array = manager.retrieve_buffer(0)
        # Backwards, as bytes, bytearray and memoryview: the last one sent completes it.
        kinds = itertools.cycle([bytes, bytearray, memoryview])
        sent = [manager.transfer_data(0, kind(piece), offset=offset)
                for (offset, piece), kind in zip(reversed(pieces), kinds)]
        assert [t.is_last for t in sent] == [False] * (len(sent) - 1) + [True]
        assert sent[0].offset == pieces[-1][0] and sent[0].nbytes == len(pieces[-1][1])
    np.testing.assert_array_equal(np.asarray(array), expected)


def test_overlapping_chunks_and_an_explicit_last_chunk(client):
    expected = np.arange(100, dtype=np.float32)
    with make_manager(client, [((100,), np.float32)]) as manager:
        array = manager.retrieve_buffer(0)
        assert not manager.transfer_data(0, np.zeros(30, np.float32)).is_last  # overwritten
        assert not manager.transfer_data(0, expected[40:], offset=160).is_last  # 120..160 left
        assert manager.transfer_data(0, expected[:60]).is_last  # overlaps both: all sent
    np.testing.assert_array_equal(np.asarray(array), expected)
    with make_manager(client, [((4,), np.float32)]) as manager:
        array = manager.retrieve_buffer(0)
        assert not manager.transfer_data(0, expected[:4], is_last=False).is_last
        assert not array.is_ready()
        manager.transfer_data(0, b"", offset=16, is_last=True)  # completes it, sends nothing
        np.testing.assert_array_equal(np.asarray(array), expected[:4])


def test_several_buffers_shapes_and_memories(client):
    device = client.local_devices()[2]
    kinds = {memory.kind: memory for memory in device.addressable_memories()}
    assert {"device", "pinned_host"} <= set(kinds)
    for kind in ("device", "pinned_host"):
        specs = [((3, 4), np.float32), Shape.array_shape(np.int64, (5,)),
                 Shape("u8[2,3]{1,0}"), ((0, 4), np.float32)]
        with client.create_buffers_for_async_host_to_device(specs, kinds[kind]) as manager:
            assert manager.buffer_size(3) == 0
            expected = [values((3, 4), np.float32), values((5,), np.int64),
                        values((2, 3), np.uint8), np.zeros((0, 4), np.float32)]
            for index in range(3):
                manager.transfer_data(index, expected[index])
            arrays = [manager.retrieve_buffer(i) for i in range(4)]
        for array, value in zip(arrays, expected):
            assert array.device is device and array.memory_kind == kind
            np.testing.assert_array_equal(np.asarray(array), value)
        assert arrays[3].is_ready()  # no bytes: complete from the start


def test_a_non_contiguous_or_byte_swapped_array_sends_its_values(client):
    base = values((8, 6), np.float64)
    with make_manager(client, [((4, 6), np.float64), ((8, 6), np.float64)]) as manager:
        manager.transfer_data(0, base[::2])  # every other row: a strided view
        manager.transfer_data(1, base.astype(">f8"))  # big-endian
        arrays = [manager.retrieve_buffer(0), manager.retrieve_buffer(1)]
    np.testing.assert_array_equal(np.asarray(arrays[0]), base[::2])
    np.testing.assert_array_equal(np.asarray(arrays[1]), base)


# -- programs launched before the bytes --------------------------------------------------------

def test_a_program_launched_before_the_last_chunk_computes_the_right_result(client):
    shape = (256, 64)
    device = client.local_devices()[0]
    executable = client.compile_and_load(affine_program(shape), [device])
    x = values(shape, np.float32)
    with make_manager(client, [(shape, np.float32)]) as manager:
        array = manager.retrieve_buffer(0)
        (out,) = executable.execute([array])
        assert not out.is_ready() and not array.is_ready()
        manager.transfer_data(0, x[:100])
        assert not out.is_ready() and not array.is_ready()  # the buffer is not complete yet
        manager.transfer_data(0, x[100:], offset=100 * 64 * 4)
        np.testing.assert_array_equal(np.asarray(out), x * 2 + 1)
    np.testing.assert_array_equal(np.asarray(array), x)


def test_programs_on_every_chunk_of_a_stream(client):
    device = client.local_devices()[3]
    executable = client.compile_and_load(affine_program((1000,)), [device])
    data = values((8, 1000), np.float32)
    with make_manager(client, [((1000,), np.float32)] * 8, device) as manager:
        outs = []
        for i in range(8):
            outs.append(executable.execute([manager.retrieve_buffer(i)])[0])
            manager.transfer_data(i, data[i])
    for out, row in zip(outs, data):
        np.testing.assert_array_equal(np.asarray(out), row * 2 + 1)


def test_chunks_sent_from_several_threads(client):
    elements, chunk = 1 << 16, 1 << 12
    data = values((4, elements), np.float32)
    with make_manager(client, [((elements,), np.float32)] * 4) as manager:
        arrays = [manager.retrieve_buffer(i) for i in range(4)]
        jobs = [(i, start) for i in range(4) for start in range(0, elements, chunk)]
        lasts: list[bool] = []
        errors: list[BaseException] = []

        def send(share):
            try:
                for i, start in share:
                    sent = manager.transfer_data(i, data[i, start:start + chunk], offset=start * 4)
                    lasts.append(sent.is_last)
            except BaseException as error:  # noqa: BLE001 - reported below
                errors.append(error)

        threads = [threading.Thread(target=send, args=(jobs[k::3],)) for k in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        assert lasts.count(True) == 4  # each buffer completed exactly once
    for array, row in zip(arrays, data):
        np.testing.assert_array_equal(np.asarray(array), row)


# -- errors set by the producer ----------------------------------------------------------------

def test_set_buffer_error_fails_reads_and_programs(client):
    device = client.local_devices()[0]
    executable = client.compile_and_load(affine_program((16,)), [device])
    with make_manager(client, [((16,), np.float32)] * 2) as manager:
        array = manager.retrieve_buffer(0)
        (before,) = executable.execute([array])  # launched before the error
        manager.transfer_data(0, np.ones(4, np.float32))
        manager.set_buffer_error(0, "the producer lost its input", pjrt.ErrorCode.DATA_LOSS)
        (after,) = executable.execute([array])  # launched after it
        manager.transfer_data(1, np.ones(16, np.float32))  # the other buffer is unaffected
        other = manager.retrieve_buffer(1)
    with pytest.raises(pjrt.XlaRuntimeError, match="the producer lost its input") as excinfo:
        np.asarray(array)
    assert excinfo.value.code == pjrt.ErrorCode.DATA_LOSS
    with pytest.raises(pjrt.XlaRuntimeError, match="the producer lost its input"):
        array.block_until_ready()
    for out in (before, after):
        with pytest.raises(pjrt.XlaRuntimeError, match="the producer lost its input"):
            np.asarray(out)
    np.testing.assert_array_equal(np.asarray(other), np.ones(16))


def test_set_buffer_error_defaults_to_internal(client):
    with make_manager(client, [((2,), np.int32)]) as manager:
        array = manager.retrieve_buffer(0)
        manager.set_buffer_error(0, "no data today")
    with pytest.raises(pjrt.XlaRuntimeError, match="no data today") as excinfo:
        array.block_until_ready()
    assert excinfo.value.code == pjrt.ErrorCode.INTERNAL


# -- closing -----------------------------------------------------------------------------------

def test_closing_mid_transfer_fails_the_incomplete_buffers_cleanly(make_client):
    client = make_client(devices=1)
    device = client.local_devices()[0]
    executable = client.compile_and_load(affine_program((1024,)), [device])
    manager = make_manager(client, [((1024,), np.float32)] * 3)
    half = manager.retrieve_buffer(0)
    (out,) = executable.execute([half])
    manager.transfer_data(0, np.ones(512, np.float32))
    whole = manager.retrieve_buffer(1)
    manager.transfer_data(1, np.full(1024, 3, np.float32))
    # Buffer 2 is neither retrieved nor sent: it goes with the manager.
    manager.close()
    manager.close()  # idempotent
    assert manager.closed
    # What describes the buffers stays readable.
    assert manager.buffer_count == 3 and manager.buffer_size(2) == 4096
    assert manager.shapes[2] == ((1024,), np.dtype(np.float32))
    for failed in (half, out):
        with pytest.raises(pjrt.XlaRuntimeError, match="deleted before transfers completed"):
            np.asarray(failed)
    np.testing.assert_array_equal(np.asarray(whole), np.full(1024, 3))
    for call in (lambda: manager.transfer_data(2, np.ones(1024, np.float32)),
                 lambda: manager.retrieve_buffer(2),
                 lambda: manager.set_buffer_error(2, "late")):
        with pytest.raises(ValueError, match="transfer manager is closed"):
            call()
    # The client goes on working, and a new manager works.
    with make_manager(client, [((2,), np.float32)]) as again:
        again.transfer_data(0, np.array([5, 6], np.float32))
        np.testing.assert_array_equal(np.asarray(again.retrieve_buffer(0)), [5, 6])


def test_closing_while_other_threads_send_is_clean(make_client):
    client = make_client(devices=1)
    elements, chunk = 1 << 16, 1 << 10
    manager = make_manager(client, [((elements,), np.float32)] * 4)
    arrays = [manager.retrieve_buffer(i) for i in range(4)]
    data = np.ones(chunk, np.float32)
    started = threading.Barrier(5)
    outcomes: list[str] = []

    def send(i):
        started.wait()
        try:
            for start in range(0, elements, chunk):
                manager.transfer_data(i, data, offset=start * 4)
            outcomes.append("done")
        except ValueError as error:
            assert "transfer manager is closed" in str(error)
            outcomes.append("closed")

    threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    started.wait()
    manager.close()  # waits for the calls in flight, then frees the manager
    for thread in threads:
        thread.join()
    assert len(outcomes) == 4 and manager.closed
    # Which buffers were finished is the threads' race: each is whole, or failed by the close.
    whole = 0
    for array in arrays:
        try:
            np.testing.assert_array_equal(np.asarray(array), np.ones(elements))
            whole += 1
        except pjrt.XlaRuntimeError as error:
            assert "deleted before transfers completed" in str(error)
    assert whole == outcomes.count("done")
    assert transfer_manager._open_states(client.raw_handle) == []


def test_closing_the_client_closes_its_managers_first(make_client):
    client = make_client(devices=1)
    manager = make_manager(client, [((8,), np.float32)] * 2)
    array = manager.retrieve_buffer(0)
    manager.transfer_data(0, np.ones(4, np.float32))
    handle = client.raw_handle
    client.close()
    assert manager.closed
    assert handle.pointer == ffi.NULL  # the client itself is freed
    assert transfer_manager._open_states(handle) == []
    with pytest.raises(pjrt.ClosedClientError):
        manager.transfer_data(0, np.ones(4, np.float32), offset=16)
    with pytest.raises(pjrt.ClosedClientError):
        client.create_buffers_for_async_host_to_device([((1,), np.float32)],
                                                       client.local_devices()[0].default_memory())
    with pytest.raises(pjrt.ClosedClientError):
        np.asarray(array)
    manager.close()  # nothing left to do


def test_a_collected_manager_is_closed(make_client):
    client = make_client(devices=1)
    handle = client.raw_handle
    manager = make_manager(client, [((8,), np.float32)])
    array = manager.retrieve_buffer(0)
    state = weakref.ref(manager._state)
    assert transfer_manager._open_states(handle) == [manager._state]
    del manager
    gc.collect()
    assert state() is None and transfer_manager._open_states(handle) == []
    with pytest.raises(pjrt.XlaRuntimeError, match="deleted before transfers completed"):
        array.block_until_ready()


def test_nothing_is_left_behind(make_client):
    client = make_client(devices=1)
    handle = client.raw_handle
    device = client.local_devices()[0]
    executable = client.compile_and_load(affine_program((64,)), [device])
    gc.collect()
    before = (len(handle.buffers), len(handle.holds), len(handle.pending_holds),
              len(client.live_arrays()))
    data = values((64,), np.float32)
    alive = weakref.ref(data)
    for _ in range(3):
        with make_manager(client, [((64,), np.float32)] * 4) as manager:
            outs = [executable.execute([manager.retrieve_buffer(i)])[0] for i in range(3)]
            sent = [manager.transfer_data(i, data) for i in range(4)]  # 3: never retrieved
        for transfer in sent:
            transfer.block_until_ready()
        for out in outs:
            np.testing.assert_array_equal(np.asarray(out), data * 2 + 1)
        assert manager._state.chunks == []
        del outs, out, sent, manager, transfer
    del data
    gc.collect()
    assert alive() is None  # the chunks' host memory was let go of
    after = (len(handle.buffers), len(handle.holds), len(handle.pending_holds),
             len(client.live_arrays()))
    assert after == before
    assert transfer_manager._open_states(handle) == []
    assert not handle.active and not handle.parked


def test_the_host_memory_of_a_chunk_is_kept_until_the_plugin_has_read_it(client):
    data = values((4096,), np.float32)
    alive = weakref.ref(data)
    with make_manager(client, [((4096,), np.float32)] * 2) as manager:
        sent = manager.transfer_data(0, data)
        chunk = sent._chunk
        held = chunk.host
        assert held is not None and held[0] is data  # kept until its done event was seen
        del held, data
        assert sent.block_until_ready().is_ready() and chunk.host is None
        assert alive() is None
        manager.transfer_data(1, np.zeros(4096, np.float32))
        assert chunk not in manager._state.chunks  # read: forgotten at the next transfer


# -- bad input ---------------------------------------------------------------------------------

def test_indexes_out_of_range_are_refused(client):
    with make_manager(client, [((4,), np.float32)] * 2) as manager:
        ones = np.ones(4, np.float32)
        for index in (2, -1, 10):
            for call in (lambda: manager.transfer_data(index, ones),
                         lambda: manager.retrieve_buffer(index),
                         lambda: manager.buffer_size(index),
                         lambda: manager.set_buffer_error(index, "x")):
                with pytest.raises(IndexError, match=rf"buffer index {index} is out of range: "
                                                     r"the manager holds 2 buffers \(0..1\)"):
                    call()
        for bad in (True, 1.0, "0"):
            with pytest.raises(TypeError, match="index must be an int"):
                manager.transfer_data(bad, ones)
        manager.transfer_data(np.int64(1), ones)  # numpy ints are ints


def test_chunks_outside_the_buffer_are_refused(client):
    with make_manager(client, [((4, 3), np.float32)]) as manager:
        with pytest.raises(ValueError, match=r"past the end of buffer 0: bytes 40..64 of a "
                                             r"buffer of 48 bytes \(float32\[4, 3\]\)"):
            manager.transfer_data(0, np.ones(6, np.float32), offset=40)
        with pytest.raises(ValueError, match="past the end"):
            manager.transfer_data(0, np.ones(13, np.float32))
        with pytest.raises(ValueError, match="past the end"):
            manager.transfer_data(0, b"", offset=49)
        with pytest.raises(ValueError, match="offset must be >= 0"):
            manager.transfer_data(0, np.ones(1, np.float32), offset=-4)
        with pytest.raises(ValueError, match="not a multiple of float32's item size"):
            manager.transfer_data(0, np.ones(1, np.float32), offset=2)
        with pytest.raises(TypeError, match="offset must be an int"):
            manager.transfer_data(0, np.ones(1, np.float32), offset=4.0)
        manager.transfer_data(0, b"\0\0", offset=2, is_last=False)  # raw bytes go anywhere
        # Nothing above reached the plugin: the buffer still takes its data.
        manager.transfer_data(0, values((4, 3), np.float32))
        np.testing.assert_array_equal(np.asarray(manager.retrieve_buffer(0)),
                                      values((4, 3), np.float32))


def test_data_of_the_wrong_kind_is_refused(client):
    with make_manager(client, [((4,), np.int32)]) as manager:
        with pytest.raises(TypeError, match=r"buffer 0 holds int32, but the data is float32; "
                                            r"convert it \(data.astype\(np.int32\)\)"):
            manager.transfer_data(0, np.ones(4, np.float32))
        with pytest.raises(TypeError, match="buffer 0 holds int32, but the data is int64"):
            manager.transfer_data(0, np.int64(3))
        with pytest.raises(TypeError, match="numpy array of int32 or a bytes-like object, not "
                                            "list"):
            manager.transfer_data(0, [1, 2, 3, 4])
        with pytest.raises(TypeError, match="is_last must be a bool or None"):
            manager.transfer_data(0, np.ones(4, np.int32), is_last=1)
        with pytest.raises(ValueError, match="contiguous"):
            manager.transfer_data(0, memoryview(bytes(32))[::2])
        manager.transfer_data(0, np.arange(4, dtype=np.int32))
        np.testing.assert_array_equal(np.asarray(manager.retrieve_buffer(0)), [0, 1, 2, 3])


def test_a_finished_buffer_takes_no_more(client):
    with make_manager(client, [((4,), np.float32)] * 3) as manager:
        ones = np.ones(4, np.float32)
        manager.transfer_data(0, ones)
        with pytest.raises(ValueError, match="buffer 0 takes no more chunks: its last chunk was "
                                             "sent"):
            manager.transfer_data(0, ones)
        with pytest.raises(ValueError, match="buffer 0 takes no more chunks: its last chunk"):
            manager.set_buffer_error(0, "too late")
        manager.set_buffer_error(1, "failed")
        with pytest.raises(ValueError, match="buffer 1 takes no more chunks: an error was set"):
            manager.transfer_data(1, ones)
        with pytest.raises(ValueError, match="buffer 1 takes no more chunks: an error was set"):
            manager.set_buffer_error(1, "again")
        for code in (pjrt.ErrorCode.OK, 0):
            with pytest.raises(ValueError, match="not OK"):
                manager.set_buffer_error(2, "fine", code)
        with pytest.raises(ValueError, match="one of pjrt.ErrorCode"):
            manager.set_buffer_error(2, "what", 99)
        with pytest.raises(TypeError, match="message must be a str"):
            manager.set_buffer_error(2, b"bytes")
        a = manager.retrieve_buffer(0)
        with pytest.raises(ValueError, match="buffer 0 was already retrieved"):
            manager.retrieve_buffer(0)
        manager.transfer_data(2, ones)  # buffer 2 was left as it was
        np.testing.assert_array_equal(np.asarray(manager.retrieve_buffer(2)), ones)
    np.testing.assert_array_equal(np.asarray(a), ones)


@pytest.mark.parametrize("shapes, error, match", [
    ([Shape("(f32[2], s32[])")], ValueError, r"shapes\[0\] is \(f32\[2\]\{0\}, s32\[\]\): only"),
    ([Shape.token_shape()], ValueError, "only array shapes"),
    ([Shape("f32[<=4]")], ValueError, "dynamic dimensions"),
    ([Shape("f32[2,3]{0,1}")], ValueError, r"row-major; drop the layout or give \{1,0\}"),
    ([((4,), ml_dtypes.int4)], ValueError, "int4, which devices pack below a byte"),
    ([((4,), object)], TypeError, "dtype object cannot be placed"),
    ([((4,), "not a dtype")], TypeError, "not a numpy dtype"),
    ([((-1, 2), np.float32)], ValueError, r"negative dimensions: \(-1, 2\)"),
    ([((2.5,), np.float32)], TypeError, "a shape is a tuple of ints"),
    ([(4, np.float32)], TypeError, "a shape is a tuple of ints"),
    ([np.float32], TypeError, r"shapes\[0\] is .*each spec is a \(shape, dtype\) pair"),
    (((4, 3), np.float32), TypeError, r"pass \[\(\(4, 3\), <class 'numpy.float32'>\)\]"),
    ([], ValueError, "shapes is empty"),
    ("f32[4]", TypeError, "not str"),
    ([((1 << 62, 4), np.float32)], ValueError,
     r"shapes\[0\] .* extents overflow int64 at dimension 0"),
    # No element, but XLA multiplies the extents out in order (and aborts the process):
    ([((1 << 62, 1 << 62, 0), np.float32)], ValueError,
     r"shapes\[0\] \(float32\[4611686018427387904, 4611686018427387904, 0\]\) cannot "
     r"be given to a plugin: its extents overflow int64 at dimension 0"),
    ([((3, 1 << 61, 0), np.float32)], ValueError,
     r"overflow int64 at dimension 1 \(4 \* 3 \* 2305843009213693952 bytes"),
])
def test_bad_shapes_are_refused(client, shapes, error, match):
    with pytest.raises(error, match=match):
        client.create_buffers_for_async_host_to_device(
            shapes, client.local_devices()[0].default_memory())


def test_a_memory_of_the_client_is_required(client, make_client):
    device = client.local_devices()[0]
    with pytest.raises(TypeError, match=r"memory must be a pjrt Memory, not .*Device \(its "
                                        r"memory: device.default_memory\(\)\)"):
        client.create_buffers_for_async_host_to_device([((1,), np.float32)], device)
    other = make_client(devices=1)
    with pytest.raises(ValueError, match="belongs to another client"):
        client.create_buffers_for_async_host_to_device(
            [((1,), np.float32)], other.local_devices()[0].default_memory())


# -- plugins that cannot -----------------------------------------------------------------------

_fault_copies = itertools.count()


def _fault_client(built, tmp_path, minor: int) -> pjrt.Client:
    """A client of a private copy of the fault plugin reporting PJRT API 0.``minor`` (it has
    no transfer-manager entries)."""
    import ctypes

    number = next(_fault_copies)
    path = tmp_path / f"libfault_streaming_{number}.so"
    shutil.copyfile(built.fault_plugin, path)
    library = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)
    library.fault_configure(0, minor, ctypes.c_size_t(0), 1)
    name = f"fault_streaming_{os.getpid()}_{number}"
    pjrt.load_pjrt_plugin_dynamically(name, path)
    return pjrt.make_c_api_client(name)


def test_a_plugin_older_than_0_60_is_named_in_the_error(built, tmp_path):
    client = _fault_client(built, tmp_path, 59)
    try:
        memory = client.local_devices()[0].default_memory()
        with pytest.raises(pjrt.UnsupportedFeatureError) as excinfo:
            client.create_buffers_for_async_host_to_device([((4,), np.float32)], memory)
        message = str(excinfo.value)
        assert "(PJRT API 0.59)" in message and "fault_streaming_" in message
        assert "from PJRT C API 0.60 on" in message and "device_put" in message
        assert excinfo.value.function == "PJRT_Client_CreateBuffersForAsyncHostToDevice"
        assert excinfo.value.code == pjrt.ErrorCode.UNIMPLEMENTED
        np.testing.assert_array_equal(np.asarray(client.buffer_from_pyval(np.ones(2))), 1)
    finally:
        client.close()


def test_a_plugin_without_the_entries_is_named_in_the_error(built, tmp_path):
    client = _fault_client(built, tmp_path, pjrt.PJRT_C_API_VERSION[1])
    try:
        memory = client.local_devices()[0].default_memory()
        with pytest.raises(pjrt.UnsupportedFeatureError,
                           match=r"plugin 'fault_streaming_\w+' \(PJRT API 0\.\d+\) does not "
                                 r"provide PJRT_Client_CreateBuffersForAsyncHostToDevice.*"
                                 r"create_buffers_for_async_host_to_device"):
            client.create_buffers_for_async_host_to_device([((4,), np.float32)], memory)
    finally:
        client.close()


def test_a_plugin_without_on_ready_is_named_in_the_error(built, cpu_plugin):
    # XLA's plugin behind the fault plugin, with PJRT_Event_OnReady taken out of its table.
    result = run_python("""
        import sys, numpy as np, pjrt
        pjrt.load_pjrt_plugin_dynamically("no_on_ready", sys.argv[1])
        client = pjrt.make_c_api_client("no_on_ready")
        try:
            client.create_buffers_for_async_host_to_device(
                [((4,), np.float32)], client.local_devices()[0].default_memory())
        except pjrt.UnsupportedFeatureError as error:
            print("refused:", error.function, "|", error)
        client.close()
    """, built.fault_plugin, env=child_env(
        drop=("PJRT_FAULT",), PJRT_FAULT_DELEGATE=cpu_plugin_path(cpu_plugin.name),
        PJRT_FAULT="no_on_ready"))
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith("refused: PJRT_Event_OnReady |"), result.stdout
    assert "plugin 'no_on_ready'" in line and "create_buffers_for_async_host_to_device" in line


# -- exit and fork -----------------------------------------------------------------------------

def test_exit_with_a_manager_mid_transfer_closes_it_first(cpu_plugin):
    # A program waits on a buffer whose last chunk never comes. The exit closes the manager
    # before the client, so the buffer fails at once and the client is freed without waiting
    # out the exit's budget for the program.
    result = run_python("""
        import atexit, json, sys, time
        atexit.register(lambda: print(json.dumps({"ended": time.monotonic()}), flush=True))
        import numpy as np, pjrt
        pjrt.load_pjrt_plugin_dynamically("cpu", sys.argv[1])
        client = pjrt.make_c_api_client("cpu")
        device = client.local_devices()[0]
        executable = client.compile_and_load('''
        func.func public @main(%x: tensor<8xf32>) -> tensor<8xf32> {
          %0 = stablehlo.add %x, %x : tensor<8xf32>
          return %0 : tensor<8xf32>
        }''', [device])
        manager = client.create_buffers_for_async_host_to_device(
            [((8,), np.float32)], device.default_memory())
        out = executable.execute([manager.retrieve_buffer(0)])[0]
        manager.transfer_data(0, np.ones(4, np.float32))
        atexit.register(lambda: print(json.dumps({"began": time.monotonic()}), flush=True))
    """, cpu_plugin.library_path)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    began, ended = lines[0]["began"], lines[1]["ended"]
    assert ended - began < 2.5, (ended - began, result.stderr[-2000:])
    assert "Check failed" not in result.stderr


def test_a_forked_child_leaves_the_parents_manager_alone(cpu_plugin):
    result = run_python("""
        import os, sys, warnings, numpy as np, pjrt
        warnings.simplefilter("ignore")
        pjrt.load_pjrt_plugin_dynamically("cpu", sys.argv[1])
        client = pjrt.make_c_api_client("cpu")
        manager = client.create_buffers_for_async_host_to_device(
            [((4,), np.float32)], client.local_devices()[0].default_memory())
        array = manager.retrieve_buffer(0)
        pid = os.fork()
        if pid == 0:
            try:
                manager.transfer_data(0, np.ones(4, np.float32))
            except pjrt.ClosedClientError as error:
                print("child refused:", "forked" in str(error) or "fork" in str(error), flush=True)
            manager.close()  # the parent's: left alone
            sys.exit(0)  # the exit hooks run, and leave it alone too
        _, status = os.waitpid(pid, 0)
        print("child status", status, flush=True)
        manager.transfer_data(0, np.arange(4, dtype=np.float32))
        print("parent", np.asarray(array).tolist(), flush=True)
        manager.close()
        client.close()
    """, cpu_plugin.library_path)
    assert "child refused: True" in result.stdout, result.stdout + result.stderr
    assert "child status 0" in result.stdout
    assert "parent [0.0, 1.0, 2.0, 3.0]" in result.stdout


def test_a_forked_child_closes_a_manager_another_thread_was_calling(cpu_plugin):
    """fork() while another thread is inside a call on a transfer manager: the child's copy
    of the manager counts a call in flight that no thread of the child will ever end (and
    may hold a lock that thread held). The child's close(), Client.close() and exit leave the
    parent's manager and client alone at once rather than waiting for that call.

    The sender thread hands 64 MiB chunks over in a loop (each copied inside the call), and
    the parent forks while the thread is inside one; a child that did not inherit a call in
    flight says so (exit status 3), and the parent forks again."""
    result = run_python("""
        import json, os, signal, sys, threading, time, warnings
        import numpy as np, pjrt
        warnings.simplefilter("ignore")
        pjrt.load_pjrt_plugin_dynamically("cpu", sys.argv[1])
        client = pjrt.make_c_api_client("cpu")
        count = 16 << 20  # float32 elements: 64 MiB
        manager = client.create_buffers_for_async_host_to_device(
            [((count,), np.float32)], client.local_devices()[0].default_memory())
        chunk = np.ones(count, np.float32)
        stop = threading.Event()

        def send():
            while not stop.is_set():
                manager.transfer_data(0, chunk, is_last=False).block_until_ready()

        sender = threading.Thread(target=send)
        sender.start()

        def inside_a_call():
            frame = sys._current_frames().get(sender.ident)
            return frame is not None and frame.f_code.co_name == "transfer"

        report = {"tries": 0}
        for _ in range(50):
            while not inside_a_call():
                time.sleep(0.001)
            report["tries"] += 1
            pid = os.fork()
            if pid == 0:
                inherited = manager._state._calls
                started = time.monotonic()
                manager.close()
                client.close()
                print(json.dumps({"child": {"inherited": inherited,
                                            "closing": time.monotonic() - started}}),
                      flush=True)
                sys.exit(0 if inherited else 3)  # the exit's hooks leave them alone too
            deadline = time.monotonic() + 20
            status = None
            while time.monotonic() < deadline:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                time.sleep(0.01)
            else:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                report["child"] = "did not end within 20 s"
                break
            report["child_exit"] = os.waitstatus_to_exitcode(status)
            report["child_seconds"] = 20 - (deadline - time.monotonic())
            if report["child_exit"] != 3:
                break
        stop.set()
        sender.join()
        manager.transfer_data(0, np.arange(count, dtype=np.float32))
        report["parent"] = float(np.asarray(manager.retrieve_buffer(0))[-1])
        manager.close()
        client.close()
        print(json.dumps(report), flush=True)
    """, cpu_plugin_path(cpu_plugin.name), timeout=300)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    report = lines[-1]
    assert "child" not in report, report  # the child ended
    assert report["child_exit"] == 0, (report, result.stderr[-3000:])
    child = [line["child"] for line in lines if "child" in line][-1]
    assert child["inherited"] >= 1, child
    assert child["closing"] < 2.0, child
    assert report["child_seconds"] < 4.0, report  # not the exit's 5 s wait for the call
    assert report["parent"] == (16 << 20) - 1, report


def test_a_forked_child_asks_a_transfer_another_thread_was_polling(cpu_plugin):
    """fork() while another thread polls a Transfer (holding its chunk's lock): in the child,
    the transfer answers what was known at the fork at once (this one was read), instead of
    waiting for a lock no thread of the child will release. A fork hook records whether the
    lock was held at the fork; a child that did not inherit it held says so (exit status 3),
    and the parent forks again."""
    result = run_python("""
        import json, os, signal, sys, threading, time, warnings
        import numpy as np, pjrt
        warnings.simplefilter("ignore")
        pjrt.load_pjrt_plugin_dynamically("cpu", sys.argv[1])
        client = pjrt.make_c_api_client("cpu")
        manager = client.create_buffers_for_async_host_to_device(
            [((4,), np.float32)], client.local_devices()[0].default_memory())
        transfer = manager.transfer_data(0, np.ones(4, np.float32), is_last=False)
        transfer.block_until_ready()
        stop = threading.Event()

        def poll():
            while not stop.is_set():
                transfer.is_ready()

        poller = threading.Thread(target=poll)
        poller.start()
        held_at_fork = []
        os.register_at_fork(before=lambda: held_at_fork.append(transfer._chunk.lock.locked()))
        report = {"tries": 0}
        for _ in range(500):
            report["tries"] += 1
            pid = os.fork()
            if pid == 0:
                if not held_at_fork[-1]:
                    os._exit(3)
                started = time.monotonic()
                done = transfer.block_until_ready() is transfer and transfer.is_ready()
                print(json.dumps({"child": {"done": done, "repr": repr(transfer),
                                            "seconds": time.monotonic() - started}}),
                      flush=True)
                os._exit(0)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                ended, status = os.waitpid(pid, os.WNOHANG)
                if ended:
                    break
                time.sleep(0.005)
            else:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                report["child"] = "did not end within 20 s"
                break
            report["child_exit"] = os.waitstatus_to_exitcode(status)
            if report["child_exit"] != 3:
                break
        stop.set()
        poller.join()
        manager.close()
        client.close()
        print(json.dumps(report), flush=True)
    """, cpu_plugin_path(cpu_plugin.name), timeout=300)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    report = lines[-1]
    assert "child" not in report, report  # the child ended
    assert report["child_exit"] == 0, (report, result.stderr[-3000:])
    child = [line["child"] for line in lines if "child" in line][-1]
    assert child["done"] and "done" in child["repr"] and child["seconds"] < 2.0, child


def test_transfer_is_exported_for_annotations():
    assert {"Transfer", "TransferManager"} <= set(pjrt.streaming.__all__)
    assert Transfer.__module__ == "pjrt.streaming"

"""Reading arrays to numpy (_native/host_views.c, pjrt/_runtime/host_reads.py): a read-only view
of the buffer itself for a computed value in host memory, of every size and dtype, an
interruptible wait for one still being computed, and the ownership rules (deletion, closing,
donation, threads) kept while views live."""
from __future__ import annotations

import ctypes
import sys
import threading

import ml_dtypes
import numpy as np
import pytest

import pjrt
from pjrt._runtime.host_reads import HostMemory
from conftest import cpu_plugin_path
from interrupt_helpers import assert_interrupted, run_cpu_child
from long_programs import matmul_loop
from pjrt._pjrt_cffi import ffi, lib


def _counting_loop(iterations: int) -> str:
    """`matmul_loop` returning the loop counter (a 4-byte value that is ready only when the
    whole loop is) and one row of the result."""
    return matmul_loop(
        iterations,
        then="%row = stablehlo.slice %r#1 [0:1, 0:256] : (tensor<256x256xf32>) -> tensor<1x256xf32>",
        returns="%r#0, %row : tensor<i32>, tensor<1x256xf32>")


@pytest.mark.parametrize("host", [
    np.arange(8, dtype=np.float32),
    np.float64(2.5),  # 0-d
    np.zeros((0, 3), np.int8),  # no elements
    np.array([[True, False], [False, True]]),
    np.arange(6, dtype=np.complex64).reshape(2, 3) * (1 + 2j),
    np.arange(5).astype(ml_dtypes.bfloat16),
    np.arange(16383, dtype=np.float32),  # just under 64 KiB
    np.int8(-5),  # one byte
    np.array([True]),  # one byte, 1-d
    np.float16(1.5),  # two bytes
    np.arange(24, dtype=np.int16).reshape(2, 3, 4),
], ids=["f32", "0-d", "empty", "bool", "c64", "bf16", "64KiB-4", "i8-0d", "bool-1", "f16-0d",
        "i16-3d"])
def test_reads_of_every_size_are_read_only_views_of_the_buffer(client, host):
    array = client.buffer_from_pyval(host)
    value = np.asarray(array)
    assert value.dtype == host.dtype and value.shape == host.shape
    np.testing.assert_array_equal(value, host)
    _assert_is_the_buffer(value, array)
    _assert_is_the_buffer(np.asarray(array), array)  # every read: the same memory
    _assert_nothing_writeable_under(value)


def _assert_is_the_buffer(value: np.ndarray, array) -> None:
    """``value`` is ``array``'s own memory, not a copy of it (where it has any)."""
    if value.nbytes:
        assert value.ctypes.data == array.unsafe_buffer_pointer()


def _assert_nothing_writeable_under(value: np.ndarray) -> None:
    """No array in ``value``'s base chain can be made writeable, and the memory at the bottom
    is exported read-only, with no writeable object behind it either."""
    layer = value
    while isinstance(layer, np.ndarray):
        assert not layer.flags.writeable
        with pytest.raises(ValueError):
            layer.flags.writeable = True
        layer = layer.base
    while layer is not None:
        if isinstance(layer, HostMemory):  # numpy's array interface, exported read-only
            assert layer.__array_interface__["data"][1] is True
            return
        assert memoryview(layer).readonly
        layer = getattr(layer, "obj", None)  # a memoryview's exporter
        if isinstance(layer, np.ndarray):
            assert not layer.flags.writeable


def test_program_results_of_every_rank_read_as_their_values(client):
    """The fast path of a fresh result: one-byte, two-byte, 0-d, 1-d and n-d outputs of one
    program, each read read-only, as a view of the output's buffer."""
    executable = client.compile_and_load("""
        func.func public @main(%x: tensor<2x3xi16>) -> (tensor<i8>, tensor<i1>, tensor<f16>,
                                                       tensor<6xi16>, tensor<2x3xi16>) {
          %c = stablehlo.constant dense<-7> : tensor<i8>
          %t = stablehlo.constant dense<true> : tensor<i1>
          %h = stablehlo.constant dense<2.5> : tensor<f16>
          %v = stablehlo.reshape %x : (tensor<2x3xi16>) -> tensor<6xi16>
          %n = stablehlo.negate %x : tensor<2x3xi16>
          return %c, %t, %h, %v, %n : tensor<i8>, tensor<i1>, tensor<f16>, tensor<6xi16>, tensor<2x3xi16>
        }""")
    x = np.arange(6, dtype=np.int16).reshape(2, 3)
    expected = [np.int8(-7), np.bool_(True), np.float16(2.5), x.reshape(6), -x]
    for _ in range(3):
        outputs = executable.execute([client.buffer_from_pyval(x)])
        for output, want in zip(outputs, expected):
            value = np.asarray(output)
            assert value.dtype == want.dtype and value.shape == np.shape(want)
            np.testing.assert_array_equal(value, want)
            _assert_is_the_buffer(value, output)
            _assert_nothing_writeable_under(value)


def test_one_byte_reads_leave_shared_bytes_objects_alone(client):
    """The copy of a small value is written into a bytes object made for it alone, never into
    one Python shares (the one-byte and empty bytes are singletons: a write into one would
    change every ``b"\\x00"`` in the process)."""
    for host in (np.int8(-1), np.uint8(255), np.array([True]), np.zeros(0, np.uint8),
                 np.array([[0x7f]], np.int8)):
        np.asarray(client.buffer_from_pyval(host))
    assert b"\x00"[0] == 0 and bytes(1) == b"\x00" and len(b"") == 0
    assert b"\x00" * 2 == bytes(2)


def test_a_small_result_still_being_computed_is_waited_for(client):
    executable = client.compile_and_load(_counting_loop(200))
    x = client.buffer_from_pyval(np.full((256, 256), 0.01, np.float32))
    count, row = executable.execute([x])
    was_ready = count.is_ready()
    assert int(np.asarray(count)) == 200
    assert row.is_ready() and np.isfinite(np.asarray(row)).all()
    # 200 dependent 256^3 matmuls take far longer than launching them.
    assert not was_ready


def test_the_c_read_leaves_an_unfinished_buffer_alone(client):
    """pjrt_host_read copies a computed value and reports one still being computed without
    waiting or touching the destination."""
    executable = client.compile_and_load(_counting_loop(200))
    x = client.buffer_from_pyval(np.full((256, 256), 0.01, np.float32))
    count, _ = executable.execute([x])
    api = client.raw_handle.api
    destination = np.full(1, -1, np.int32)
    status = lib.pjrt_host_read(api.table, count.live_buffers()[0], ffi.from_buffer(destination), 4)
    assert status == lib.PJRT_HOST_READ_NOT_READY and destination[0] == -1
    count.block_until_ready()
    status = lib.pjrt_host_read(api.table, count.live_buffers()[0], ffi.from_buffer(destination), 4)
    assert status == lib.PJRT_HOST_READ_DONE and destination[0] == 200


def test_a_failed_computation_raises_on_every_read(client):
    """The computation's error comes from the ready event, through the C read."""
    target = f"host_reads_refuses_{id(client)}"

    def refuse(operands, results, attributes):
        raise ValueError("refused on purpose")

    pjrt.register_custom_call_target(target, refuse)
    executable = client.compile_and_load(f"""
        func.func public @main(%x: tensor<2xf32>) -> tensor<2xf32> {{
          %y = stablehlo.custom_call @{target}(%x) {{api_version = 4 : i32}} : (tensor<2xf32>) -> tensor<2xf32>
          return %y : tensor<2xf32>
        }}""")
    try:
        (out,) = executable.execute([client.buffer_from_pyval(np.ones(2, np.float32))])
    except pjrt.XlaRuntimeError as error:  # this plugin build runs it during the launch
        assert "refused on purpose" in str(error)
        return
    for _ in range(2):  # nothing is cached from a failed read
        with pytest.raises(pjrt.XlaRuntimeError, match="refused on purpose"):
            np.asarray(out)


def test_a_cached_copy_is_not_read_after_delete_or_close(make_client):
    own = make_client()
    deleted = own.buffer_from_pyval(np.arange(3.0))
    closed = own.buffer_from_pyval(np.arange(3.0))
    np.asarray(deleted), np.asarray(closed)
    deleted.delete()
    with pytest.raises(pjrt.DeletedArrayError):
        np.asarray(deleted)
    own.close()
    with pytest.raises(pjrt.ClosedClientError):
        np.asarray(closed)
    with pytest.raises(pjrt.ClosedClientError):
        closed.item()


def test_reads_racing_deletes_in_other_threads(client, tiny):
    """Each read either gives the value or raises DeletedArrayError, never reads freed
    memory: the read holds a ticket, so a delete() from another thread waits for it."""
    a = client.buffer_from_pyval(np.arange(8, dtype=np.float32))
    b = client.buffer_from_pyval(np.ones(8, dtype=np.float32))
    expected = np.tanh(np.arange(8, dtype=np.float32) + 1)
    outcomes = {"read": 0, "deleted": 0}
    failures: list = []
    lock = threading.Lock()

    def reader(arrays):
        for array in arrays:
            try:
                value = np.asarray(array)
            except pjrt.DeletedArrayError:
                with lock:
                    outcomes["deleted"] += 1
                continue
            if not np.allclose(value, expected, rtol=1e-6):
                failures.append(value.copy())
            with lock:
                outcomes["read"] += 1

    def deleter(arrays):
        for array in arrays:
            array.delete()

    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns as often as the interpreter allows
    try:
        for _ in range(20):
            arrays = [tiny.execute([a, b])[0] for _ in range(100)]
            threads = [threading.Thread(target=reader, args=(arrays,)),
                       threading.Thread(target=reader, args=(arrays[::-1],)),
                       threading.Thread(target=deleter, args=(arrays[50:] + arrays[:50],))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert all(array.is_deleted() for array in arrays)
    finally:
        sys.setswitchinterval(switch_interval)
    assert not failures
    assert outcomes["read"] + outcomes["deleted"] == 20 * 2 * 100


def test_a_donated_array_is_not_read_after_donation(client):
    executable = client.compile_and_load("""
        func.func public @main(%x: tensor<4xf32> {tf.aliasing_output = 0 : i32}) -> tensor<4xf32> {
          %y = stablehlo.negate %x : tensor<4xf32>
          return %y : tensor<4xf32>
        }""")
    x = client.buffer_from_pyval(np.arange(4, dtype=np.float32))
    viewed = np.asarray(x)  # a view: while numpy reads x's buffer, the program may not reuse it
    (y,) = executable.execute([x])
    np.testing.assert_array_equal(np.asarray(y), -np.arange(4, dtype=np.float32))
    assert not x.is_deleted()
    np.testing.assert_array_equal(viewed, np.arange(4, dtype=np.float32))  # still intact
    del viewed  # the last view gone, x is donated
    executable.execute([x])
    assert x.is_deleted()
    with pytest.raises(pjrt.DeletedArrayError, match="donated"):
        np.asarray(x)


@pytest.mark.slow
def test_ctrl_c_interrupts_a_small_read_of_an_unfinished_result(cpu_plugin):
    """np.asarray of a 4-byte result still being computed waits in slices: a KeyboardInterrupt
    ends it long before the program does, and the value can be read afterwards."""
    reports = run_cpu_child(cpu_plugin_path(cpu_plugin.name), f"""
        client = pjrt.make_c_api_client("cpu")
        executable = client.compile_and_load({_counting_loop(12000)!r})  # seconds of work
        x = client.buffer_from_pyval(np.full((256, 256), 0.01, np.float32))
        count, row = executable.execute([x])
        interrupt("read", lambda: np.asarray(count), inside="event")
        ready_then = count.is_ready()
        print(json.dumps({{"case": "after", "ready_then": ready_then,
                          "count": int(np.asarray(count))}}))
    """)
    assert_interrupted(reports["read"])
    after = reports["after"]
    assert not after["ready_then"], after
    assert after["count"] == 12000


# -- the buffer protocol: np.asarray, memoryview and bytes of the buffer itself ----------------

def test_numpy_copy_keyword_follows_numpy_2(client, mesh):
    array = client.buffer_from_pyval(np.arange(6, dtype=np.int32).reshape(2, 3))
    view = np.array(array, copy=False)
    _assert_is_the_buffer(view, array)
    assert not view.flags.writeable
    copied = np.array(array, copy=True)
    assert copied.flags.writeable and not np.shares_memory(copied, view)
    copied[0, 0] = 7  # the copy is the caller's: the array keeps its value
    np.testing.assert_array_equal(np.asarray(array), np.arange(6).reshape(2, 3))
    with pytest.raises(ValueError, match="copy=False"):
        array.__array__(np.float64, copy=False)  # another dtype needs a copy
    sharded = pjrt.device_put(np.arange(16, dtype=np.float32).reshape(4, 4),
                              pjrt.NamedSharding(mesh, pjrt.PartitionSpec("x")))
    assert len(sharded.addressable_shards) > 1
    with pytest.raises(ValueError, match="copy=False"):  # assembled from several buffers
        np.array(sharded, copy=False)
    np.testing.assert_array_equal(np.asarray(sharded), np.arange(16).reshape(4, 4))


def test_memoryview_and_bytes_are_the_buffer_read_only(client):
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    array = client.buffer_from_pyval(host)
    view = memoryview(array)
    assert view.readonly and view.format == "f" and view.shape == (3, 4)
    assert view.strides == (16, 4) and view.nbytes == host.nbytes
    assert view.tobytes() == host.tobytes() == bytes(array)
    with pytest.raises((TypeError, BufferError)):
        ctypes.c_char.from_buffer(array)  # asks for writable memory
    view.release()


def test_a_view_keeps_the_memory_past_delete_and_close(make_client):
    own = make_client()
    array = own.buffer_from_pyval(np.arange(1000, dtype=np.float64))
    address = array.unsafe_buffer_pointer()
    view = np.asarray(array)
    handle = own.raw_handle
    array.delete()
    assert array.is_deleted() and handle.is_viewed(id(array))
    own.close()
    np.testing.assert_array_equal(view, np.arange(1000))  # still the buffer, still there
    assert view.ctypes.data == address
    del view  # the last export gone, the memory is freed
    assert not handle.is_viewed(id(array)) and id(array) not in handle.buffers


def test_shards_and_clones_are_read_as_their_own_buffers(client, mesh):
    host = np.arange(32, dtype=np.float32).reshape(8, 4)
    sharded = pjrt.device_put(host, pjrt.NamedSharding(mesh, pjrt.PartitionSpec("x")))
    for shard in sharded.addressable_shards:
        value = np.asarray(shard.data)
        np.testing.assert_array_equal(value, host[shard.index])
        _assert_is_the_buffer(value, shard.data)
    array = client.buffer_from_pyval(host)
    clone = array.clone()
    assert np.asarray(clone).ctypes.data == np.asarray(array).ctypes.data
    view = np.asarray(clone)
    array.delete()  # deletes the clone too, but not the memory its view reads
    assert clone.is_deleted()
    np.testing.assert_array_equal(view, host)


def test_a_write_through_dlpack_shows_in_every_view(client):
    """A zero-copy DLPack consumer that writes (PyTorch ignores the read-only flag) changes
    what every host view reads, views taken before the export included, as in jax."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed in this environment")
    array = client.buffer_from_pyval(np.zeros(4, np.float32))
    before = np.asarray(array)
    tensor = torch.from_dlpack(array)
    tensor += 5
    np.testing.assert_array_equal(before, [5, 5, 5, 5])
    np.testing.assert_array_equal(np.asarray(array), [5, 5, 5, 5])


@pytest.mark.slow
def test_ctrl_c_interrupts_a_memoryview_of_an_unfinished_result(cpu_plugin):
    """memoryview(array) of a value still being computed waits where Ctrl-C ends the wait,
    with one KeyboardInterrupt; the value can be read afterwards."""
    reports = run_cpu_child(cpu_plugin_path(cpu_plugin.name), f"""
        client = pjrt.make_c_api_client("cpu")
        executable = client.compile_and_load({_counting_loop(12000)!r})  # seconds of work
        x = client.buffer_from_pyval(np.full((256, 256), 0.01, np.float32))
        count, row = executable.execute([x])
        interrupt("view", lambda: memoryview(count), inside="event")
        print(json.dumps({{"case": "after", "ready_then": count.is_ready(),
                          "count": int(np.asarray(count))}}))
    """)
    assert_interrupted(reports["view"])
    after = reports["after"]
    assert not after["ready_then"], after
    assert after["count"] == 12000

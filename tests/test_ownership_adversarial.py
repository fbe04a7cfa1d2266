"""Ownership under attack: copies, DLPack both ways, clear_backends, close() racing readers,
finalisers in reference cycles and hand-made DLPack capsules, on the real CPU plugins.

Each case ends in a correct value or a clean Python exception; crashes are looked for in child
processes, races are repeated at least 20 times. The tests read ``client._handle`` (the
ClientHandle) only to see whether something was really freed.
"""
from __future__ import annotations

import copy
import gc
import threading
import weakref

import numpy as np
import pytest

import pjrt
from conftest import cpu_plugin_path, run_python
from fixtures import programs
from pjrt._pjrt_cffi import ffi

TINY = programs.get("tiny_tanh")
LARGE = 1 << 17  # float32 elements: 512 KiB, read through a view of the buffer
SMALL = 1024     # float32 elements: 4 KiB, read through a (cached) host copy


def _aligned(values: np.ndarray, alignment: int = 64) -> np.ndarray:
    """A copy of ``values`` at an ``alignment``-byte address (the CPU plugins view only
    aligned memory, and copy the rest)."""
    raw = np.empty(values.nbytes + alignment, np.uint8)
    skip = -raw.ctypes.data % alignment
    out = raw[skip:skip + values.nbytes].view(values.dtype).reshape(values.shape)
    out[...] = values
    return out


# -- the ticket logic: close() while freeing runs Python code -------------------------------

def test_a_call_begun_while_parked_buffers_are_freed_keeps_the_client(make_client):
    """Freeing a parked buffer can run Python code (here a DLPack producer's deleter) while
    the GIL is free; a call that begins then, followed by close(), must keep the client alive
    until that call ends."""
    own = make_client(1)
    handle = own._handle
    late = []

    def a_call_begins_then_the_client_closes():
        late.append(handle.begin())
        own.close()

    host = _aligned(np.arange(1 << 14, dtype=np.float32))
    address = host.ctypes.data
    weakref.finalize(host, a_call_begins_then_the_client_closes)
    imported = pjrt.from_dlpack(host, device=own.local_devices()[0])
    del host
    assert imported.unsafe_buffer_pointer() == address  # a view: freeing it runs the deleter
    first = handle.begin()
    imported.delete()  # another call is running: the buffer is parked
    assert len(handle.parked) == 1
    handle.end(first)  # frees the parked buffer; the deleter begins a call and closes
    assert len(late) == 1, "the producer's deleter did not run"
    assert handle.pointer != ffi.NULL, "the client was freed under a running call"
    handle.end(late[0])
    assert handle.pointer == ffi.NULL and not handle.active


def test_close_racing_two_reading_threads_never_crashes(cpu_plugin):
    """close() against two threads reading DLPack imports and plain arrays and a thread
    executing, 20 times over in a child: each call gives a value or ClosedClientError."""
    script = f"""
        import threading, time, numpy as np, pjrt
        pjrt.load_pjrt_plugin_dynamically("cpu", {cpu_plugin_path(cpu_plugin.name)!r})
        TINY = open({TINY.path()!r}).read()
        hosts = []
        for i in range(4):
            raw = np.empty((1 << 14) * 4 + 64, np.uint8)
            skip = -raw.ctypes.data % 64
            host = raw[skip:skip + (1 << 16)].view(np.float32)
            host[:] = i
            hosts.append(host)
        values = closed = 0
        for rep in range(20):
            client = pjrt.make_c_api_client("cpu", {{"cpu_device_count": 1}})
            device = client.local_devices()[0]
            executable = client.compile_and_load(TINY)
            small = client.buffer_from_pyval(np.ones(8, np.float32))
            go = threading.Event()
            counts = []

            def read(kind):
                got = 0
                go.wait()
                try:
                    for _ in range(150):
                        for i, host in enumerate(hosts):
                            a = (pjrt.from_dlpack(host, device=device) if kind
                                 else client.buffer_from_pyval(host, device))
                            assert float(np.asarray(a)[7]) == i
                            got += 1
                            del a
                except pjrt.ClosedClientError:
                    pass
                counts.append(got)

            def execute():
                try:
                    while True:
                        (out,) = executable.execute([small, small])
                        np.asarray(out)
                except pjrt.ClosedClientError:
                    pass

            threads = [threading.Thread(target=read, args=(k,)) for k in (1, 1, 0)]
            threads.append(threading.Thread(target=execute))
            for t in threads:
                t.start()
            go.set()
            time.sleep(0.002 * (rep % 5))
            client.close()
            for t in threads:
                t.join(30)
                assert not t.is_alive()
            values += sum(counts)
        print("ok", values)
    """
    result = run_python(script, timeout=120)
    assert result.stdout.startswith("ok "), result.stdout + result.stderr


# -- finalisers in reference cycles ---------------------------------------------------------

def test_a_finaliser_that_keeps_an_array_gets_deleted_array_error(cpu_plugin):
    """A ``__del__`` in a reference cycle keeps the Arrays it holds (single-device, large and
    small, and a global Array): whichever finaliser runs first, a kept Array reads as
    garbage-collected instead of reading freed memory."""
    script = f"""
        import gc, numpy as np, pjrt
        pjrt.load_pjrt_plugin_dynamically("cpu", {cpu_plugin_path(cpu_plugin.name)!r})
        client = pjrt.make_c_api_client("cpu", {{"cpu_device_count": 2}})
        mesh = pjrt.Mesh(np.array(client.devices()), ("a",))
        kept = []

        class Holder:
            def __del__(self):
                kept.extend(self.arrays)

        for _ in range(5):
            holder = Holder()
            holder.arrays = [
                client.buffer_from_pyval(np.arange({LARGE}, dtype=np.float32)),
                client.buffer_from_pyval(np.arange({SMALL}, dtype=np.float32)),
                pjrt.device_put(np.arange({LARGE}, dtype=np.float32),
                                pjrt.NamedSharding(mesh, pjrt.P("a")))]
            np.asarray(holder.arrays[1])  # a cached host copy
            holder.cycle = holder
            del holder
            gc.collect()
            for _ in range(4):  # reuse the freed memory
                client.buffer_from_pyval(np.full({LARGE}, 9.0, np.float32))
        refused = 0
        for array in kept:
            assert array.is_deleted()
            try:
                np.asarray(array)
            except pjrt.DeletedArrayError as error:
                assert "garbage-collected" in str(error), error
                refused += 1
        print("refused", refused, "of", len(kept))
    """
    result = run_python(script, timeout=60)
    assert result.stdout.split() == ["refused", "15", "of", "15"], result.stdout


# -- copy.copy ------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [SMALL, LARGE])
def test_copy_copy_is_a_copy_that_outlives_the_original(client, size):
    original = client.buffer_from_pyval(np.arange(size, dtype=np.float32))
    copied = copy.copy(original)
    deep = copy.deepcopy(original)
    assert copied is not original and copied.unsafe_buffer_pointer() != \
        original.unsafe_buffer_pointer()
    original.delete()
    for _ in range(4):  # reuse the freed memory
        client.buffer_from_pyval(np.full(size, -1.0, np.float32))
    for other in (copied, deep):
        assert not other.is_deleted() and other.device == client.local_devices()[0]
        np.testing.assert_array_equal(np.asarray(other), np.arange(size, dtype=np.float32))


def test_copy_copy_of_a_global_array_keeps_its_sharding(client, mesh):
    value = np.arange(8 * LARGE // 8, dtype=np.float32).reshape(8, -1)
    original = pjrt.device_put(value, pjrt.NamedSharding(mesh, pjrt.P("x", "y")))
    copied = copy.copy(original)
    assert copied.sharding == original.sharding
    original.delete()
    for shard in copied.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), value[shard.index])
    np.testing.assert_array_equal(np.asarray(copied), value)


def test_pickling_an_array_is_refused_with_a_way_out(client):
    import pickle

    with pytest.raises(TypeError, match="cannot be pickled.*np.asarray"):
        pickle.dumps(client.buffer_from_pyval(np.ones(3, np.float32)))


# -- DLPack exports and numpy views racing delete() -----------------------------------------

@pytest.fixture
def frequent_switches():
    """Threads switch as often as CPython lets them, so that races show within a few rounds."""
    import sys

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


@pytest.mark.parametrize("reader", ["np.from_dlpack", "np.asarray"])
def test_a_read_racing_delete_never_hands_out_freed_memory(client, frequent_switches, reader):
    """One thread exports (or views) an Array while another deletes it and allocates: each
    read is the Array's value or DeletedArrayError, never another array's memory."""
    read = np.from_dlpack if reader == "np.from_dlpack" else np.asarray
    wrong, refused, right = [], 0, 0
    for round_ in range(60):
        x = client.buffer_from_pyval(np.full(LARGE, round_, np.float32))
        got, junk = [], []
        start = threading.Barrier(2)

        def take():
            start.wait()
            try:
                got.append(read(x))
            except pjrt.DeletedArrayError:
                got.append(None)

        def delete_and_allocate(spin=round_ % 20 * 300):
            start.wait()
            for _ in range(spin):  # a different point of the read each round
                pass
            x.delete()
            for _ in range(4):
                junk.append(client.buffer_from_pyval(np.full(LARGE, -1.0, np.float32)))

        threads = [threading.Thread(target=take), threading.Thread(target=delete_and_allocate)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for _ in range(4):
            junk.append(client.buffer_from_pyval(np.full(LARGE, -1.0, np.float32)))
        if got[0] is None:
            refused += 1
        elif np.all(got[0] == round_):
            right += 1
        else:
            wrong.append(round_)
        del got, junk
    assert not wrong, f"{len(wrong)} of 60 reads saw another array's memory ({right} right, " \
                      f"{refused} refused)"


# -- a consumer that writes through a zero-copy export ---------------------------------------

@pytest.mark.parametrize("size", [SMALL, LARGE])
def test_writes_through_a_zero_copy_export_are_seen_by_every_reader(client, size):
    """PyTorch ignores DLPack's read-only flag: after ``torch.from_dlpack(x).add_(7)`` the
    Array is shared, and numpy (views read before and after) and a program agree on 7."""
    torch = pytest.importorskip("torch")
    negate = client.compile_and_load(f"""
        func.func public @main(%x: tensor<{size}xf32>) -> tensor<{size}xf32> {{
          %y = stablehlo.negate %x : tensor<{size}xf32>
          return %y : tensor<{size}xf32>
        }}""")
    x = client.buffer_from_pyval(np.zeros(size, np.float32))
    np.asarray(x)  # a cached host copy (small) or a view (large), read before the export
    assert not x.shared
    tensor = torch.from_dlpack(x)
    assert x.shared and tensor.data_ptr() == x.unsafe_buffer_pointer()  # no copy
    tensor.add_(7)
    assert float(np.asarray(x)[0]) == 7.0 and float(np.asarray(x)[-1]) == 7.0
    (negated,) = negate.execute([x])
    assert float(np.asarray(negated)[0]) == -7.0
    tensor.add_(1)  # a view taken before a later write sees it too
    assert float(np.asarray(x)[0]) == 8.0


def test_a_copying_export_leaves_the_array_unshared(client):
    torch = pytest.importorskip("torch")
    x = client.buffer_from_pyval(np.zeros(SMALL, np.float32))
    tensor = torch.from_dlpack(x.__dlpack__(copy=True))
    tensor.add_(7)
    assert not x.shared and float(np.asarray(x)[0]) == 0.0


def test_writes_by_the_producer_of_an_import_are_seen(client):
    """The other way: a small Array viewing a torch tensor shows the tensor's later writes
    (no stale host copy)."""
    torch = pytest.importorskip("torch")
    source = torch.zeros(64, dtype=torch.float32)
    imported = pjrt.from_dlpack(source, device=client.local_devices()[0])
    if imported.unsafe_buffer_pointer() != source.data_ptr():
        pytest.skip("the plugin copied this tensor (alignment), so nothing is shared")
    assert float(np.asarray(imported)[0]) == 0.0
    source.add_(5)
    assert float(np.asarray(imported)[0]) == 5.0


# -- hand-made DLPack capsules ---------------------------------------------------------------

CAPSULE_CASES = {
    # name: (field settings applied to a valid float32[4] tensor, what the error names)
    "valid": ({}, None),
    "huge ndim": ({"ndim": 1 << 30}, "ndim is 1073741824"),
    "negative ndim": ({"ndim": -1}, "ndim is -1"),
    "NULL shape": ({"ndim": 2, "shape": "NULL"}, "shape pointer is NULL"),
    "unreadable shape": ({"shape": 0x10}, "shape pointer leads"),
    "unreadable strides": ({"strides": 0x10}, "strides pointer leads"),
    "NULL data": ({"data": 0}, "data pointer is NULL"),
    "unmapped data": ({"data": 0x1000}, "not readable memory"),
    "negative extent": ({"extent": -5}, "negative extent"),
    "huge extent": ({"extent": 1 << 62}, "spans more bytes"),
    "huge offset": ({"byte_offset": 1 << 62}, "byte_offset"),
    "far offset": ({"byte_offset": 1 << 44}, "not readable memory"),
    "huge stride": ({"stride": 1 << 60}, "span more bytes"),
    "far stride": ({"stride": 1 << 40}, "not readable memory"),
    "negative stride": ({"stride": -(1 << 52)}, "outside addressable memory"),
    "unknown device": ({"device_type": 99}, "device type 99"),
    "negative device id": ({"device_id": -1}, "device id -1"),
}


@pytest.mark.parametrize("versioned", [True, False], ids=["dltensor_versioned", "dltensor"])
def test_damaged_capsules_are_refused_with_the_field_named(cpu_plugin, versioned):
    """Capsules built by hand (cffi structs, ctypes capsules), each with one field wrong:
    from_dlpack refuses each with a ValueError naming the field, in a child process that must
    not crash, and takes the valid one."""
    script = f"""
        import ctypes, json, numpy as np, pjrt
        from pjrt._pjrt_cffi import ffi, lib
        pjrt.load_pjrt_plugin_dynamically("cpu", {cpu_plugin_path(cpu_plugin.name)!r})
        client = pjrt.make_c_api_client("cpu", {{"cpu_device_count": 1}})
        device = client.local_devices()[0]
        new_capsule = ctypes.pythonapi.PyCapsule_New
        new_capsule.restype = ctypes.py_object
        new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        versioned = {versioned!r}
        cases = {CAPSULE_CASES!r}
        data = np.arange(4, dtype=np.float32)
        results = {{}}
        for name, (fields, _) in cases.items():
            struct = "DLManagedTensorVersioned" if versioned else "DLManagedTensor"
            managed = ffi.new(struct + " *")
            if versioned:
                managed.version.major, managed.version.minor = 1, 1
            tensor = managed.dl_tensor
            shape = ffi.new("int64_t[]", [fields.get("extent", 4), 1])
            strides = ffi.new("int64_t[]", [fields.get("stride", 1), 1])
            tensor.data = ffi.cast("void *", fields.get("data", data.ctypes.data))
            tensor.device.device_type = fields.get("device_type", lib.kDLCPU)
            tensor.device.device_id = fields.get("device_id", 0)
            tensor.ndim = fields.get("ndim", 1)
            tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes = lib.kDLFloat, 32, 1
            tensor.shape = (ffi.NULL if fields.get("shape") == "NULL"
                            else ffi.cast("int64_t *", fields.get("shape", 0)) if "shape" in fields
                            else shape)
            tensor.strides = (ffi.cast("int64_t *", fields["strides"]) if "strides" in fields
                              else strides if "stride" in fields else ffi.NULL)
            tensor.byte_offset = fields.get("byte_offset", 0)
            name_bytes = b"dltensor_versioned" if versioned else b"dltensor"
            capsule = new_capsule(int(ffi.cast("uintptr_t", managed)), name_bytes, None)
            try:
                array = pjrt.from_dlpack(capsule, device=device, copy=True)
                results[name] = ["ok", np.asarray(array).tolist()]
            except ValueError as error:
                results[name] = ["ValueError", str(error)]
        print(json.dumps(results))
    """
    result = run_python(script, timeout=60)
    import json

    results = json.loads(result.stdout.strip().splitlines()[-1])
    assert results.pop("valid") == ["ok", [0.0, 1.0, 2.0, 3.0]]
    for name, (kind, message) in results.items():
        expected = CAPSULE_CASES[name][1]
        assert kind == "ValueError" and expected in message, (name, kind, message)


# -- an import keeps its producer's memory ---------------------------------------------------

def test_an_import_keeps_the_producers_memory_until_its_last_owner_goes(make_client):
    """The producer's deleter runs once, when the last pjrt owner of the view goes (not
    when the producer's own object does)."""
    own = make_client(1)
    host = _aligned(np.arange(LARGE, dtype=np.float32))
    address, released = host.ctypes.data, []
    weakref.finalize(host, released.append, True)
    imported = pjrt.from_dlpack(host, device=own.local_devices()[0])
    del host
    gc.collect()
    assert imported.unsafe_buffer_pointer() == address and not released
    shard = copy.copy(imported)  # an independent copy: not an owner of the producer's memory
    np.testing.assert_array_equal(np.asarray(imported)[-3:], [LARGE - 3, LARGE - 2, LARGE - 1])
    del imported
    gc.collect()
    assert released == [True]
    np.testing.assert_array_equal(np.asarray(shard)[:3], [0, 1, 2])


@pytest.mark.slow  # importing torch in a fresh interpreter takes seconds
def test_a_torch_import_survives_its_tensor(cpu_plugin):
    """``q = pjrt.from_dlpack(t); del t`` and a collection: q still reads t's values (in a
    child, which must not crash), both as a view and through a program."""
    pytest.importorskip("torch")
    script = f"""
        import gc, numpy as np, pjrt, torch
        pjrt.load_pjrt_plugin_dynamically("cpu", {cpu_plugin_path(cpu_plugin.name)!r})
        client = pjrt.make_c_api_client("cpu", {{"cpu_device_count": 1}})
        device = client.local_devices()[0]
        for n in (8, {SMALL}, {LARGE}, 1 << 20):
            t = torch.arange(n, dtype=torch.float32)
            q = pjrt.from_dlpack(t, device=device)
            del t
            gc.collect()
            junk = [torch.full((n,), -1.0) for _ in range(8)]
            assert np.array_equal(np.asarray(q), np.arange(n, dtype=np.float32)), n
            assert np.array_equal(np.asarray(copy_of := q.copy_to_device(device)),
                                  np.arange(n, dtype=np.float32)), n
            del q, copy_of, junk
            gc.collect()
        print("ok")
    """
    assert run_python(script, timeout=60).stdout.strip() == "ok"


def test_reading_a_shared_array_over_and_over_keeps_no_dead_views(client):
    """A shared Array is read through a new view each time; the views that went are
    forgotten, so the bookkeeping stays small however often it is read."""
    x = client.buffer_from_pyval(np.arange(SMALL, dtype=np.float32))
    capsule_consumer = np.from_dlpack(x)  # a zero-copy export: x is shared from now on
    assert x.shared
    for _ in range(2000):
        assert float(np.asarray(x)[1]) == 1.0
    assert len(client._handle.viewed[id(x)]) <= 2
    del capsule_consumer

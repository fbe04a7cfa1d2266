"""Who frees each C handle, and when (handles.py), seen through the public API on the real CPU
plugins: nothing freed under a numpy view or a running call, close() with live arrays, the
child of a fork, exit with everything alive, and long loops that must not grow.

The tests look at ``client._handle`` (the ClientHandle) only to see whether a buffer or client
has really been freed; everything they do goes through public calls.
"""
from __future__ import annotations

import gc
import json
import os
import textwrap
import threading

import numpy as np
import pytest

import pjrt
from conftest import SLOW_SUM, cpu_plugin_path, run_python
from fixtures import programs

TINY = programs.get("tiny_tanh")
LARGE = 1 << 17  # float32 elements: 512 KiB, above the size read through a view


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_exit_with_clients_arrays_executables_and_views_alive(cpu_plugin):
    """Nothing is closed by hand: the atexit hook frees it all, and the exit is clean."""
    script = textwrap.dedent(f"""
        import numpy as np, pjrt
        pjrt.load_pjrt_plugin_dynamically("cpu", {cpu_plugin_path(cpu_plugin.name)!r})
        client = pjrt.make_c_api_client("cpu", {{"cpu_device_count": 2}})
        executable = client.compile_and_load(open({TINY.path()!r}).read())
        a = client.buffer_from_pyval(np.ones(8, np.float32))
        out = executable.execute([a, a])
        big = client.buffer_from_pyval(np.ones(1 << 18, np.float32))
        view = np.asarray(big)                  # a zero-copy view, alive at exit
        cycle = {{"client": client, "arrays": [a, big]}}
        cycle["self"] = cycle                   # and a reference cycle through the client
        print("ok", float(np.asarray(out[0])[0]), float(view[-1]))
    """)
    result = run_python(script)
    assert result.stdout.startswith("ok ")
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr


@pytest.mark.slow  # 22000 rounds
def test_long_loops_do_not_grow_memory(client):
    executable = client.compile_and_load(TINY.read_text())
    inputs = TINY.inputs()

    def round_trip():
        arrays = [client.buffer_from_pyval(x) for x in inputs]
        (out,) = executable.execute(arrays)
        np.asarray(out)

    for _ in range(2000):  # warm up: allocator pools and caches settle
        round_trip()
    gc.collect()
    before = _resident_bytes()
    for _ in range(20000):
        round_trip()
    gc.collect()
    grown = _resident_bytes() - before
    # 20000 rounds of 3 buffers: one leaked buffer (>= 32 bytes plus the plugin's own records)
    # per round would show as several MB.
    assert grown < 4 << 20, f"resident memory grew by {grown / 2**20:.1f} MiB"


def test_deleting_a_viewed_array_keeps_the_view_valid(client):
    array = client.buffer_from_pyval(np.arange(LARGE, dtype=np.float32))
    tail = np.asarray(array)[-3:]  # a derived view keeps the memory as well
    handle, key = array._handle, id(array)
    array.delete()
    assert array.is_deleted()
    with pytest.raises(pjrt.DeletedArrayError):
        array.block_until_ready()
    np.testing.assert_array_equal(tail, np.arange(LARGE - 3, LARGE, dtype=np.float32))
    assert key in handle.buffers  # still owned, for the view
    del array, tail
    gc.collect()
    assert key not in handle.buffers  # freed once the last view went


def test_closing_a_client_with_a_viewed_array(make_client):
    own = make_client(1)
    view = np.asarray(own.buffer_from_pyval(np.full(LARGE, 3.0, np.float32)))
    handle = own._handle
    own.close()
    assert own.is_closed
    assert float(view.sum()) == 3.0 * LARGE  # still readable: the client waits for the view
    del view
    gc.collect()
    assert handle.pointer == pjrt.array.ffi.NULL and not handle.buffers


def test_a_view_of_a_shard_outlives_its_global_array_and_client(make_client):
    own = make_client(2)
    mesh = pjrt.Mesh(np.array(own.devices()), ("a",))
    array = pjrt.device_put(np.arange(2 * 65536, dtype=np.float32).reshape(2, 65536),
                            pjrt.NamedSharding(mesh, pjrt.P("a")))
    view = np.asarray(array.addressable_shards[1].data)  # 256 KiB: a view of the buffer
    array.delete()
    own.close()
    np.testing.assert_array_equal(view[0, :3], [65536, 65537, 65538])


def test_delete_while_viewed_frees_the_buffer_with_the_last_view(make_client):
    """A buffer numpy reads in place is released by delete() but freed only when the last view
    goes, even while the deleted Array object is still referenced."""
    own = make_client(1)
    array = own.buffer_from_pyval(np.arange(LARGE, dtype=np.float32))
    view = np.asarray(array)
    handle, key = own._handle, id(array)
    array.delete()
    assert own.live_arrays() == [] and key in handle.buffers
    np.testing.assert_array_equal(view[:3], [0, 1, 2])
    del view
    gc.collect()
    assert key not in handle.buffers


def test_close_with_live_arrays_and_executables(make_client):
    """close() deletes what the client made: arrays and executables refuse use afterwards with
    ClosedClientError, and the C client is freed."""
    own = make_client(2)
    array = own.buffer_from_pyval(np.ones(8, np.float32))
    executable = own.compile_and_load(TINY.read_text())
    handle = own._handle
    own.close()
    assert array.is_deleted() and handle.pointer == pjrt.array.ffi.NULL
    assert not handle.buffers and not handle.executables
    with pytest.raises(pjrt.ClosedClientError, match="closed"):
        executable.execute([array, array])
    with pytest.raises(pjrt.ClosedClientError):
        own.compile_and_load(TINY.read_text())


def test_close_while_another_thread_waits_frees_after_the_wait(make_client):
    """close() under a running call only marks the client closed: the call finishes (with a
    result or ClosedClientError, never a crash) and the client is freed after it."""
    own = make_client(1)
    executable = own.compile_and_load(SLOW_SUM)
    x = own.buffer_from_pyval(np.ones(1 << 20, np.float32))
    outcome = {}
    started = threading.Event()

    def wait():
        try:
            (y,) = executable.execute([x])
            started.set()
            outcome["sum"] = float(np.asarray(y)[0])
        except pjrt.ClosedClientError as error:
            outcome["closed"] = str(error)
        finally:
            started.set()

    thread = threading.Thread(target=wait)
    thread.start()
    started.wait(30)
    handle = own._handle
    own.close()
    thread.join(60)
    assert not thread.is_alive()
    assert outcome.get("sum") == 40.0 or "closed" in outcome.get("closed", ""), outcome
    assert handle.pointer == pjrt.array.ffi.NULL and not handle.active
    with pytest.raises(pjrt.ClosedClientError):
        own.buffer_from_pyval(np.ones(2))


def test_a_forked_child_cannot_use_the_parents_client(cpu_plugin):
    """After fork() the child's copy of a client refuses every call with a message saying what
    to do (the plugin's threads did not survive the fork); the parent's client goes on."""
    result = run_python(f"""
        import os, warnings
        import numpy as np, pjrt
        from pjrt._capi import handles
        pjrt.load_pjrt_plugin_dynamically("cpu", {cpu_plugin_path(cpu_plugin.name)!r})
        client = pjrt.make_c_api_client("cpu", {{"cpu_device_count": 2}})
        array = client.buffer_from_pyval(np.arange(4.0))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pid = os.fork()
        if pid == 0:
            try:
                client.buffer_from_pyval(np.ones(2))
                code = 3
            except pjrt.ClosedClientError as error:
                ok = "fork" in str(error) and handles.fork_generation() == 1
                code = 0 if ok else 4
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
        print("generation", handles.fork_generation())
        print("warned", any("os.fork()" in str(w.message) for w in caught))
        print("parent", np.asarray(array).tolist())
    """)
    assert result.stdout.split("\n")[:4] == ["child 0", "generation 0", "warned True",
                                              "parent [0.0, 1.0, 2.0, 3.0]"]


def test_a_forked_child_closes_a_client_another_thread_was_busy_with(cpu_plugin):
    """fork() while another thread holds a lock of the client's (making a stand-in client for
    custom-call handlers, which takes the stand-ins' lock for as long as a client takes to
    start): the child's Client.close() and exit leave the parent's client alone at once
    instead of waiting for a lock no thread of the child will release. A fork hook records
    whether the lock was held at the fork; a child that did not inherit it held says so (exit
    status 3), and the parent forks again."""
    result = run_python(f"""
        import json, os, signal, sys, threading, time, warnings
        import pjrt
        from pjrt._runtime import handler_launches
        warnings.simplefilter("ignore")
        pjrt.load_pjrt_plugin_dynamically("cpu", {cpu_plugin_path(cpu_plugin.name)!r})
        clients = [pjrt.make_c_api_client("cpu", {{"cpu_device_count": 1}}) for _ in range(3)]
        held_at_fork = []
        os.register_at_fork(before=lambda: held_at_fork.append(handler_launches._making.locked()))

        def make_stand_ins():
            for index in range(handler_launches.MAX_STAND_INS):
                for client in clients:
                    handler_launches.stand_in_of(client, index)

        maker = threading.Thread(target=make_stand_ins)
        maker.start()

        def making():
            frame = sys._current_frames().get(maker.ident)
            while frame is not None:
                if frame.f_code.co_name == "stand_in_of":
                    return True
                frame = frame.f_back
            return False

        report = {{"tries": 0}}
        while maker.is_alive():
            if not making():
                time.sleep(0.001)
                continue
            report["tries"] += 1
            pid = os.fork()
            if pid == 0:
                started = time.monotonic()
                for client in clients:
                    client.close()
                print(json.dumps({{"child": {{"held": held_at_fork[-1],
                                             "closing": time.monotonic() - started}}}}),
                      flush=True)
                sys.exit(0 if held_at_fork[-1] else 3)
            deadline = time.monotonic() + 20
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
            if report["child_exit"] != 3:
                break
        maker.join()
        for client in clients:
            client.close()
        print(json.dumps(report), flush=True)
    """, timeout=300)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    report = lines[-1]
    assert "child" not in report, report  # the child ended
    assert report.get("child_exit") == 0, (report, result.stderr[-3000:])
    child = [line["child"] for line in lines if "child" in line][-1]
    assert child["held"] and child["closing"] < 2.0, child


@pytest.mark.parametrize("semantics", [pjrt.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL,
                                       pjrt.HostBufferSemantics.ZERO_COPY])
def test_host_memory_outlives_the_array_while_a_program_reads_it(client, semantics):
    """Large inputs may be used in place; freeing the array mid-program must not free them."""
    executable = client.compile_and_load(SLOW_SUM)
    for _ in range(3):
        x = client.buffer_from_pyval(np.ones(1 << 20, np.float32), host_buffer_semantics=semantics)
        (y,) = executable.execute([x])
        x.delete()
        del x
        gc.collect()
        np.testing.assert_array_equal(np.asarray(y), np.full(1 << 20, 40, np.float32))

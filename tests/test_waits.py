"""Waiting on the plugin (waits.py): waits that return to Python between slices so that Ctrl-C
is heard, and compilation on a large-stack worker thread, on the real CPU plugins."""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import pjrt
from conftest import child_env, cpu_plugin_path, run_python
from fixtures import programs
from interrupt_helpers import assert_interrupted, run_cpu_child
from long_programs import matmul_loop

TINY = programs.get("tiny_tanh")


def _nested_conditionals(depth: int) -> str:
    """``depth`` nested ``stablehlo.if`` regions: XLA's compiler recurses once per level, and
    takes a while over them."""
    lines = ["func.func public @main(%p: tensor<i1>, %x: tensor<f32>) -> tensor<f32> {"]
    close = []
    for level in range(depth, 0, -1):
        lines.append(f'%r{level} = "stablehlo.if"(%p) ({{')
        close.append(f"}}, {{\n stablehlo.return %x : tensor<f32>\n}}) : (tensor<i1>) -> tensor<f32>\n"
                     f"{'return' if level == depth else 'stablehlo.return'} %r{level} : tensor<f32>")
    lines.append("%r0 = stablehlo.add %x, %x : tensor<f32>\nstablehlo.return %r0 : tensor<f32>")
    lines.extend(reversed(close))
    lines.append("}")
    return "\n".join(lines)


def test_execution_is_asynchronous_and_reading_waits(client):
    """A long program: execute returns before its output is computed; np.asarray waits."""
    executable = client.compile_and_load(matmul_loop(200))
    x = client.buffer_from_pyval(np.full((256, 256), 0.01, np.float32))
    (out,) = executable.execute([x])
    was_ready = out.is_ready()
    value = np.asarray(out)
    assert out.is_ready()
    assert value.shape == (256, 256) and np.isfinite(value).all()
    # 200 dependent 256^3 matmuls take far longer than launching them.
    assert not was_ready


@pytest.mark.slow
def test_ctrl_c_interrupts_a_wait_and_the_result_arrives_later(cpu_plugin):
    """A KeyboardInterrupt ends block_until_ready() within a wait slice, long before the
    program is done; the program goes on, its output can be read later, and the client keeps
    working. In a child process, where the signal cannot reach pytest."""
    reports = run_cpu_child(cpu_plugin_path(cpu_plugin.name), f"""
        client = pjrt.make_c_api_client("cpu")
        executable = client.compile_and_load({matmul_loop(12000)!r})  # ~2 s on an idle machine
        x = client.buffer_from_pyval(np.full((256, 256), 0.01, np.float32))
        (out,) = executable.execute([x])
        interrupt("wait", out.block_until_ready, inside="event")
        ready_then = out.is_ready()
        value = np.asarray(out)
        tiny = pjrt.compile({TINY.read_text()!r}, client.devices()[0])
        again = np.asarray(tiny(np.ones(8, np.float32), np.ones(8, np.float32)))
        print(json.dumps({{"case": "after", "ready_then": ready_then,
                          "finite": bool(np.isfinite(value).all()), "again": float(again[0])}}))
    """)
    assert_interrupted(reports["wait"])  # within a slice or so of the first signal
    after = reports["after"]
    assert not after["ready_then"], after  # the wait ended before the program did
    assert after["finite"], after
    np.testing.assert_allclose(after["again"], np.tanh(2.0), rtol=1e-6)


def test_a_global_array_is_ready_once_every_shard_is(client):
    """block_until_ready() on an array of several shards waits for all of them at once (one
    native wait); each shard then holds its own device's result."""
    devices = client.devices()[:4]
    compiled = pjrt.compile(matmul_loop(20), devices, replicated=True)
    x = np.stack([np.full((256, 256), 0.001 * (i + 1), np.float32) for i in range(4)])
    out = compiled(x)
    assert len(out.addressable_shards) == 4
    assert out.block_until_ready() is out
    assert out.is_ready() and all(s.data.is_ready() for s in out.addressable_shards)
    one = pjrt.compile(matmul_loop(20), devices[0])
    for i, shard in enumerate(out.addressable_shards):
        np.testing.assert_allclose(np.asarray(shard.data), np.asarray(one(x[i])), rtol=1e-5)
    # Ready already: the same wait returns at once, and again after the array is read.
    out.block_until_ready()
    pjrt.transfers.batched_block_until_ready([out, out])
    out.delete()
    with pytest.raises(pjrt.DeletedArrayError):
        out.block_until_ready()


def test_block_until_ready_of_several_arrays_waits_for_every_one(client):
    """`pjrt.block_until_ready` of a list of arrays still being computed (the arrays of one
    client are waited on together, in one native wait): when it returns every one is ready
    and holds its value; it returns the list; a deleted array among them raises jaxlib's
    error."""
    executable = client.compile_and_load(matmul_loop(200))
    x = client.buffer_from_pyval(np.full((256, 256), 0.01, np.float32))
    outs = [executable.execute([x])[0] for _ in range(3)]
    # 600 dependent 256^3 matmuls take far longer than launching them.
    assert not outs[-1].is_ready()
    assert pjrt.block_until_ready(outs) == outs
    assert all(out.is_ready() for out in outs)
    first = np.asarray(outs[0])
    assert np.isfinite(first).all()
    for out in outs[1:]:
        np.testing.assert_array_equal(np.asarray(out), first)
    outs[1].delete()
    with pytest.raises(pjrt.DeletedArrayError, match="BlockHostUntilReady"):
        pjrt.block_until_ready(outs)


def _release_once_waiting(gate: threading.Event, function: str, seconds: float = 60) -> None:
    """Set ``gate`` once the main thread is inside ``function`` (seen from its current frame),
    or after ``seconds`` in any case."""
    main = threading.main_thread().ident
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(main)
        if frame is not None and frame.f_code.co_name == function:
            break
        time.sleep(0.005)
    gate.set()


def _refusing_from_shard_2(gate: threading.Event):
    """A custom-call handler for `_program_calling`: the shards whose x holds 2 or more
    wait for ``gate``, then fail; the others return the loop's matrix."""
    def handler(operands, results, attributes):
        shard = int(operands[0].flat[0])
        if shard >= 2:
            gate.wait(60)
            raise ValueError(f"shard {shard} refused on purpose")
        results[0][...] = operands[1]
    return handler


def _program_calling(target: str) -> str:
    """A short `matmul_loop` whose result goes through the custom call ``target`` with x; run
    replicated, with each shard's x filled with its index."""
    return matmul_loop(20, then=(
        f"%y = stablehlo.custom_call @{target}(%x, %r#1) {{api_version = 4 : i32}} : "
        f"(tensor<256x256xf32>, tensor<256x256xf32>) -> tensor<256x256xf32>"),
        returns="%y : tensor<256x256xf32>")


#: The input of `_program_calling` on 4 devices: each shard's x holds its index.
SHARD_INDICES = np.stack([np.full((256, 256), i, np.float32) for i in range(4)])


def test_a_failed_shard_raises_its_error_from_the_wait_on_a_global_array(client):
    """A shard whose computation fails after the launch: the one native wait on every shard
    raises that shard's error (of the first failed shard, in device order, when several
    fail), again on a later wait, and the other shards, the executable and the client go on
    working.

    The failure comes from a Python custom call after a loop, so XLA's CPU plugin runs the
    program asynchronously and the error reaches pjrt through the shards' ready events; the
    failing shards' handler holds back until the caller is inside the wait, so the error
    arrives while it waits (through the event's callback), not before."""
    target = f"waits_refuses_shards_{id(client)}"
    gate = threading.Event()
    pjrt.register_custom_call_target(target, _refusing_from_shard_2(gate))
    compiled = pjrt.compile(_program_calling(target), client.devices()[:4], replicated=True)
    releaser = threading.Thread(target=_release_once_waiting, args=(gate, "wait_buffers_ready"),
                                daemon=True)
    try:
        out = compiled(SHARD_INDICES)  # the launch succeeds: the failure comes later
        assert not out.is_ready()
        releaser.start()
        with pytest.raises(pjrt.XlaRuntimeError, match="shard 2 refused on purpose") as caught:
            out.block_until_ready()
    finally:
        gate.set()
    assert "shard 3" not in str(caught.value)
    # Every event has fired now: a second wait finds the same error without waiting.
    with pytest.raises(pjrt.XlaRuntimeError, match="shard 2 refused on purpose"):
        out.block_until_ready()
    with pytest.raises(pjrt.XlaRuntimeError, match="shard 2 refused on purpose"):
        np.asarray(out)
    # Waited on together with arrays that are fine (shards 0 and 1), the same error.
    with pytest.raises(pjrt.XlaRuntimeError, match="shard 2 refused on purpose"):
        pjrt.block_until_ready([out.addressable_shards[0].data, out,
                                out.addressable_shards[1].data])
    shards = [shard.data for shard in out.addressable_shards]
    np.testing.assert_array_equal(np.asarray(shards[0]), np.zeros((256, 256), np.float32))
    np.testing.assert_allclose(np.asarray(shards[1]), np.ones((256, 256), np.float32), rtol=1e-6)
    with pytest.raises(pjrt.XlaRuntimeError, match="shard 3 refused on purpose"):
        shards[3].block_until_ready()
    # The executable runs again where no shard fails, and the client goes on.
    again = compiled(np.zeros((4, 256, 256), np.float32))
    np.testing.assert_array_equal(np.asarray(again), np.zeros((4, 256, 256), np.float32))
    program = pjrt.compile(TINY.read_text(), client.devices()[0])
    programs.check_outputs(TINY, [np.asarray(program(*TINY.inputs()))])


def test_a_failed_shard_raises_its_error_from_a_plugin_without_on_ready(built, cpu_plugin):
    """As above, through a plugin that has no ``PJRT_Event_OnReady`` (the fault plugin
    forwarding to XLA's CPU plugin, with that entry left out): the wait awaits each shard's
    event in turn and keeps the first failed shard's error. In a child process, which loads
    the fault plugin with its own settings."""
    result = run_python("""
        import json, sys, threading
        import numpy as np, pjrt
        from test_waits import (SHARD_INDICES, _program_calling, _refusing_from_shard_2,
                                _release_once_waiting)

        pjrt.load_pjrt_plugin_dynamically("cpu", sys.argv[1])
        client = pjrt.make_c_api_client("cpu", {"cpu_device_count": 4})
        report = {"on_ready": client.raw_handle.api.has("PJRT_Event_OnReady")}
        gate = threading.Event()
        pjrt.register_custom_call_target("refuse", _refusing_from_shard_2(gate))
        compiled = pjrt.compile(_program_calling("refuse"), client.devices()[:4],
                                replicated=True)
        out = compiled(SHARD_INDICES)
        report["ready_at_launch"] = out.is_ready()
        threading.Thread(target=_release_once_waiting, args=(gate, "wait_buffers_ready"),
                         daemon=True).start()
        report["errors"] = []
        for _ in range(2):
            try:
                out.block_until_ready()
                report["errors"].append(None)
            except pjrt.XlaRuntimeError as error:
                report["errors"].append(str(error))
        gate.set()
        report["shard 1"] = np.asarray(out.addressable_shards[1].data).tolist()[0][:4]
        report["again"] = np.asarray(compiled(np.zeros((4, 256, 256), np.float32))).tolist()[3][0][:4]
        print(json.dumps(report))
    """, built.fault_plugin, env=child_env(
        drop=("PJRT_FAULT",), PJRT_FAULT_DELEGATE=cpu_plugin_path(cpu_plugin.name),
        PJRT_FAULT="no_on_ready"), timeout=300)
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["on_ready"] is False, report
    assert report["ready_at_launch"] is False, report
    for error in report["errors"]:
        assert error is not None and "shard 2 refused on purpose" in error, report
        assert "shard 3" not in error, report
    assert report["shard 1"] == [1.0] * 4, report
    assert report["again"] == [0.0] * 4, report


def test_ctrl_c_before_a_shard_fails_leaves_its_error_to_the_next_wait(cpu_plugin):
    """A wait on a global array interrupted while two shards are still running: when they
    then fail, the abandoned wait's state takes their errors and frees them with itself (the
    last shard to finish frees it), and a new wait raises the first failed shard's error. In
    a child process, where the signal cannot reach pytest."""
    reports = run_cpu_child(cpu_plugin_path(cpu_plugin.name), """
        import threading
        from test_waits import SHARD_INDICES, _program_calling, _refusing_from_shard_2

        client = pjrt.make_c_api_client("cpu", {"cpu_device_count": 4})
        gate = threading.Event()  # shards 2 and 3 run until it is set
        pjrt.register_custom_call_target("refuse", _refusing_from_shard_2(gate))
        compiled = pjrt.compile(_program_calling("refuse"), client.devices()[:4],
                                replicated=True)
        out = compiled(SHARD_INDICES)
        interrupt("wait", out.block_until_ready, inside="shards")
        gate.set()
        errors = []
        for _ in range(2):
            try:
                out.block_until_ready()
                errors.append(None)
            except pjrt.XlaRuntimeError as error:
                errors.append(str(error))
        again = np.asarray(compiled(np.zeros((4, 256, 256), np.float32)))
        print(json.dumps({"case": "after", "errors": errors,
                          "again": bool((again == 0).all())}))
    """)
    assert_interrupted(reports["wait"])
    after = reports["after"]
    for error in after["errors"]:
        assert error is not None and "shard 2 refused on purpose" in error, after
        assert "shard 3" not in error, after
    assert after["again"], after


@pytest.mark.slow
def test_ctrl_c_interrupts_a_wait_on_a_global_array(cpu_plugin):
    """As above, for the shared wait on every shard of a global array: the interrupted wait's
    state is freed by the last shard to finish, and exit meets nothing left over."""
    reports = run_cpu_child(cpu_plugin_path(cpu_plugin.name), f"""
        client = pjrt.make_c_api_client("cpu", {{"cpu_device_count": 2}})
        compiled = pjrt.compile({matmul_loop(6000)!r}, client.devices()[:2], replicated=True)
        x = np.full((2, 256, 256), 0.01, np.float32)
        out = compiled(x)
        interrupt("wait", out.block_until_ready, inside="shards")
        ready_then = out.is_ready()
        out.block_until_ready()
        value = np.asarray(out)
        second = compiled(x * 0)
        print(json.dumps({{"case": "after", "ready_then": ready_then,
                          "finite": bool(np.isfinite(value).all()),
                          "zeros": bool((np.asarray(second) == 0).all())}}))
    """)
    assert_interrupted(reports["wait"])
    after = reports["after"]
    assert not after["ready_then"], after
    assert after["finite"] and after["zeros"], after


@pytest.mark.slow
def test_ctrl_c_interrupts_a_compile_and_the_client_goes_on(cpu_plugin):
    """Compilation runs on a worker thread while the caller waits in slices: a KeyboardInterrupt
    ends the wait at once, the abandoned executable is freed when the compile finishes, and the
    client compiles and closes normally afterwards."""
    result = run_python(f"""
        import json, signal, time
        import numpy as np, pjrt
        pjrt.load_pjrt_plugin_dynamically("cpu", {cpu_plugin_path(cpu_plugin.name)!r})
        client = pjrt.make_c_api_client("cpu")
        text = {_nested_conditionals(110)!r}

        def interrupt(signum, frame):
            raise KeyboardInterrupt
        signal.signal(signal.SIGALRM, interrupt)
        start = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        try:
            client.compile_and_load(text)
            interrupted = None
        except KeyboardInterrupt:
            interrupted = time.monotonic() - start
        start = time.monotonic()
        program = pjrt.compile(text, client.devices()[0])
        full = time.monotonic() - start
        value = float(np.asarray(program(np.array(True), np.float32(1.5))))
        deadline = time.monotonic() + 60
        while client._handle.active and time.monotonic() < deadline:
            time.sleep(0.05)  # the abandoned compile ends its call when it finishes
        print(json.dumps({{"interrupted": interrupted, "full": full, "value": value,
                          "executables": len(client.live_executables()),
                          "active": len(client._handle.active)}}))
        client.close()
        print("closed", client.is_closed)
    """, timeout=300)
    lines = result.stdout.splitlines()
    outcome = json.loads(lines[-2])
    assert lines[-1] == "closed True"
    assert outcome["interrupted"] is not None and outcome["interrupted"] < outcome["full"] / 2, outcome
    assert outcome["value"] == 3.0
    assert outcome["executables"] == 1 and outcome["active"] == 0, outcome


def test_compiles_from_several_threads_each_get_their_program(client):
    """Each compile waits for its own result from the worker threads."""
    results, errors = {}, []

    def work(scale: int):
        try:
            text = f"""func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {{
              %c = stablehlo.constant dense<{scale}.0> : tensor<4xf32>
              %0 = stablehlo.multiply %x, %c : tensor<4xf32>
              return %0 : tensor<4xf32>
            }}"""
            program = pjrt.compile(text, client.devices()[scale % 8])
            results[scale] = np.asarray(program(np.arange(4, dtype=np.float32))).tolist()
        except Exception as error:  # noqa: BLE001 - collected and re-raised in the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(scale,)) for scale in range(1, 7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert results == {scale: [0.0, scale, 2.0 * scale, 3.0 * scale] for scale in range(1, 7)}


def test_a_compile_error_reaches_the_caller(client):
    """An error raised on the compile thread is raised in the calling thread, as the plugin's
    own error, and the next compile works."""
    with pytest.raises(pjrt.XlaRuntimeError):
        client.compile_and_load("func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {"
                                " %0 = stablehlo.add %x, %y : tensor<4xf32> return %0 }")
    program = pjrt.compile(TINY.read_text(), client.devices()[0])
    programs.check_outputs(TINY, [np.asarray(program(*TINY.inputs()))])


DAEMON_COMPILE_AT_EXIT = r"""
import atexit, sys, threading, time
# Registered before pjrt's exit hooks, so it runs after them: an exit that takes a while
# longer (as a program's own hooks may), during which other threads run.
atexit.register(time.sleep, 1.0)
import pjrt
pjrt.load_pjrt_plugin_dynamically("cpu", sys.argv[1])
client = pjrt.make_c_api_client("cpu")
program = open(sys.argv[2]).read()
started = time.monotonic()
client.compile_and_load(program)
sys.stderr.write(f"COMPILE TOOK {time.monotonic() - started:.2f}\n")

def compile_then_go_on():
    client.compile_and_load(program)
    sys.stderr.write("RETURNED INTO PYTHON AFTER THE EXIT BEGAN\n")

threading.Thread(target=compile_then_go_on, daemon=True).start()
time.sleep(0.05)
sys.exit(3)
"""


def test_a_daemon_threads_call_ending_during_the_exit_does_not_return_into_python(tmp_path):
    """A compile in a daemon thread that ends while the exit waits for it (the client already
    closed) keeps its thread in the call: going on, the thread could print while the interpreter
    finalises, which CPython ends with an abort. (The compile takes about a second here, within
    the exit's waits, and the program's own exit hook then gives the thread time to go on; on a
    machine slow enough for the compile to outlast the waits, the process ends with it still
    running, and nothing returns either.)"""
    sys.path.insert(0, str(Path(__file__).parent / "stress"))
    import stress_programs

    program = tmp_path / "program.mlir"
    program.write_text(stress_programs.unrolled_program(3000))
    result = run_python(DAEMON_COMPILE_AT_EXIT, cpu_plugin_path("xla_cpu_0_81"), str(program),
                        env=child_env(), check=False)
    assert result.returncode == 3, result.stderr[-3000:]
    assert "COMPILE TOOK" in result.stderr
    assert "RETURNED INTO PYTHON" not in result.stderr, result.stderr[-3000:]
    assert "Exception in thread" not in result.stderr, result.stderr[-3000:]


def test_native_work_may_begin_while_the_count_is_being_changed_on_the_same_thread():
    """The collector may run an Array's finaliser on a thread while that thread changes the
    count of native work in flight (an allocation under the count's lock), and the finaliser
    may free a client's objects, which counts itself as native work: that must not deadlock."""
    from pjrt._capi import exit_guard

    finished = threading.Event()

    def count_inside_the_lock():
        with exit_guard._in_flight_lock:  # where the finaliser would run
            with exit_guard.native_work:
                finished.set()

    thread = threading.Thread(target=count_inside_the_lock, daemon=True)
    thread.start()
    assert finished.wait(10), "native_work deadlocked under the count's own lock"
    thread.join(10)
    assert exit_guard.calls_in_flight() == 0

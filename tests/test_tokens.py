"""Tokens of a program's run (pjrt.tokens), on the real CPU plugins: the plugin's completion
events, one per device, waited for by any number of threads at once (each returning when the
run has finished); taken once from the results; on every path a launch can take (the caller's
thread, a worker)."""
from __future__ import annotations

import gc
import json
import sys
import threading
import time

import numpy as np
import pytest

import pjrt

from conftest import child_env, cpu_plugin_path, run_python
from fixtures import programs
from interrupt_helpers import assert_interrupted, run_cpu_child
from long_programs import matmul_loop

TINY = programs.get("tiny_tanh")


def _inputs(client, device):
    return [client.buffer_from_pyval(x, device) for x in TINY.inputs()]


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "worker"])
def test_execute_with_token_waits_for_the_run(client, inline):
    executable = client.compile_and_load(TINY.read_text(), client.local_devices()[:1])
    executable.launches_inline = inline
    arguments = _inputs(client, client.local_devices()[0])
    outputs, token = executable.execute_with_token(arguments)
    token.block_until_ready()
    token.block_until_ready()  # the outcome is kept: a later wait returns at once
    a, b = TINY.inputs()
    np.testing.assert_allclose(np.asarray(outputs[0]), np.tanh(a * b + 1), rtol=1e-6)


def test_a_sharded_token_has_one_token_per_device(client):
    devices = client.local_devices()[:2]
    executable = client.compile_and_load(TINY.read_text(), devices, replicated=True)
    arguments = [[client.buffer_from_pyval(x, d) for d in devices] for x in TINY.inputs()]
    results = executable.execute_sharded(arguments, with_tokens=True)
    token = results.consume_token()
    for device in devices:
        token.get_token_for_device_id(device.id).block_until_ready()
    token.block_until_ready()
    with pytest.raises(ValueError, match="not on device"):
        token.get_token_for_device_id(client.local_devices()[2].id)
    with pytest.raises(RuntimeError, match="taken once"):
        results.consume_token()
    outputs = results.disassemble_into_single_device_arrays()
    a, b = TINY.inputs()
    for array in outputs[0]:
        np.testing.assert_allclose(np.asarray(array), np.tanh(a * b + 1), rtol=1e-6)


def test_results_without_tokens_have_none_to_give(client):
    devices = client.local_devices()[:2]
    executable = client.compile_and_load(TINY.read_text(), devices, replicated=True)
    arguments = [[client.buffer_from_pyval(x, d) for d in devices] for x in TINY.inputs()]
    results = executable.execute_sharded(arguments)
    with pytest.raises(RuntimeError, match="with_tokens=True"):
        results.consume_token()


def test_dropped_tokens_leave_the_client_working_and_a_closed_clients_token_raises(
        make_client):
    """Tokens dropped unwaited (their events freed under a ticket) leave the client and its
    later runs working; a token whose client is closed raises ClosedClientError when waited
    on, and dropping it calls nothing on the closed client (no crash)."""
    client = make_client()
    executable = client.compile_and_load(TINY.read_text(), client.local_devices()[:1])
    arguments = _inputs(client, client.local_devices()[0])
    for _ in range(50):
        outputs, token = executable.execute_with_token(arguments)
        del token  # its event is freed with it, under a ticket on the open client
    gc.collect()
    outputs, token = executable.execute_with_token(arguments)
    np.asarray(outputs[0])
    client.close()
    with pytest.raises(pjrt.ClosedClientError):
        token.block_until_ready()
    del token
    gc.collect()  # a closed client's event is left alone: nothing of it may be called


# -- several threads waiting on one run --------------------------------------------------------

#: Iterations of `matmul_loop` for a run of about half a second on an idle machine (more when
#: loaded): far longer than the waiting threads take to start.
SLOW_ITERATIONS = 3000

WAITERS = 4


def _slow_on(client, devices):
    return client.compile_and_load(matmul_loop(SLOW_ITERATIONS), devices,
                                   replicated=len(devices) > 1)


def _ones_on(client, devices):
    return [[client.buffer_from_pyval(np.full((256, 256), 0.01, np.float32), d)
             for d in devices]]


def _in_threads(waits):
    """Run each of ``waits`` in a thread of its own, all released together; what each
    returned (or the exception it raised)."""
    start = threading.Barrier(len(waits))
    seen: list = [None] * len(waits)

    def run(i):
        start.wait()
        try:
            seen[i] = waits[i]()
        except BaseException as error:  # noqa: BLE001 - reported by the test
            seen[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(waits))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads), "a wait never returned"
    return seen


def test_every_thread_waiting_on_a_token_returns_once_the_run_has_finished(client):
    """Four threads wait on one token: each returns only when the run has finished (its
    output is then ready), as each of jaxlib's concurrent waits does; a wait after them
    returns at once."""
    device = client.local_devices()[0]
    executable = _slow_on(client, [device])
    (x,), = _ones_on(client, [device])
    (y,), token = executable.execute_with_token([x])

    def wait():
        token.block_until_ready()
        return y.is_ready()

    assert _in_threads([wait] * WAITERS) == [True] * WAITERS
    token.block_until_ready()
    assert np.isfinite(np.asarray(y)).all()


def test_every_thread_waiting_on_a_sharded_token_returns_once_the_run_has_finished(client):
    """Threads waiting on one ShardedToken, and on the tokens of its devices, each return
    only when the run has finished there (every device for the ShardedToken)."""
    devices = client.local_devices()[:2]
    executable = _slow_on(client, devices)
    results = executable.execute_sharded(_ones_on(client, devices), with_tokens=True)
    token = results.consume_token()
    (outputs,) = results.disassemble_into_single_device_arrays()

    def wait_all():
        token.block_until_ready()
        return [y.is_ready() for y in outputs]

    def wait_on(d):
        def wait():
            token.get_token_for_device_id(devices[d].id).block_until_ready()
            return [outputs[d].is_ready()]
        return wait

    seen = _in_threads([wait_all, wait_all, wait_on(0), wait_on(1), wait_on(0), wait_on(1)])
    assert seen == [[True, True]] * 2 + [[True]] * 4


def _failing_later(gate: threading.Event):
    """A custom-call handler that fails once ``gate`` is set."""
    def handler(operands, results, attributes):
        gate.wait(60)
        raise ValueError("the run failed on purpose")
    return handler


def test_every_thread_waiting_on_a_failed_run_raises_its_error(client):
    """A run that fails after its launch: each of the threads waiting on its token raises the
    program's error, and so does a later wait."""
    target = f"tokens_fail_later_{id(client)}"
    gate = threading.Event()
    pjrt.register_custom_call_target(target, _failing_later(gate))
    device = client.local_devices()[0]
    executable = client.compile_and_load(matmul_loop(20, then=(
        f"%y = stablehlo.custom_call @{target}(%x, %r#1) {{api_version = 4 : i32}} : "
        f"(tensor<256x256xf32>, tensor<256x256xf32>) -> tensor<256x256xf32>"),
        returns="%y : tensor<256x256xf32>"), [device])
    (x,), = _ones_on(client, [device])
    try:
        _, token = executable.execute_with_token([x])
        opener = threading.Timer(0.5, gate.set)
        opener.start()
        seen = _in_threads([token.block_until_ready] * WAITERS)
    finally:
        gate.set()
    for error in seen:
        assert isinstance(error, pjrt.XlaRuntimeError), seen
        assert "the run failed on purpose" in str(error)
    with pytest.raises(pjrt.XlaRuntimeError, match="the run failed on purpose"):
        token.block_until_ready()


def test_threads_waiting_on_a_sharded_token_of_a_failed_run_raise_the_first_error(client):
    """A run that fails on devices 2 and 3 after its launch (their custom call waits, then
    raises): each thread waiting on the ShardedToken raises device 2's error, the first in
    device order, once every device has finished; device 1's token returns, device 3's raises
    its own error."""
    from test_waits import SHARD_INDICES, _program_calling, _refusing_from_shard_2

    target = f"tokens_refuse_shards_{id(client)}"
    gate = threading.Event()
    pjrt.register_custom_call_target(target, _refusing_from_shard_2(gate))
    devices = client.local_devices()[:4]
    executable = client.compile_and_load(_program_calling(target), devices, replicated=True)
    arguments = [[client.buffer_from_pyval(SHARD_INDICES[d], device)
                  for d, device in enumerate(devices)]]
    try:
        results = executable.execute_sharded(arguments, with_tokens=True)
        token = results.consume_token()
        threading.Timer(0.5, gate.set).start()
        seen = _in_threads([token.block_until_ready] * WAITERS)
    finally:
        gate.set()
    for error in seen:
        assert isinstance(error, pjrt.XlaRuntimeError), seen
        assert "shard 2 refused on purpose" in str(error), seen
    token.get_token_for_device_id(devices[1].id).block_until_ready()
    with pytest.raises(pjrt.XlaRuntimeError, match="shard 3 refused on purpose"):
        token.get_token_for_device_id(devices[3].id).block_until_ready()


@pytest.mark.slow
def test_ctrl_c_ends_one_wait_on_a_token_and_the_others_go_on(cpu_plugin):
    """A KeyboardInterrupt ends the main thread's wait on a token within a wait slice; another
    thread waiting on the same token goes on until the run has finished, and a later wait of
    the main thread waits for the run again rather than returning at once. In a child
    process, where the signal cannot reach pytest."""
    reports = run_cpu_child(cpu_plugin_path(cpu_plugin.name), f"""
        import threading
        client = pjrt.make_c_api_client("cpu")
        executable = client.compile_and_load({matmul_loop(4 * SLOW_ITERATIONS)!r})
        x = client.buffer_from_pyval(np.full((256, 256), 0.01, np.float32))
        (y,), token = executable.execute_with_token([x])
        other = []

        def wait():
            token.block_until_ready()
            other.append(y.is_ready())

        thread = threading.Thread(target=wait)
        thread.start()
        interrupt("wait", token.block_until_ready, inside="event")
        ready_then = y.is_ready()
        token.block_until_ready()
        ready_after = y.is_ready()
        thread.join()
        print(json.dumps({{"case": "after", "ready_then": ready_then,
                          "ready_after": ready_after, "other": other}}))
    """)
    assert_interrupted(reports["wait"])
    after = reports["after"]
    assert after["ready_after"], after
    assert after["other"] == [True], after


def _waiting_or_done(threads, seconds: float = 60) -> None:
    """Return once each of ``threads`` waits inside a token's wait on its event, or has
    ended."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        frames = sys._current_frames()
        if all(not thread.is_alive() or (thread.ident in frames and frames[
                thread.ident].f_code.co_name == "wait_for_waiter") for thread in threads):
            return
        time.sleep(0.005)
    raise AssertionError("the threads did not come to wait on the token")


def test_closing_the_client_under_waits_on_a_token_lets_them_finish(make_client):
    """The client is closed while threads wait on a token: each wait ends only with the run
    (seen by a custom call at its end; the client is freed after the waits), the event is
    freed once; a wait after the close raises ClosedClientError, and dropping the token calls
    nothing on the closed client."""
    client = make_client(devices=1)
    target = f"tokens_mark_end_{id(client)}"
    ended = threading.Event()

    def mark_end(operands, results, attributes):
        ended.set()
        results[0][...] = operands[1]

    pjrt.register_custom_call_target(target, mark_end)
    device = client.local_devices()[0]
    executable = client.compile_and_load(matmul_loop(SLOW_ITERATIONS, then=(
        f"%y = stablehlo.custom_call @{target}(%x, %r#1) {{api_version = 4 : i32}} : "
        f"(tensor<256x256xf32>, tensor<256x256xf32>) -> tensor<256x256xf32>"),
        returns="%y : tensor<256x256xf32>"), [device])
    (x,), = _ones_on(client, [device])
    _, token = executable.execute_with_token([x])
    seen: list = []

    def wait():
        token.block_until_ready()
        seen.append(ended.is_set())

    threads = [threading.Thread(target=wait) for _ in range(WAITERS)]
    for thread in threads:
        thread.start()
    _waiting_or_done(threads)
    client.close()
    for thread in threads:
        thread.join(120)
    assert seen == [True] * WAITERS
    with pytest.raises(pjrt.ClosedClientError):
        token.block_until_ready()
    del token
    gc.collect()


def test_threads_waiting_on_a_token_of_a_plugin_without_on_ready(built, cpu_plugin):
    """Through a plugin that has no ``PJRT_Event_OnReady`` (the fault plugin forwarding to
    XLA's CPU plugin, with that entry left out), where a wait cannot be sliced: one thread
    awaits the event and the others wait for it, so each still returns only once the run has
    finished, and each raises a failed run's error. In a child process, which loads the fault
    plugin with its own settings."""
    result = run_python(f"""
        import json, sys, threading
        import numpy as np, pjrt
        from test_tokens import (SLOW_ITERATIONS, WAITERS, _failing_later, _in_threads,
                                 _ones_on, _slow_on)
        from long_programs import matmul_loop

        pjrt.load_pjrt_plugin_dynamically("cpu", sys.argv[1])
        client = pjrt.make_c_api_client("cpu", {{"cpu_device_count": 2}})
        report = {{"on_ready": client.raw_handle.api.has("PJRT_Event_OnReady")}}
        devices = client.local_devices()
        (y,), token = _slow_on(client, devices[:1]).execute_with_token(
            _ones_on(client, devices[:1])[0])

        def wait():
            token.block_until_ready()
            return y.is_ready()

        report["ready"] = _in_threads([wait] * WAITERS)
        gate = threading.Event()
        pjrt.register_custom_call_target("fail_later", _failing_later(gate))
        failing = client.compile_and_load(matmul_loop(20, then=(
            "%y = stablehlo.custom_call @fail_later(%x, %r#1) {{api_version = 4 : i32}} : "
            "(tensor<256x256xf32>, tensor<256x256xf32>) -> tensor<256x256xf32>"),
            returns="%y : tensor<256x256xf32>"), devices[:1])
        _, token = failing.execute_with_token(_ones_on(client, devices[:1])[0])
        threading.Timer(0.5, gate.set).start()
        report["errors"] = [str(e) for e in _in_threads([token.block_until_ready] * WAITERS)]
        print(json.dumps(report))
    """, built.fault_plugin, env=child_env(
        drop=("PJRT_FAULT",), PJRT_FAULT_DELEGATE=cpu_plugin_path(cpu_plugin.name),
        PJRT_FAULT="no_on_ready"), timeout=300)
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["on_ready"] is False, report
    assert report["ready"] == [True] * WAITERS, report
    assert all("the run failed on purpose" in error for error in report["errors"]), report

"""Crash-isolated compilation's worker: bounded in time, interruptible, and aware of the
custom-call targets registered in this process.

A compile that hangs in a real plugin is hard to make, so the worker is stopped with SIGSTOP:
from the parent's side a stopped worker and a hung compiler look the same (no answer).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import numpy as np
import pytest

import pjrt
from pjrt._compile import isolated_compile
from pjrt.program import IsolatedCompileTimeout

from conftest import child_env

TANH = """
func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.tanh %x : tensor<4xf32>
  return %0 : tensor<4xf32>
}"""


def worker_pids(parent: int) -> set[int]:
    """The isolation workers among ``parent``'s children (Linux /proc)."""
    pids = set()
    for task in os.listdir(f"/proc/{parent}/task"):
        with open(f"/proc/{parent}/task/{task}/children") as children:
            for pid in children.read().split():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                        if b"pjrt._compile.isolated_worker" in cmdline.read():
                            pids.add(int(pid))
                except FileNotFoundError:
                    pass
    return pids


def gone(pid: int) -> bool:
    """Whether ``pid`` no longer exists (ended and reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_hung_worker_is_killed_at_the_time_limit(client, monkeypatch):
    isolated_compile.shutdown_workers()
    try:
        client.compile_and_load(TANH, isolate=True)  # starts the worker, unhurried
        (pid,) = worker_pids(os.getpid())
        os.kill(pid, signal.SIGSTOP)
        monkeypatch.setenv(isolated_compile.TIMEOUT_ENV, "1")
        started = time.monotonic()
        with pytest.raises(IsolatedCompileTimeout, match=r"within the limit of 1 s "
                                                         r"\(PJRT_ISOLATED_COMPILE_TIMEOUT\)"
                           ) as raised:
            client.compile_and_load(TANH.replace("tanh", "exponential"), isolate=True)
        waited = time.monotonic() - started
        assert raised.value.code == pjrt.ErrorCode.DEADLINE_EXCEEDED
        assert 1 <= waited < 30, waited
        assert gone(pid)
        monkeypatch.delenv(isolated_compile.TIMEOUT_ENV)
        # The next isolated compile starts a new worker and compiles.
        program = client.compile_and_load(TANH.replace("tanh", "exponential"), isolate=True)
        x = np.linspace(-1, 1, 4, dtype=np.float32)
        out = np.asarray(program(client.buffer_from_pyval(x))[0])
        np.testing.assert_allclose(out, np.exp(x), rtol=1e-6)
        assert worker_pids(os.getpid()) and pid not in worker_pids(os.getpid())
    finally:
        isolated_compile.shutdown_workers()


@pytest.mark.parametrize("value", ["0", "-3", "soon", "nan"])
def test_a_bad_time_limit_is_refused_by_name(client, monkeypatch, value):
    monkeypatch.setenv(isolated_compile.TIMEOUT_ENV, value)
    with pytest.raises(ValueError, match="PJRT_ISOLATED_COMPILE_TIMEOUT=.* is not a positive "
                                         "number of seconds"):
        client.compile_and_load(TANH, isolate=True)


def test_ctrl_c_while_waiting_for_the_worker_interrupts_and_replaces_it(cpu_plugin):
    """SIGINT to a process waiting on a stopped worker raises KeyboardInterrupt at once; the
    worker is killed, and the next isolated compile works with a new one."""
    source = textwrap.dedent(f"""
        import os, signal, sys, time
        import numpy as np
        import pjrt
        from conftest import cpu_plugin_path
        from test_isolated_compile import TANH, gone, worker_pids

        name = sys.argv[1]
        pjrt.load_pjrt_plugin_dynamically(name, cpu_plugin_path(name))
        client = pjrt.make_c_api_client(name, {{"cpu_device_count": 1}})
        client.compile_and_load(TANH, isolate=True)
        (pid,) = worker_pids(os.getpid())
        os.kill(pid, signal.SIGSTOP)
        print("WAITING", pid, flush=True)
        try:
            client.compile_and_load(TANH.replace("tanh", "exponential"), isolate=True)
            print("COMPILED?!", flush=True)
        except KeyboardInterrupt:
            print("INTERRUPTED", time.monotonic(), flush=True)
        print("WORKER GONE", gone(pid), flush=True)
        program = client.compile_and_load(TANH.replace("tanh", "exponential"), isolate=True)
        x = np.linspace(-1, 1, 4, dtype=np.float32)
        out = np.asarray(program(client.buffer_from_pyval(x))[0])
        print("RESULT", float(abs(out - np.exp(x)).max()), flush=True)
    """)
    errors = tempfile.TemporaryFile("w+")
    child = subprocess.Popen([sys.executable, "-c", source, cpu_plugin.name],
                             stdout=subprocess.PIPE, stderr=errors, text=True,
                             env=child_env(PJRT_ISOLATED_COMPILE_TIMEOUT="600"))
    watchdog = threading.Timer(120, child.kill)  # the reads below end when the child does
    watchdog.start()
    worker = None
    try:
        waiting = child.stdout.readline().split()
        assert waiting[:1] == ["WAITING"], waiting
        worker = int(waiting[1])
        # Signal once the child waits on the worker (its main thread sleeps in poll()), not
        # while it is still on its way there.
        deadline = time.monotonic() + 60
        while True:
            with open(f"/proc/{child.pid}/wchan") as wchan:
                if "poll" in wchan.read():
                    break
            assert time.monotonic() < deadline, "the child never waited in poll()"
            time.sleep(0.05)
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        line = child.stdout.readline().split()
        assert line[:1] == ["INTERRUPTED"], line
        assert float(line[1]) - sent < 5  # CLOCK_MONOTONIC is system-wide
        rest = child.stdout.read()
        child.wait()
    finally:
        watchdog.cancel()
        if child.poll() is None:
            child.kill()
            child.wait()
        # A stopped worker whose parent was killed would stay stopped for ever.
        if worker is not None and not gone(worker):
            os.kill(worker, signal.SIGKILL)
    errors.seek(0)
    assert child.returncode == 0, errors.read()[-3000:]
    assert "WORKER GONE True" in rest
    assert float(rest.split("RESULT")[1].split()[0]) < 1e-6


def ended(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie counts: an orphan's new parent may reap it late)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_a_killed_parent_leaves_no_worker_behind(built):
    """The parent is killed (SIGKILL: no clean-up runs) while its worker is busy in the
    plugin (here a client creation that sleeps for an hour): the worker ends too."""
    from conftest import cpu_plugin_path

    source = textwrap.dedent("""
        import os, sys
        import pjrt
        from test_isolated_compile import TANH

        fault, real = sys.argv[1:3]
        os.environ["PJRT_FAULT_DELEGATE"] = real  # this process: the fault plugin forwards
        pjrt.load_pjrt_plugin_dynamically("forwarding", fault)
        client = pjrt.make_c_api_client("forwarding", {"cpu_device_count": 1})
        # The worker loads the library afresh and reads these: its client never comes up.
        del os.environ["PJRT_FAULT_DELEGATE"]
        os.environ["PJRT_FAULT"] = "slow_client_create:3600"
        print("COMPILING", flush=True)
        client.compile_and_load(TANH, isolate=True)
        print("COMPILED?!", flush=True)
    """)
    child = subprocess.Popen([sys.executable, "-c", source, str(built.fault_plugin),
                              cpu_plugin_path("xla_cpu_0_106")],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             env=child_env(drop=("PJRT_FAULT",),
                                           PJRT_ISOLATED_COMPILE_TIMEOUT="600"))
    watchdog = threading.Timer(120, child.kill)  # the read below ends when the child does
    watchdog.start()
    workers: set[int] = set()
    try:
        assert child.stdout.readline().strip() == "COMPILING"
        deadline = time.monotonic() + 60
        while not workers:
            assert time.monotonic() < deadline, "no isolation worker started"
            time.sleep(0.1)
            workers = worker_pids(child.pid)
        time.sleep(1.0)  # let it reach the plugin (an earlier kill is caught too)
        child.kill()
        child.wait()
        deadline = time.monotonic() + 30  # generous: the worker looks twice a second
        while not all(ended(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(ended(pid) for pid in workers), "the worker outlived its killed parent"
    finally:
        watchdog.cancel()
        if child.poll() is None:
            child.kill()
            child.wait()
        for pid in workers:
            if not ended(pid):
                os.kill(pid, signal.SIGKILL)


CALLS: list = []


def add_delta(operands, results, attributes):
    """A custom call's handler (registered once, for every plugin of the session)."""
    CALLS.append(1)
    results[0][...] = operands[0] + attributes["delta"]


def test_a_program_calling_a_target_registered_here_compiles_in_isolation(client):
    """The worker knows the custom-call targets registered in this process (by name, with a
    handler it never runs): the program compiles there, then here, and runs this process's
    handler."""
    CALLS.clear()
    pjrt.register_custom_call_target("isolation_test_add_delta", add_delta, platform="cpu")
    text = """
    func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {
      %0 = stablehlo.custom_call @isolation_test_add_delta(%x) {api_version = 4 : i32,
          backend_config = {delta = 2.5 : f32}} : (tensor<4xf32>) -> tensor<4xf32>
      return %0 : tensor<4xf32>
    }"""
    isolated_compile.shutdown_workers()
    try:
        program = client.compile_and_load(text, isolate=True)
        x = np.arange(4, dtype=np.float32)
        out = np.asarray(program(client.buffer_from_pyval(x))[0])
        np.testing.assert_array_equal(out, x + np.float32(2.5))
        assert CALLS == [1]
        # A target registered nowhere compiles in the worker; the plugin refuses it here, as
        # it does without isolation.
        with pytest.raises(pjrt.XlaRuntimeError, match="isolation_test_unregistered") as raised:
            client.compile_and_load(text.replace("add_delta", "unregistered"), isolate=True)
        assert "isolation worker" not in str(raised.value)
    finally:
        isolated_compile.shutdown_workers()


def test_a_bytecode_program_calling_a_target_registered_here_compiles_in_isolation(
        client, jax_cpu):
    """The same through MLIR bytecode (a jax export), whose target names the worker finds
    among the bytecode's strings."""
    jnp = jax_cpu.numpy
    CALLS.clear()
    pjrt.register_custom_call_target("isolation_test_add_delta", add_delta, platform="cpu")

    def call(x):
        result = jax_cpu.ShapeDtypeStruct(x.shape, x.dtype)
        return jax_cpu.ffi.ffi_call("isolation_test_add_delta", result)(
            x, delta=np.float32(0.5)) * 2

    allow = jax_cpu.export.DisabledSafetyCheck.custom_call("isolation_test_add_delta")
    exported = jax_cpu.export.export(jax_cpu.jit(call), platforms=["cpu"],
                                     disabled_checks=[allow])(
        jnp.zeros(4, jnp.float32))
    isolated_compile.shutdown_workers()
    try:
        program = client.compile_and_load(exported.mlir_module_serialized, isolate=True)
        x = np.arange(4, dtype=np.float32)
        out = np.asarray(program(client.buffer_from_pyval(x))[0])
        np.testing.assert_array_equal(out, (x + np.float32(0.5)) * 2)
        assert CALLS == [1]
    finally:
        isolated_compile.shutdown_workers()


def test_an_executable_calling_a_target_registered_here_loads_in_isolation(client):
    """A serialized executable's targets cannot be read from its bytes: the worker registers
    each one the plugin reports missing, and loads it again."""
    CALLS.clear()
    pjrt.register_custom_call_target("isolation_test_add_delta", add_delta, platform="cpu")
    text = """
    func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {
      %0 = stablehlo.custom_call @isolation_test_add_delta(%x) {api_version = 4 : i32,
          backend_config = {delta = -1.5 : f32}} : (tensor<4xf32>) -> tensor<4xf32>
      return %0 : tensor<4xf32>
    }"""
    serialized = client.compile_and_load(text).serialize()
    isolated_compile.shutdown_workers()
    try:
        program = client.deserialize_executable(serialized, isolate=True)
        x = np.arange(4, dtype=np.float32)
        out = np.asarray(program(client.buffer_from_pyval(x))[0])
        np.testing.assert_array_equal(out, x - np.float32(1.5))
        assert CALLS == [1]
    finally:
        isolated_compile.shutdown_workers()

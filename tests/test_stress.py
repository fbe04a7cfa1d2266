"""Stress: threads, delete, close, exit, fork and Ctrl-C never crash, hang or give wrong results.

Every scenario that could take the process down runs in a child interpreter (a script written to
``tmp_path``), so a crash shows as a failed test with the child's stderr instead of killing the
run; a hang shows as a timeout. The children repeat their race many times inside, so that one
run of this file is likely to hit the interleavings that used to crash. The programs come from
``tests/stress/programs.py``.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import pjrt
from conftest import CPU_PLUGINS, cpu_plugin_path

STRESS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stress")
sys.path.insert(0, STRESS_DIR)
import programs  # noqa: E402  (tests/stress/programs.py)

BOTH_PLUGINS = sorted(CPU_PLUGINS)
#: The build used where one is enough (a scenario whose cost is mostly compile time).
ONE_PLUGIN = "xla_cpu_0_106"

#: Put at the top of every child script: argv[1] is the plugin library, argv[2] the directory
#: of the stress programs.
PRELUDE = textwrap.dedent("""\
    import json, os, random, signal, sys, threading, time
    import numpy as np
    import pjrt
    from pjrt import ClosedClientError, DeletedArrayError
    sys.path.insert(0, sys.argv[2])
    import programs
    # Not named "cpu": the plugin discovery would register for the default backend.
    pjrt.load_pjrt_plugin_dynamically("stress_cpu", sys.argv[1])
    X = np.linspace(-1, 1, 8, dtype=np.float32)
    WANT = programs.tiny_reference(X, X)

    def new_client(devices=2):
        return pjrt.make_c_api_client("stress_cpu", {"cpu_device_count": devices})

    def join_or_die(threads, seconds=30):
        # A thread that does not finish is a hang: say so and leave with a distinct code.
        deadline = time.monotonic() + seconds
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                print("HANG in", thread.name, flush=True)
                os._exit(3)
""")


def run_child(tmp_path, plugin: str, body: str, *, timeout: float = 60,
              expect_code: int = 0) -> subprocess.CompletedProcess:
    """Run ``PRELUDE + body`` in a fresh interpreter against ``plugin``; fail with its output
    unless it exits with ``expect_code`` (a crash is a negative code: the signal)."""
    script = tmp_path / f"child_{len(list(tmp_path.iterdir()))}.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    command = [sys.executable, str(script), cpu_plugin_path(plugin), STRESS_DIR]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"child hung for {timeout} s\nstdout:\n{_text(expired.stdout)[-3000:]}\n"
                    f"stderr:\n{_text(expired.stderr)[-6000:]}")
    report = (f"child exit code {result.returncode}\nstdout:\n{result.stdout[-3000:]}\n"
              f"stderr:\n{result.stderr[-6000:]}")
    assert result.returncode == expect_code, report
    for sign in ("Check failed", "Fatal Python error", "terminate called", "Segmentation fault",
                 "Traceback", "Exception ignored"):
        assert sign not in result.stderr, report
    return result


def _text(output) -> str:
    if output is None:
        return ""
    return output.decode(errors="replace") if isinstance(output, bytes) else output


def last_json(result: subprocess.CompletedProcess):
    """The child's report: the JSON on the last line of its stdout."""
    return json.loads(result.stdout.strip().splitlines()[-1])


# -- 1. delete an array while other threads execute with it -------------------------------

@pytest.mark.parametrize("plugin", BOTH_PLUGINS)
def test_delete_an_array_while_threads_execute_with_it(tmp_path, plugin):
    result = run_child(tmp_path, plugin, """
        client = new_client()
        executable = client.compile_and_load(programs.TINY)
        bad, counts = [], {"ok": 0, "deleted": 0}

        def execute_until_deleted(a):
            while True:
                try:
                    (out,) = executable.execute([a, a])
                except DeletedArrayError:
                    counts["deleted"] += 1
                    return
                except BaseException as error:
                    bad.append(repr(error))
                    return
                if not np.allclose(np.asarray(out), WANT, rtol=1e-6):
                    bad.append("wrong value")
                counts["ok"] += 1

        rounds, deadline = 0, time.monotonic() + 2.0
        while rounds < 150 and (rounds < 30 or time.monotonic() < deadline):
            rounds += 1
            a = client.buffer_from_pyval(X)
            threads = [threading.Thread(target=execute_until_deleted, args=(a,))
                       for _ in range(3)]
            for thread in threads:
                thread.start()
            time.sleep(random.uniform(0, 0.002))
            a.delete()
            join_or_die(threads)
        print(json.dumps({"bad": bad, "rounds": rounds, **counts}))
    """)
    report = last_json(result)
    assert report["bad"] == []
    assert report["deleted"] == 3 * report["rounds"] and report["ok"] > 0


# -- 2. delete an executable while two threads execute it ---------------------------------

@pytest.mark.parametrize("plugin", BOTH_PLUGINS)
def test_delete_an_executable_while_threads_execute_it(tmp_path, plugin):
    result = run_child(tmp_path, plugin, """
        client = new_client()
        a = client.buffer_from_pyval(X)
        serialized = client.compile_and_load(programs.TINY).serialize()
        bad, counts = [], {"ok": 0, "deleted": 0}

        def execute_until_deleted(executable):
            while True:
                try:
                    (out,) = executable.execute([a, a])
                except RuntimeError as error:
                    if "deleted" not in str(error) or isinstance(error, ClosedClientError):
                        bad.append(repr(error))
                    counts["deleted"] += 1
                    return
                except BaseException as error:
                    bad.append(repr(error))
                    return
                if not np.allclose(np.asarray(out), WANT, rtol=1e-6):
                    bad.append("wrong value")
                counts["ok"] += 1

        for _ in range(25):
            executable = client.deserialize_executable(serialized)
            threads = [threading.Thread(target=execute_until_deleted, args=(executable,))
                       for _ in range(2)]
            for thread in threads:
                thread.start()
            time.sleep(random.uniform(0, 0.003))
            executable.delete()
            join_or_die(threads)
        print(json.dumps({"bad": bad, **counts}))
    """)
    report = last_json(result)
    assert report["bad"] == []
    assert report["deleted"] == 50 and report["ok"] > 0


# -- 3. close a client while threads execute, transfer and read ---------------------------

@pytest.mark.parametrize("plugin", BOTH_PLUGINS)
def test_close_a_client_while_threads_execute_transfer_and_read(tmp_path, plugin):
    result = run_child(tmp_path, plugin, """
        BIG = np.arange(1 << 15, dtype=np.float32)  # 128 KiB: read as a view of the buffer
        first = new_client()
        serialized = first.compile_and_load(programs.TINY).serialize()
        first.close()
        bad, counts, views = [], {"ok": 0, "closed": 0}, []

        def until_closed(step):
            def run():
                while True:
                    try:
                        step()
                    except (ClosedClientError, DeletedArrayError):
                        counts["closed"] += 1
                        return
                    except BaseException as error:
                        bad.append(f"{step.__name__}: {error!r}")
                        return
                    counts["ok"] += 1
            return threading.Thread(target=run, name=step.__name__)

        for _ in range(12):
            client = new_client()
            executable = client.deserialize_executable(serialized)
            a = client.buffer_from_pyval(X)

            def execute():
                (out,) = executable.execute([a, a])
                if not np.allclose(np.asarray(out), WANT, rtol=1e-6):
                    bad.append("execute: wrong value")

            def transfer():
                client.buffer_from_pyval(X).block_until_ready()

            def read():
                view = np.asarray(client.buffer_from_pyval(BIG))
                if view[1] != 1 or view[-1] != BIG[-1]:
                    bad.append("read: wrong value")
                views[:] = [view]

            threads = [until_closed(step) for step in (execute, transfer, read)]
            for thread in threads:
                thread.start()
            time.sleep(random.uniform(0.002, 0.02))
            client.close()
            join_or_die(threads)
            # A view read before the close stays valid after it.
            if views and not np.array_equal(views[0], BIG):
                bad.append("a view changed after close")
            views.clear()
        print(json.dumps({"bad": bad, **counts}))
    """)
    report = last_json(result)
    assert report["bad"] == []
    assert report["closed"] == 36 and report["ok"] > 0


# -- 4. clear the backends while threads compile and run through pjrt.compile -------------

def test_clear_backends_while_threads_compile_and_run(tmp_path):
    # The default backend is the CPU plugin pjrt_cpu discovers, whichever build that is.
    result = run_child(tmp_path, ONE_PLUGIN, """
        bad, counts = [], {"ok": 0, "closed": 0}
        stop = threading.Event()

        def compile_and_run():
            while not stop.is_set():
                try:
                    y = pjrt.compile(programs.TINY)(X, X)
                    value = np.asarray(y)
                except ClosedClientError:
                    counts["closed"] += 1
                    continue
                except BaseException as error:
                    bad.append(repr(error))
                    return
                if not np.allclose(value, WANT, rtol=1e-6):
                    bad.append(f"wrong value {value}")
                counts["ok"] += 1

        threads = [threading.Thread(target=compile_and_run) for _ in range(2)]
        for thread in threads:
            thread.start()
        for _ in range(8):
            time.sleep(random.uniform(0.05, 0.25))
            pjrt.clear_backends()
        stop.set()
        join_or_die(threads)
        print(json.dumps({"bad": bad, **counts}))
    """)
    report = last_json(result)
    assert report["bad"] == []
    assert report["ok"] > 0


# -- 5. interpreter exit with daemon threads still working ---------------------------------

@pytest.mark.parametrize("plugin", BOTH_PLUGINS)
def test_exit_while_daemon_threads_execute_read_and_wait(tmp_path, plugin):
    result = run_child(tmp_path, plugin, """
        client = new_client()
        executable = client.compile_and_load(programs.TINY)
        # Runs for about a second, asynchronously (on 1024 elements the plugin does not run
        # it inline in execute()).
        slow = client.compile_and_load(programs.while_program(200_000, 1024))
        BIG = np.arange(1 << 15, dtype=np.float32)
        a = client.buffer_from_pyval(X)
        started = threading.Barrier(4)
        bad = []

        def until_closed(step):
            def run():
                started.wait()
                try:
                    while True:
                        step()
                except (ClosedClientError, DeletedArrayError):
                    pass  # the interpreter is exiting
                except BaseException as error:
                    bad.append(repr(error))
                    print("BAD", repr(error), flush=True)
            threading.Thread(target=run, daemon=True).start()

        def execute():
            if not np.allclose(np.asarray(executable.execute([a, a])[0]), WANT, rtol=1e-6):
                print("BAD wrong value", flush=True)

        def read():
            if np.asarray(client.buffer_from_pyval(BIG))[-1] != BIG[-1]:
                print("BAD wrong value", flush=True)

        def wait_on_slow():
            slow.execute([client.buffer_from_pyval(np.zeros(1024, np.float32))])[0].block_until_ready()

        for step in (execute, read, wait_on_slow):
            until_closed(step)
        started.wait()
        # A program still running with nobody waiting for it, too.
        slow.execute([client.buffer_from_pyval(np.ones(1024, np.float32))])
        time.sleep(0.2)
        print("exiting", bad, flush=True)
    """)
    assert "BAD" not in result.stdout
    assert "exiting []" in result.stdout


@pytest.mark.parametrize("plugin", BOTH_PLUGINS)
def test_exit_while_a_daemon_thread_compiles(tmp_path, plugin):
    result = run_child(tmp_path, plugin, """
        client = new_client()
        program = programs.unrolled_program(3000)  # compiles for several seconds
        compiling = threading.Event()

        def compile_slowly():
            compiling.set()
            client.compile_and_load(program)
            print("compile finished before exit", flush=True)

        threading.Thread(target=compile_slowly, daemon=True).start()
        compiling.wait()
        time.sleep(0.3)
        print("exiting", flush=True)
    """)
    # Exit waits a second for running calls, then leaves the compiling client alone.
    assert "compile finished" not in result.stdout

"""Stress: threads, delete, close, exit, fork and Ctrl-C never crash, hang or give wrong results.

Every scenario that could take the process down runs in a child interpreter (a script written to
``tmp_path``), so a crash shows as a failed test with the child's stderr instead of killing the
run; a hang shows as a timeout. The children repeat their race many times inside, so that one
run of this file is likely to hit the interleavings that used to crash. The programs come from
``tests/stress/stress_programs.py``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import pjrt
from conftest import CPU_PLUGINS, child_env, cpu_plugin_path
from interrupt_helpers import CHILD_SOURCE, assert_interrupted, child_reports, run_child_process

#: Left out of the quick run: child processes racing threads, forks and signals.
pytestmark = pytest.mark.slow

STRESS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stress")
sys.path.insert(0, STRESS_DIR)
import stress_programs as programs  # noqa: E402

BOTH_PLUGINS = sorted(CPU_PLUGINS)
#: Lengths of ``programs.unrolled_program`` that take each build several seconds to compile
#: (measured on a loaded 2-core machine: the 0.106 build's compiler is much slower on it).
SLOW_COMPILE_LENGTH = {"xla_cpu_0_81": 24000, "xla_cpu_0_106": 5000}
#: The build used where one is enough (a scenario whose cost is mostly compile time).
ONE_PLUGIN = "xla_cpu_0_106"

#: Put at the top of every child script: argv[1] is the plugin library, argv[2] the directory
#: of the stress programs, argv[3:] the test's own arguments.
PRELUDE = textwrap.dedent("""\
    import json, os, random, signal, sys, threading, time
    import numpy as np
    import pjrt
    from pjrt import ClosedClientError, DeletedArrayError
    sys.path.insert(0, sys.argv[2])
    import stress_programs as programs
    # Not named "cpu": discovery (pjrt.compile's default backend) loads pjrt_cpu's library
    # under that name, and a name can stand for one library only.
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


def run_child(tmp_path, plugin: str, body: str, *, timeout: float = 60, args=(),
              expect_code: int = 0, allow_traceback: bool = False,
              helpers: str = "", accept_codes=()) -> subprocess.CompletedProcess:
    """Run ``PRELUDE + helpers + body`` in a fresh interpreter against ``plugin``; fail with
    its output unless it exits with ``expect_code`` (a crash is a negative code: the signal)
    or one of ``accept_codes`` (which the test then tells apart by the output)."""
    script = tmp_path / f"child_{len(list(tmp_path.iterdir()))}.py"
    script.write_text(PRELUDE + textwrap.dedent(helpers) + textwrap.dedent(body))
    command = [sys.executable, str(script), cpu_plugin_path(plugin), STRESS_DIR, *args]
    result, _ = run_child_process(command, env=child_env(), timeout=timeout)
    report = (f"child exit code {result.returncode}\nstdout:\n{result.stdout[-3000:]}\n"
              f"stderr:\n{result.stderr[-6000:]}")
    assert result.returncode in (expect_code, *accept_codes), report
    signs = ["Check failed", "Fatal Python error", "terminate called", "Segmentation fault",
             "Exception ignored"] + ([] if allow_traceback else ["Traceback"])
    for sign in signs:
        assert sign not in result.stderr, report
    return result


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

        rounds, deadline = 0, time.monotonic() + 1.5
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


# -- 2b. calls begin and end in some threads while others free arrays ----------------------

@pytest.mark.parametrize("plugin", BOTH_PLUGINS)
def test_calls_and_releases_interleave_in_threads(tmp_path, plugin):
    # The ticket bookkeeping is lock-free on the hot path: switching threads every few
    # bytecodes makes each step of it meet every other. Nothing may raise, and afterwards
    # nothing may be left parked or owned that no array holds.
    result = run_child(tmp_path, plugin, """
        client = new_client()
        handle = client._handle
        executable = client.compile_and_load(programs.TINY)
        a = client.buffer_from_pyval(X)
        stop = threading.Event()
        bad, counts = [], {"executed": 0, "released": 0}

        def execute():
            try:
                while not stop.is_set():
                    (out,) = executable.execute([a, a])
                    counts["executed"] += 1
            except BaseException as error:
                bad.append(f"execute: {error!r}")

        def churn():
            try:
                while not stop.is_set():
                    b = client.buffer_from_pyval(X)
                    c = client.buffer_from_pyval(X)
                    b.delete()
                    del c  # freed by the finaliser
                    counts["released"] += 2
            except BaseException as error:
                bad.append(f"churn: {error!r}")

        sys.setswitchinterval(1e-6)
        threads = [threading.Thread(target=target) for target in (execute, execute, churn, churn)]
        for thread in threads:
            thread.start()
        time.sleep(2.5)  # long enough to catch the races it was written for, most runs
        stop.set()
        join_or_die(threads)
        sys.setswitchinterval(0.005)
        handle.settle()
        owned = sorted(handle.buffers) == sorted([id(a)])
        print(json.dumps({"bad": bad, "parked": len(handle.parked), "only a owned": owned,
                          "active": len(handle.active), **counts}))
    """)
    report = last_json(result)
    assert report["bad"] == []
    assert report["parked"] == 0 and report["active"] == 0 and report["only a owned"]
    assert report["executed"] > 0 and report["released"] > 0


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

            def execute_host_values():  # the copies are the call's own, made and freed in it
                (out,) = executable.execute([X, X], copy_host_values=True)
                if not np.allclose(np.asarray(out), WANT, rtol=1e-6):
                    bad.append("execute_host_values: wrong value")

            def transfer():
                client.buffer_from_pyval(X).block_until_ready()

            def read():
                view = np.asarray(client.buffer_from_pyval(BIG))
                if view[1] != 1 or view[-1] != BIG[-1]:
                    bad.append("read: wrong value")
                views[:] = [view]

            threads = [until_closed(step)
                       for step in (execute, execute_host_values, transfer, read)]
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
    assert report["closed"] == 48 and report["ok"] > 0


# -- 4. clear the backends while threads compile and run through pjrt.compile -------------

def test_clear_backends_while_threads_compile_and_run(tmp_path):
    # The default backend is the CPU plugin pjrt_cpu discovers, whichever build that is.
    result = run_child(tmp_path, ONE_PLUGIN, """
        bad, counts = [], {"ok": 0, "closed": 0, "ok after": 0}
        cleared = threading.Event()

        def compile_and_run():
            while counts["ok after"] < 2:
                after = cleared.is_set()
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
                counts["ok after" if after else "ok"] += 1

        threads = [threading.Thread(target=compile_and_run) for _ in range(2)]
        for thread in threads:
            thread.start()
        for _ in range(8):
            time.sleep(random.uniform(0.05, 0.3))
            pjrt.clear_backends()
        cleared.set()  # the threads go on until they have run on the backend made last
        join_or_die(threads)
        print(json.dumps({"bad": bad, **counts}))
    """)
    report = last_json(result)
    assert report["bad"] == []
    assert report["ok after"] >= 2


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
            zeros = client.buffer_from_pyval(np.zeros(1024, np.float32))
            slow.execute([zeros])[0].block_until_ready()

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
    result = run_child(tmp_path, plugin, args=[str(SLOW_COMPILE_LENGTH[plugin])], body="""
        client = new_client()
        program = programs.unrolled_program(int(sys.argv[3]))  # compiles for seconds
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
    if "compile finished" in result.stdout:
        pytest.skip("the program compiled before the exit on this machine")


# -- 6. fork ------------------------------------------------------------------------------

@pytest.mark.parametrize("plugin", BOTH_PLUGINS)
@pytest.mark.parametrize("child_exit", ["os._exit", "sys.exit"])
def test_fork_after_a_client_exists(tmp_path, plugin, child_exit):
    result = run_child(tmp_path, plugin, """
        import warnings
        EXIT = sys.argv[3]
        client = new_client()
        executable = client.compile_and_load(programs.TINY)
        a = client.buffer_from_pyval(X)
        (out,) = executable.execute([a, a])   # not read before the fork: no cached value
        read_fd, write_fd = os.pipe()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            report = {"warned": False}
            attempts = {
                "execute": lambda: executable.execute([a, a]),
                "read": lambda: np.asarray(out),
                "block": lambda: out.block_until_ready(),
                "transfer": lambda: client.buffer_from_pyval(X),
                "compile": lambda: client.compile_and_load(programs.TINY),
                "delete": lambda: (a.delete(), a.block_until_ready()),
            }
            for name, attempt in attempts.items():
                try:
                    attempt()
                    report[name] = "no error"
                except ClosedClientError as error:
                    report[name] = "ClosedClientError" + (" (fork)" if "fork" in str(error) else "")
                except BaseException as error:
                    report[name] = f"{type(error).__name__}: {error}"
            try:
                new_client()
                report["new client"] = "no error"
            except RuntimeError as error:
                says_fork = " (fork)" if "fork" in str(error) else ""
                report["new client"] = type(error).__name__ + says_fork
            os.write(write_fd, json.dumps(report).encode())
            os.close(write_fd)
            if EXIT == "os._exit":
                os._exit(7)
            sys.exit(7)
        os.close(write_fd)
        with os.fdopen(read_fd) as pipe:
            report = json.loads(pipe.read())
        _, status = os.waitpid(pid, 0)
        report["child status"] = os.waitstatus_to_exitcode(status)
        report["warned"] = [str(w.message) for w in caught if w.category is RuntimeWarning]
        # The parent goes on: its client, arrays and executables work.
        (again,) = executable.execute([a, a])
        report["parent ok"] = bool(np.allclose(np.asarray(again), WANT, rtol=1e-6)
                                   and np.allclose(np.asarray(out), WANT, rtol=1e-6)
                                   and np.allclose(np.asarray(client.compile_and_load(
                                       programs.TINY).execute([a, a])[0]), WANT, rtol=1e-6))
        print(json.dumps(report))
    """, args=[child_exit])
    report = last_json(result)
    for name in ("execute", "read", "block", "transfer", "compile", "delete"):
        assert report[name] in ("ClosedClientError (fork)", "DeletedArrayError"), (name, report)
    assert report["execute"] == "ClosedClientError (fork)"
    assert report["read"] == "ClosedClientError (fork)"
    assert report["new client"] == "RuntimeError (fork)"
    assert report["child status"] == 7
    assert len(report["warned"]) == 1 and "fork" in report["warned"][0]
    assert report["parent ok"] is True


@pytest.mark.parametrize("plugin", BOTH_PLUGINS)
def test_fork_before_any_client_then_a_client_in_the_child(tmp_path, plugin):
    result = run_child(tmp_path, plugin, """
        import warnings
        warnings.simplefilter("error")  # no warning: no client was open at the fork
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            client = new_client()
            (y,) = client.compile_and_load(programs.TINY).execute([client.buffer_from_pyval(X)] * 2)
            ok = bool(np.allclose(np.asarray(y), WANT, rtol=1e-6))
            os.write(write_fd, json.dumps({"child ok": ok}).encode())
            sys.exit(0)   # the child's client is freed at its exit, as in any process
        os.close(write_fd)
        with os.fdopen(read_fd) as pipe:
            report = json.loads(pipe.read())
        _, status = os.waitpid(pid, 0)
        report["child status"] = os.waitstatus_to_exitcode(status)
        # And the parent can still make its own client afterwards.
        client = new_client()
        (y,) = client.compile_and_load(programs.TINY).execute([client.buffer_from_pyval(X)] * 2)
        report["parent ok"] = bool(np.allclose(np.asarray(y), WANT, rtol=1e-6))
        print(json.dumps(report))
    """)
    assert last_json(result) == {"child ok": True, "child status": 0, "parent ok": True}


# -- 7. Ctrl-C ----------------------------------------------------------------------------

@pytest.mark.parametrize("plugin", BOTH_PLUGINS)
def test_ctrl_c_interrupts_block_until_ready_and_reads(tmp_path, plugin):
    result = run_child(tmp_path, plugin, helpers=CHILD_SOURCE, body="""
        client = new_client()
        d0, d1 = client.local_devices()[:2]
        # Calibrate a loop to run about 2 s here. On 1024 elements the plugin runs it
        # asynchronously: execute() returns at once and the wait is in pjrt.
        probe = client.compile_and_load(programs.while_program(50_000, 1024))
        x = client.buffer_from_pyval(np.zeros(1024, np.float32))
        start = time.monotonic()
        probe.execute([x])[0].block_until_ready()
        iterations = int(2.0 * 50_000 / (time.monotonic() - start))
        program = programs.while_program(min(iterations, 2**31 - 1), 1024)
        on_d0 = client.compile_and_load(program, [d0])
        on_d1 = client.compile_and_load(program, [d1])

        (y,) = on_d0.execute([x])
        interrupt("block_until_ready", y.block_until_ready, inside="event")
        (z,) = on_d1.execute([client.buffer_from_pyval(np.zeros(1024, np.float32), d1)])
        interrupt("asarray", lambda: np.asarray(z), inside="event")
        # The programs go on running; the client works meanwhile, and exit waits for them.
        (w,) = client.compile_and_load(programs.TINY).execute([client.buffer_from_pyval(X)] * 2)
        ok = bool(np.allclose(np.asarray(w), WANT, rtol=1e-6))
        print(json.dumps({"case": "after", "ok": ok}))
    """)
    reports = child_reports(result.stdout)
    for case in ("block_until_ready", "asarray"):
        assert_interrupted(reports[case])
    assert reports["after"]["ok"]


@pytest.mark.parametrize("plugin", BOTH_PLUGINS)
def test_ctrl_c_interrupts_a_slow_compile(tmp_path, plugin):
    # The KeyboardInterrupt is left uncaught here: Python then ends by SIGINT (-2).
    result = run_child(tmp_path, plugin, helpers=CHILD_SOURCE, args=[str(SLOW_COMPILE_LENGTH[plugin])],
                       body="""
        client = new_client()
        program = programs.unrolled_program(int(sys.argv[3]))  # compiles for seconds
        done = interrupt("compile", lambda: client.compile_and_load(program), inside="worker")
        (w,) = client.compile_and_load(programs.TINY).execute([client.buffer_from_pyval(X)] * 2)
        ok = bool(np.allclose(np.asarray(w), WANT, rtol=1e-6))
        print(json.dumps({"case": "after", "ok": ok}), flush=True)
        if done:
            raise KeyboardInterrupt
    """, expect_code=-2, allow_traceback=True, accept_codes=(0,))
    reports = child_reports(result.stdout)
    if not reports["compile"]["interrupted"]:
        pytest.skip(f"the program compiled in {reports['compile']['elapsed']:.1f} s on this "
                    f"machine, before the signal")
    assert result.returncode == -2  # exactly the code of an uncaught KeyboardInterrupt
    assert_interrupted(reports["compile"])
    assert reports["after"]["ok"]
    assert result.stderr.rstrip().endswith("KeyboardInterrupt")


# -- 8. deeply nested programs -------------------------------------------------------------

def test_deeply_nested_program_compiles_from_a_small_stack_thread(tmp_path):
    # Each nesting level takes a few KiB of the compiler's stack: 800 need more than 2 MiB.
    # Compiling from a thread with a 512 KiB stack (a common default outside glibc) works
    # because the compiler runs on pjrt's own large-stack thread.
    result = run_child(tmp_path, ONE_PLUGIN, """
        client = new_client()
        depth = 800
        program = programs.nested_case_program(depth)
        answer = {}

        def compile_and_run():
            executable = client.compile_and_load(program)
            (y,) = executable.execute([client.buffer_from_pyval(np.float32(0.5))])
            answer["value"] = float(np.asarray(y))

        threading.stack_size(512 << 10)
        thread = threading.Thread(target=compile_and_run)
        thread.start()
        join_or_die([thread], 120)
        print(json.dumps(answer))
    """, timeout=150)
    assert last_json(result) == {"value": 800.5}


# -- 9. memories of another client --------------------------------------------------------

def test_memories_of_another_client(cpu_plugin, client):
    other = pjrt.make_c_api_client(cpu_plugin.name, {"cpu_device_count": 2})
    x = np.arange(6, dtype=np.float32)
    big = np.arange(1 << 15, dtype=np.float32)  # read as a view of the buffer
    foreign = other.local_devices()[1].default_memory()
    with pytest.raises(ValueError, match="another client"):
        client.buffer_from_pyval(x, memory=foreign)
    a = client.buffer_from_pyval(x)
    copy = a.copy_to_memory(foreign)
    assert copy.client is other and copy.device == other.local_devices()[1]
    np.testing.assert_array_equal(np.asarray(copy), x)
    unread = client.buffer_from_pyval(big).copy_to_memory(foreign)
    mine = client.buffer_from_pyval(big)
    other.close()
    for gone in (copy, unread):
        with pytest.raises(pjrt.ClosedClientError):
            np.asarray(gone)
    # This client is untouched: its arrays read, its programs run.
    np.testing.assert_array_equal(np.asarray(mine), big)
    np.testing.assert_array_equal(np.asarray(a), x)
    ones = np.ones(8, np.float32)
    (y,) = client.compile_and_load(programs.TINY).execute([client.buffer_from_pyval(ones)] * 2)
    np.testing.assert_allclose(np.asarray(y), programs.tiny_reference(ones, ones), rtol=1e-6)
    d0, d1 = client.local_devices()[:2]
    with pytest.raises(ValueError, match="not a memory of"):
        client.buffer_from_pyval(x, d0, memory=d1.default_memory())


# -- 10. host values are read-only, all the way down -------------------------------------

def _assert_never_writeable(value: np.ndarray) -> None:
    assert value.size, "an empty array has no memory to protect"
    array = value
    while isinstance(array, np.ndarray):
        assert not array.flags.writeable
        with pytest.raises(ValueError):
            array.flags.writeable = True
        array = array.base


def test_read_values_cannot_be_made_writeable(client):
    small = client.buffer_from_pyval(np.arange(8, dtype=np.int32))
    large = client.buffer_from_pyval(np.arange(1 << 15, dtype=np.float32))
    (result,) = client.compile_and_load(programs.TINY).execute([client.buffer_from_pyval(
        np.ones(8, np.float32))] * 2)
    mesh = pjrt.Mesh(np.array(client.devices()).reshape(2, 4), ("x", "y"))
    host = np.arange(8 * 12, dtype=np.float32).reshape(8, 12)
    sharded = pjrt.device_put(host, pjrt.NamedSharding(mesh, pjrt.P("x", "y")))
    for array in (small, large, result, sharded):
        for value in (np.asarray(array), array.to_py(), np.asarray(array)):  # cached too
            _assert_never_writeable(value)
    np.testing.assert_array_equal(np.asarray(sharded), host)
    for shard in sharded.addressable_shards:
        _assert_never_writeable(np.asarray(shard.data))


# -- 11. memory stays flat over many rounds in threads -------------------------------------

def test_threads_looping_do_not_grow_memory(tmp_path):
    # In a child of its own: the test process's memory moves with whatever ran before.
    result = run_child(tmp_path, ONE_PLUGIN, """
        import gc

        def resident_bytes():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

        client = new_client()
        executable = client.compile_and_load(programs.TINY)
        errors = []

        def rounds(count):
            try:
                for _ in range(count):
                    a = client.buffer_from_pyval(X)
                    (out,) = executable.execute([a, a])
                    if not np.allclose(np.asarray(out), WANT, rtol=1e-6):
                        errors.append("wrong value")
                    a.delete()
                    del out  # freed by the finaliser
            except BaseException as error:
                errors.append(repr(error))

        def in_two_threads(total):
            threads = [threading.Thread(target=rounds, args=(total // 2,)) for _ in range(2)]
            for thread in threads:
                thread.start()
            join_or_die(threads, 120)

        in_two_threads(4000)  # warm up: allocator arenas and the plugin's pools settle
        gc.collect()
        before, blocks = resident_bytes(), sys.getallocatedblocks()
        in_two_threads(20000)
        gc.collect()
        handle = client._handle
        print(json.dumps({"errors": errors, "grown": resident_bytes() - before,
                          "blocks": sys.getallocatedblocks() - blocks,
                          "owned": len(handle.buffers), "parked": len(handle.parked),
                          "held": len(handle.holds) + len(handle.pending_holds)}))
    """, timeout=150)
    report = last_json(result)
    assert report["errors"] == []
    # Nothing is left owned, parked or held, and no Python object per round stays behind.
    assert report["owned"] == 0 and report["parked"] == 0 and report["held"] == 0, report
    assert report["blocks"] < 2000, report
    # The native side: with two threads the resident size wanders by up to ~12 MiB over
    # 20000 rounds (allocator arenas; it comes back down over longer runs), so the bound is
    # looser than test_handles' single-thread 4 MiB: a native leak has to exceed about 1 KiB
    # per round to fail here (Python-side leaks are caught by the block count above).
    assert report["grown"] < 24 << 20, f"resident memory grew by {report['grown'] / 2**20:.1f} MiB"

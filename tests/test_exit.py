"""A process that ends with work still in flight ends cleanly, with the status it asked for.

Programs, transfers and compiles may still be running on the plugin's threads when a program
ends. pjrt's exit waits for them within one budget (`pjrt._capi.exit_guard.EXIT_WAIT_SECONDS`), then
frees the clients; work that outlasts the budget is left running and the process ends without
the plugins' teardown (docs/threads-and-processes.md, "Interpreter exit"). Each case runs many
fresh interpreters, two at a time as a user's shell or a batch system would, and every one must
exit with its own status: a crash shows as a negative code (the signal).
"""
from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import CPU_PLUGINS, child_env, cpu_plugin_path
from long_programs import matmul_loop
from test_docs_snippets import ROOT, script_of

BOTH_PLUGINS = sorted(CPU_PLUGINS)

#: argv[1] is the plugin library; the program's body follows. ``outs`` keeps what it made.
PRELUDE = """\
import sys
import numpy as np
import pjrt
from pjrt._capi import exit_guard
plugin = pjrt.load_pjrt_plugin_dynamically("cpu", sys.argv[1])
client = pjrt.make_c_api_client("cpu", {"cpu_device_count": 2})
device = client.devices()[0]
"""

#: Four 1024 x 1024 products launched and never read: XLA's CPU plugin runs them on its own
#: threads after execute() returns, and the first one builds oneDNN's JIT kernels there,
#: registering their destructors with the C library while the exit is under way.
FOUR_PRODUCTS = """
PRODUCT = '''
func.func public @main(%a: tensor<1024x1024xf32>, %b: tensor<1024x1024xf32>) -> tensor<1024x1024xf32> {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<1024x1024xf32>, tensor<1024x1024xf32>) -> tensor<1024x1024xf32>
  return %0 : tensor<1024x1024xf32>
}'''
product = client.compile_and_load(PRODUCT, [device])
x = client.buffer_from_pyval(np.ones((1024, 1024), np.float32), device)
"""

CASES = {
    # the outputs kept in a global, unread
    "held": FOUR_PRODUCTS + "outs = [product.execute([x, x]) for _ in range(4)]\n",
    # the outputs dropped at once: the plugin still computes them
    "dropped": FOUR_PRODUCTS + "for _ in range(4): product.execute([x, x])\n",
    # an exit status of the program's own, through sys.exit
    "status": FOUR_PRODUCTS + "outs = [product.execute([x, x]) for _ in range(4)]\n"
                              "sys.exit(7)\n",
    # a program reading a transfer still in flight, whose host array goes first
    "transfer": FOUR_PRODUCTS + "big = np.ones((1024, 1024), np.float32)\n"
                                "y = client.buffer_from_pyval(big, device)\n"
                                "del big\n"
                                "outs = [product.execute([y, x]) for _ in range(4)]\n",
    # a compile still running in a daemon thread, and products on the main thread
    "compile": FOUR_PRODUCTS + "import threading\n"
                               "threading.Thread(target=lambda: client.compile_and_load("
                               "PRODUCT.replace('1024', '512')), daemon=True).start()\n"
                               "outs = [product.execute([x, x]) for _ in range(4)]\n",
}
EXPECTED_STATUS = {"status": 7}

#: A program that compiles in an instant.
TINY_PROGRAM = """
func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.tanh %x : tensor<4xf32>
  return %0 : tensor<4xf32>
}"""

#: Iterations of `matmul_loop` that take a second or so on one core.
LONG_ITERATIONS = 8_000


def _run_many(sources: list[tuple], parallel: int = 2) -> list[str]:
    """Run each ``(source, argv, expected status[, environment])`` in a fresh interpreter,
    ``parallel`` at a time; a line for each run that did not exit with its status (or printed
    a fatal sign)."""
    def one(item):
        source, argv, expected, *environment = item
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-c", source, *argv], capture_output=True,
                                text=True, timeout=120, cwd=ROOT,
                                env=environment[0] if environment else child_env())
        elapsed = time.monotonic() - started
        signs = [s for s in ("Fatal Python error", "Segmentation fault", "terminate called",
                             "Check failed", "Traceback") if s in result.stderr]
        if result.returncode != expected or signs:
            return (f"exit {result.returncode} (expected {expected}) after {elapsed:.1f} s "
                    f"{signs}:\n{result.stderr[-1500:]}")
        return None

    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
        return [line for line in pool.map(one, sources) if line is not None]


def _case_runs(case: str, plugin: str, runs: int, budget: float | None = None):
    source = PRELUDE + ("" if budget is None else f"exit_guard.EXIT_WAIT_SECONDS = {budget}\n")
    source += CASES[case]
    return [(source, [cpu_plugin_path(plugin)], EXPECTED_STATUS.get(case, 0))] * runs


@pytest.mark.parametrize("plugin", BOTH_PLUGINS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_exit_with_work_in_flight_is_clean(plugin, case):
    assert _run_many(_case_runs(case, plugin, 4)) == []


@pytest.mark.parametrize("plugin", BOTH_PLUGINS)
def test_work_that_outlasts_the_exit_budget_is_left_running_safely(plugin):
    """With no time to wait, the products are still running when the process ends: it must
    end without running the plugin's teardown, even the destructors that the products register
    while the exit is under way (the crash this guards against came 13 times in 15)."""
    assert _run_many(_case_runs("held", plugin, 12, budget=0.0)
                     + _case_runs("status", plugin, 4, budget=0.0)) == []


@pytest.mark.parametrize("plugin", BOTH_PLUGINS)
def test_exit_does_not_wait_past_its_budget(plugin):
    """A program running for many seconds does not hold the exit up past the budget."""
    source = PRELUDE + textwrap.dedent("""
        import time
        exit_guard.EXIT_WAIT_SECONDS = 0.5
        long = client.compile_and_load(LONG, [device])
        out = long.execute([client.buffer_from_pyval(np.ones((256, 256), np.float32), device)])
        time.sleep(0.2)
        assert not out[0].is_ready()
        sys.exit(5)
    """).replace("LONG", repr(matmul_loop(200_000)))
    started = time.monotonic()
    assert _run_many([(source, [cpu_plugin_path(plugin)], 5)], parallel=1) == []
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("plugin", BOTH_PLUGINS)
def test_a_daemon_thread_calling_after_the_exit_closed_its_client_prints_nothing(plugin):
    """A daemon thread that calls pjrt only after the exit has closed the client gets
    ClosedClientError. Printing its traceback while the interpreter finalises can abort the
    process (CPython finds the thread holding stderr's lock: "Fatal Python error"), so the
    thread is held instead, as one whose call ends during the exit is."""
    source = textwrap.dedent("""
        import atexit, sys, threading, time
        exit_closed_the_client = threading.Event()
        thread_called = threading.Event()

        def after_pjrt_closed_the_clients():  # registered first, so it runs after pjrt's hooks
            exit_closed_the_client.set()
            thread_called.wait(60)
            time.sleep(0.5)  # time for the thread's exception to reach threading.excepthook

        atexit.register(after_pjrt_closed_the_clients)
        import pjrt
        pjrt.load_pjrt_plugin_dynamically("cpu", sys.argv[1])
        client = pjrt.make_c_api_client("cpu")

        def compile_late():
            exit_closed_the_client.wait()
            try:
                client.compile_and_load(PROGRAM, client.devices()[:1])
            finally:
                thread_called.set()

        threading.Thread(target=compile_late, daemon=True).start()
    """).replace("PROGRAM", repr(TINY_PROGRAM))
    result = subprocess.run([sys.executable, "-c", source, cpu_plugin_path(plugin)],
                            capture_output=True, text=True, timeout=120, cwd=ROOT,
                            env=child_env())
    assert result.returncode == 0, result.stderr[-1500:]
    assert result.stderr == ""


@pytest.mark.parametrize("plugin", BOTH_PLUGINS)
def test_a_daemon_threads_compile_does_not_hold_the_exit(plugin):
    """A daemon thread whose compile ends after the exit began never takes its result, so the
    result is freed for it and its call ends: the exit goes on at once instead of waiting out
    its whole budget for a call that never returns."""
    started = time.monotonic()
    assert _run_many(_case_runs("compile", plugin, 1, budget=60.0), parallel=1) == []
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("plugin", BOTH_PLUGINS)
def test_exit_waits_for_a_client_freed_by_a_daemon_thread(plugin):
    """A daemon thread whose wait ends after the exit has closed the client ends that client's
    last call, so the daemon thread frees the client, and destroying it waits for a program
    still running on another device. The exit must wait for that too (or leave without the
    plugin's teardown), never run the plugin's teardown under it: the process lasts until the
    long program has run (it used to end as soon as the short one had, 1 run in 6 crashed)."""
    source = PRELUDE + textwrap.dedent("""
        import threading, time
        exit_guard.EXIT_WAIT_SECONDS = 60
        first, second = client.devices()[:2]
        long = client.compile_and_load(LONG, [second])
        short = client.compile_and_load(SHORT, [first])
        x_first = client.buffer_from_pyval(np.ones((256, 256), np.float32), first)
        x_second = client.buffer_from_pyval(np.ones((256, 256), np.float32), second)
        started = time.monotonic()
        long.execute([x_second])[0].block_until_ready()
        took = time.monotonic() - started
        short_out = short.execute([x_first])
        launched = time.monotonic()
        long_out = long.execute([x_second])
        waiting = threading.Event()
        def wait_for_the_short_program():
            waiting.set()
            short_out[0].block_until_ready()
        threading.Thread(target=wait_for_the_short_program, daemon=True).start()
        waiting.wait()
        time.sleep(0.05)
        assert not short_out[0].is_ready()
        print(launched, took, flush=True)
    """).replace("LONG", repr(matmul_loop(LONG_ITERATIONS))).replace(
        "SHORT", repr(matmul_loop(LONG_ITERATIONS // 8)))
    result = subprocess.run([sys.executable, "-c", source, cpu_plugin_path(plugin)],
                            capture_output=True, text=True, timeout=120, cwd=ROOT,
                            env=child_env())
    ended = time.monotonic()  # the same clock as the child's (CLOCK_MONOTONIC)
    assert result.returncode == 0, result.stderr[-1500:]
    assert "Traceback" not in result.stderr, result.stderr[-1500:]
    launched, took = map(float, result.stdout.split())
    assert ended - launched > 0.8 * took


def _readme_runs(runs: int):
    script, _ = script_of(ROOT / "README.md")
    environment = child_env(drop=("PJRT_PLATFORMS", "PJRT_CPU_DEVICE_COUNT", "PJRT_LOG_LEVEL"),
                            PJRT_PLATFORMS="cpu", JAX_PLATFORMS="cpu")
    return [(script, [], 0, environment)] * runs


def test_the_readme_program_exits_cleanly():
    assert _run_many(_readme_runs(4)) == []


@pytest.mark.slow
def test_three_hundred_exits_of_each_program_are_clean():
    """The four products (with and without a compile in flight on a daemon thread) and the
    README's blocks, 300 runs each, two at a time."""
    runs = [run for case in ("held", "compile") for plugin in BOTH_PLUGINS
            for run in _case_runs(case, plugin, 150)]
    assert _run_many(runs + _readme_runs(300)) == []

#!/usr/bin/env python
"""Where the time goes in one ``LoadedExecutable.execute([a, b])`` of the tiny program.

On XLA's CPU plugin (``pjrt_cpu.library_path()``), with jax 0.10 (jaxlib's own CPU client)
alongside when it is installed, it reports:

* **side by side**: the C floor (the shim's one launch call with a prefilled call struct, and
  ``PJRT_Buffer_Destroy`` when the result goes), pjrt's ``execute`` and jax's jitted dispatch,
  with device-resident inputs and with small numpy inputs (``copy_host_values=True``, what a
  ``pjrt.compile``'d program passes, and the ``pjrt.compile``'d call itself);
* **the steps of one call**, each timed alone, with its share of the whole call: the C launch
  and destroy (the floor), the rest of the C path (``CallPlan.run``: checks, ticket, output
  Array made and freed), and what is left (the Python method ``execute``, the argument and
  result lists);
* a cProfile of the plain loop.

The loops of the side-by-side rows are interleaved, so drift in the machine's speed hits all of
them alike; medians of the repeats are shown. The script reaches into pjrt's private names to
time the steps, so it follows the pjrt it runs against: a step whose internals changed prints
"n/a" with the reason. Run::

    python benchmarks/profile_execute.py [--quick]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

import pjrt  # noqa: E402
import pjrt_cpu  # noqa: E402
from pjrt._pjrt_cffi import ffi, lib  # noqa: E402
from pjrt.array import Array  # noqa: E402

perf_ns = time.perf_counter_ns
HERE = os.path.dirname(os.path.abspath(__file__))
TINY_TANH = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "tiny_tanh.mlir")
NULL = ffi.NULL


def loop(call):
    """``run(n)`` calling ``call()`` n times; returns the elapsed ns."""
    def run(n):
        t0 = perf_ns()
        for _ in range(n):
            call()
        return perf_ns() - t0
    return run


def sized(run, target_s: float) -> int:
    """How many iterations make ``run(n)`` last about ``target_s``."""
    run(100)
    n = 100
    while run(n) < 20e6:
        n *= 2
    return max(1, int(n * target_s * 1e9 / run(n)))


def interleaved_medians(runs: dict, target_s: float, repeats: int) -> dict:
    """Median ns per iteration of each ``run(n)``; the runs' repeats alternate."""
    sizes = {name: sized(run, target_s) for name, run in runs.items()}
    samples: dict = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            samples[name].append(run(sizes[name]) / sizes[name])
    return {name: statistics.median(values) for name, values in samples.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    target, repeats = (0.05, 3) if args.quick else (0.2, 7)

    pjrt.load_pjrt_plugin_dynamically("cpu", pjrt_cpu.library_path())
    client = pjrt.make_c_api_client("cpu")
    device = client.local_devices()[0]
    text = open(TINY_TANH).read()
    exe = client.compile_and_load(text, [device])
    program = pjrt.compile(text, device, client=client)
    a_host, b_host = np.arange(8, dtype=np.float32), np.ones(8, dtype=np.float32)
    a, b = client.buffer_from_pyval(a_host), client.buffer_from_pyval(b_host)
    execute = exe.execute
    want = np.tanh(a_host * b_host + 1)
    for result in (execute([a, b]), execute([a_host, b_host], copy_host_values=True)):
        np.testing.assert_allclose(np.asarray(result[0]), want, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(program(a_host, b_host)), want, rtol=1e-6)
    handle = exe._handle
    table = handle.api.table
    shape, dtype, devices = exe._output_shapes[0], exe._output_dtypes[0], (device,)

    try:
        import jax
        import jax.numpy as jnp

        f = jax.jit(lambda x, y: jnp.tanh(x * y + 1))
        ja, jb = jax.device_put(a_host), jax.device_put(b_host)
        np.testing.assert_allclose(np.asarray(f(ja, jb)), want, rtol=1e-6)
        jax_version = jax.__version__
    except ImportError:
        f = ja = jb = None
        jax_version = None

    def dispatch(call):
        """n calls, then one wait on the last result (so freeing each result is timed)."""
        def run(n):
            t0 = perf_ns()
            for _ in range(n):
                r = call()
            (r[0] if isinstance(r, list) else r).block_until_ready()
            return perf_ns() - t0
        return run

    # -- the C floor: the shim's launch with a prefilled struct, then the result's destroy --------
    from pjrt._runtime.launches import Call as _Call
    from pjrt.executable import _call_parameters

    fixed = _call_parameters(exe)[1]
    floor_call = _Call(handle, exe._launcher.pointer, device.pointer, 1, 2, fixed)
    floor_call.arguments[0], floor_call.arguments[1] = a._buffers[0], b._buffers[0]
    struct, outputs = floor_call.call, floor_call.outputs
    # Its own struct: a call that copies host values leaves their argument slots empty.
    host_call = _Call(handle, exe._launcher.pointer, device.pointer, 1, 2, fixed)
    host_struct, host_outputs, host_data = host_call.call, host_call.outputs, host_call.host_data
    run_call, destroy = lib.pjrt_shim_call_run, lib.pjrt_shim_buffer_destroy
    a_view, b_view = ffi.from_buffer(a_host), ffi.from_buffer(b_host)

    def c_floor(n):
        t0 = perf_ns()
        for _ in range(n):
            run_call(struct)
            destroy(table, outputs[0])
        return perf_ns() - t0

    def c_floor_host(n):
        """The same with both inputs copied from the host inside the call (the two pointer
        writes it takes are Python's)."""
        t0 = perf_ns()
        for _ in range(n):
            host_data[0] = a_view
            host_data[1] = b_view
            run_call(host_struct)
            destroy(table, host_outputs[0])
        return perf_ns() - t0

    runs = {"C floor": c_floor,
            "pjrt execute([a, b])": dispatch(lambda: execute([a, b])),
            "C floor, numpy inputs": c_floor_host,
            "pjrt execute([a_np, b_np], copy_host_values=True)": dispatch(
                lambda: execute([a_host, b_host], copy_host_values=True)),
            "pjrt.compile'd program(a_np, b_np)": dispatch(lambda: program(a_host, b_host))}
    def read_loop(call):
        """n calls, each result read to numpy (the small read of bench_core's (b))."""
        def run(n):
            t0 = perf_ns()
            for _ in range(n):
                np.asarray(call())
            return perf_ns() - t0
        return run

    runs["pjrt np.asarray(execute([a, b])[0])"] = read_loop(lambda: execute([a, b])[0])
    if f is not None:
        runs["jax f(a, b), device arrays"] = dispatch(lambda: f(ja, jb))
        runs["jax f(a_np, b_np), numpy arrays"] = dispatch(lambda: f(a_host, b_host))
        runs["jax np.asarray(f(a, b))"] = read_loop(lambda: f(ja, jb))
    whole = interleaved_medians(runs, target, repeats)

    # -- the steps of one call, each alone ------------------------------------------------------
    empty = interleaved_medians({"": loop(lambda: None)}, target, repeats)[""]
    steps: dict[str, float | None] = {}

    def step(name, body):
        """``body``: a no-argument callable doing the step once."""
        try:
            body()
            steps[name] = max(0.0, interleaved_medians({name: loop(body)}, target, repeats)[name]
                              - empty)
        except Exception as error:  # noqa: BLE001 - internals moved: say so, keep going
            steps[name] = None
            print(f"# {name}: n/a ({type(error).__name__}: {error})", file=sys.stderr)

    plan = exe._launcher.plan
    run_plan = plan.run

    def launch():
        run_call(struct)
        destroy(table, outputs[0])

    def c_destroy_alone(n):
        spent = 0
        for _ in range(n):
            run_call(struct)
            t0 = perf_ns()
            destroy(table, outputs[0])
            spent += perf_ns() - t0
        return spent

    null_buffer = ffi.new("PJRT_Buffer*[]", 1)[0]  # NULL: the shim's destroy returns at once

    step("C: launch + destroy (the floor, as one step)", launch)
    step("C path: CallPlan.run([a, b]) + freeing its output (all of it C)",
         lambda: run_plan([a, b], False))
    step("C path with 2 numpy arrays: CallPlan.run([a_np, b_np])",
         lambda: run_plan([a_host, b_host], True))
    clock = interleaved_medians({"": loop(perf_ns)}, target, repeats)[""] - empty
    try:
        destroy_ns = max(0.0, interleaved_medians({"": c_destroy_alone}, target, repeats)[""]
                         - clock)
    except Exception as error:  # noqa: BLE001
        destroy_ns = None
        print(f"# C destroy: n/a ({error})", file=sys.stderr)
    step("output Array, full path: construct + free (Python; C destroy of NULL)",
         lambda: [Array(client, [null_buffer], devices, shape, dtype)])

    # The pieces of a small read (pjrt/_runtime/host_reads.py): one C call copies a ready buffer into
    # a fresh array, which is handed out read-only.
    ready = execute([a, b])[0]
    ready.block_until_ready()
    ready_buffer, host = ready._buffers[0], np.empty(shape, dtype)
    host_pointer, host_read = ffi.from_buffer(host), lib.pjrt_host_read
    step("read: pjrt_host_read of a ready 32-byte buffer (one C call)",
         lambda: host_read(table, ready_buffer, host_pointer, host.nbytes))

    def fresh_read_only():
        out = np.empty(shape, dtype)
        ffi.from_buffer(out)
        return np.asarray(memoryview(out).toreadonly())

    step("read: np.empty + ffi.from_buffer + read-only memoryview", fresh_read_only)
    step("read: np.asarray of an already-read Array (cached copy)", lambda: np.asarray(ready))

    # -- report -------------------------------------------------------------------------------
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# pjrt {pjrt.__version__}, jax {jax_version or 'not installed'}; execute of "
          f"tiny_tanh (8 x f32, 2 inputs); {os.cpu_count()} CPUs, load {load:.2f}; medians of "
          f"{repeats} interleaved loops of ~{target} s; an empty Python call ({empty:.0f} ns) is "
          f"subtracted from the steps")
    width = max(map(len, list(whole) + list(steps))) + 2
    print(f"\n{'whole calls':<{width}}  ns/call  vs C floor  vs jax")
    pairs = {"pjrt execute([a, b])": ("C floor", "jax f(a, b), device arrays"),
             "pjrt execute([a_np, b_np], copy_host_values=True)": (
                 "C floor, numpy inputs", "jax f(a_np, b_np), numpy arrays"),
             "pjrt.compile'd program(a_np, b_np)": (
                 "C floor, numpy inputs", "jax f(a_np, b_np), numpy arrays"),
             "pjrt np.asarray(execute([a, b])[0])": (None, "jax np.asarray(f(a, b))")}
    for name, value in whole.items():
        floor_name, jax_name = pairs.get(name, (None, None))
        vs_floor = f"{value / whole[floor_name]:9.2f}x" if floor_name else " " * 10
        vs_jax = f"{value / whole[jax_name]:6.2f}x" if jax_name in whole else ""
        print(f"{name:<{width}}  {value:7.0f}  {vs_floor}  {vs_jax}")

    total = whole["pjrt execute([a, b])"]
    print(f"\n{'steps of execute([a, b])':<{width}}  ns/call  share")
    device_steps = {k: v for k, v in steps.items()
                    if "numpy" not in k and not k.startswith("read:") and "full path" not in k}
    c_path = device_steps.pop("C path: CallPlan.run([a, b]) + freeing its output (all of it C)",
                              None)
    floor_step = device_steps.get("C: launch + destroy (the floor, as one step)")
    if c_path is not None and floor_step is not None:
        device_steps["C path around the launch (checks, ticket, output Array made, freed)"] = (
            max(0.0, c_path - floor_step))
    if destroy_ns is not None and device_steps.get("C: launch + destroy (the floor, as one step)"):
        print(f"{'  (of the C step, the destroy alone)':<{width}}  {destroy_ns:7.0f}")
    for name, value in device_steps.items():
        text_value = "    n/a" if value is None else f"{value:7.0f}  {value / total:5.0%}"
        print(f"{name:<{width}}  {text_value}")
    rest = total - sum(v for v in device_steps.values() if v is not None)
    print(f"{'rest (the Python method execute, the argument and result lists)':<{width}}  "
          f"{rest:7.0f}  {rest / total:5.0%}")
    numpy_step = steps["C path with 2 numpy arrays: CallPlan.run([a_np, b_np])"]
    if numpy_step is not None:
        print(f"{'C path with 2 numpy arrays: CallPlan.run([a_np, b_np])':<{width}}  "
              f"{numpy_step:7.0f}  (of the numpy call)")

    read_total = whole["pjrt np.asarray(execute([a, b])[0])"]
    print(f"\n{'steps of a small read (of np.asarray(execute(...)[0]))':<{width}}  ns/call  share")
    for name, value in steps.items():
        if name.startswith("read:"):
            text_value = "    n/a" if value is None else f"{value:7.0f}  {value / read_total:5.0%}"
            print(f"{name:<{width}}  {text_value}")

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(2000 if args.quick else 20000):
        r = execute([a, b])
    r[0].block_until_ready()
    profiler.disable()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(12)
    print("\n# cProfile of the loop, by own time (cProfile inflates small Python functions)")
    print("\n".join(line for line in stream.getvalue().splitlines()[4:] if line.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

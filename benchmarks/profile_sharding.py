#!/usr/bin/env python
"""Where the time goes in bench_sharding.py's (b): an 8-device SPMD call of ``x * 2 + 1`` on
``x[8]`` sharded ``P('x')``, through ``CompiledProgram.__call__`` with a pre-placed global
Array.

It times the whole call, then its pieces in isolation, calling pjrt's internals the way the
call does (the C launch and the freeing of the outputs apart from the Python around them),
then prints a cProfile of many calls ordered by own time.

Usage::

    python benchmarks/profile_sharding.py            # ~30 s on 2 cores
    python benchmarks/profile_sharding.py --calls 5000
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

from bench_sharding import NUM_DEVICES, SPMD_AFFINE_MLIR  # noqa: E402

perf_ns = time.perf_counter_ns


def per_call_ns(run, n: int, repeats: int = 7) -> float:
    """Median ns per iteration of ``run(n)`` (which returns elapsed ns for n iterations)."""
    run(max(1, n // 10))
    return statistics.median(run(n) / n for _ in range(repeats))


def loop(body, setup=lambda: None):
    def run(n):
        state = setup()
        t0 = perf_ns()
        for _ in range(n):
            body(state)
        return perf_ns() - t0
    return run


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000, help="iterations per timed loop")
    args = parser.parse_args(argv)
    n = args.calls

    import pjrt
    import pjrt_cpu
    from pjrt._pjrt_cffi import lib
    from pjrt.transfers import (batched_copy_array_to_devices_with_sharding, device_put,
                                is_placed_as)
    from pjrt.array import check_device_sets
    from pjrt.sharding import global_shape_of_shards

    pjrt.load_pjrt_plugin_dynamically("cpu", pjrt_cpu.library_path())
    client = pjrt.make_c_api_client("cpu", {"cpu_device_count": NUM_DEVICES})
    mesh = pjrt.Mesh(np.array(client.devices()[:NUM_DEVICES], dtype=object), ("x",))
    compiled = pjrt.compile(SPMD_AFFINE_MLIR, mesh)
    executable = compiled.executable
    host = np.arange(NUM_DEVICES, dtype=np.float32)
    x = pjrt.device_put(host, compiled.input_shardings[0])
    xn = pjrt.device_put(host, pjrt.NamedSharding(mesh, pjrt.P("x")))
    np.testing.assert_array_equal(np.asarray(compiled(x)), host * 2 + 1)
    devices = tuple(compiled.devices)
    in_sharding = executable.input_shardings[0]
    out_sharding = executable.output_shardings[0]
    api = client._handle.api
    table = api.table

    results: list[tuple[str, float]] = []

    def record(label, run):
        value = per_call_ns(run, n)
        results.append((label, value))
        print(f"{value / 1000:9.2f} us  {label}", flush=True)

    print(f"# {n} calls per loop, median of 7 loops; {NUM_DEVICES} devices, 1 argument, "
          f"1 output", flush=True)

    # -- whole calls (the result of one call is freed during the next, as in the benchmark)
    def whole(f, argument):
        def run(k):
            t0 = perf_ns()
            for _ in range(k):
                r = f(argument)
            (r[0] if isinstance(r, list) else r).block_until_ready()
            return perf_ns() - t0
        return run

    record("whole CompiledProgram(x), N calls then wait", whole(compiled, x))
    record("whole CompiledProgram(xn) (x placed with an equivalent NamedSharding)",
           whole(compiled, xn))
    record("whole execute_global([x]), N calls then wait",
           whole(executable.execute_global, [x]))

    # -- the C floor: PJRT_LoadedExecutable_Execute on 8 devices + destroying 8 outputs
    pointer = executable._live_pointer()

    def c_launch(k):
        scratch = executable._scratch(1, NUM_DEVICES)
        try:
            for d in range(NUM_DEVICES):
                scratch.arguments[d] = x._buffers[x._devices.index(devices[d])]
            elapsed = 0
            for _ in range(k):
                t0 = perf_ns()
                executable._launch(pointer, scratch, NUM_DEVICES, 1, ())
                elapsed += perf_ns() - t0
                outputs = [scratch.outputs[d] for d in range(NUM_DEVICES)]
                lib.pjrt_shim_buffer_await_ready(table, outputs[-1])
                for buffer in outputs:
                    lib.pjrt_shim_buffer_destroy(table, buffer)
            return elapsed
        finally:
            scratch.busy = False

    def c_destroy(k):
        scratch = executable._scratch(1, NUM_DEVICES)
        try:
            for d in range(NUM_DEVICES):
                scratch.arguments[d] = x._buffers[x._devices.index(devices[d])]
            elapsed = 0
            for _ in range(k):
                executable._launch(pointer, scratch, NUM_DEVICES, 1, ())
                outputs = [scratch.outputs[d] for d in range(NUM_DEVICES)]
                lib.pjrt_shim_buffer_await_ready(table, outputs[-1])
                t0 = perf_ns()
                for buffer in outputs:
                    lib.pjrt_shim_buffer_destroy(table, buffer)
                elapsed += perf_ns() - t0
            return elapsed
        finally:
            scratch.busy = False

    record("C: pjrt_shim_execute -> PJRT_LoadedExecutable_Execute, 8 devices (timed apart)",
           c_launch)
    record("C: PJRT_Buffer_Destroy x8 of the outputs (timed apart)", c_destroy)

    # -- Python pieces of CompiledProgram.__call__ -> _place_global
    record("_place_global([x]) (x already placed: passed as it is)",
           loop(lambda _: compiled._place_global((x,))))
    record("· is_placed_as(x, input sharding) (the very sharding object)",
           loop(lambda _: is_placed_as(x, in_sharding)))
    record("· is_placed_as(xn, input sharding) (an equal NamedSharding: cached tokens)",
           loop(lambda _: is_placed_as(xn, in_sharding)))
    record("· _place_global([xn])", loop(lambda _: compiled._place_global((xn,))))
    record("· check_device_sets([x], devices) (only for arguments not placed as expected)",
           loop(lambda _: check_device_sets([x], devices)))
    record("· device_put(x, input sharding) (returns x)",
           loop(lambda _: device_put(x, in_sharding)))
    record("· batched_copy_array_to_devices_with_sharding([xn], [input sharding]) (equivalent)",
           loop(lambda _: batched_copy_array_to_devices_with_sharding([xn], [in_sharding])))
    record("· · NamedSharding.is_equivalent_to(GSPMDSharding, 1)",
           loop(lambda _: xn.sharding.is_equivalent_to(in_sharding, 1)))
    record("· · · NamedSharding.to_hlo_sharding(1) (spec_to_hlo_sharding, lru-cached)",
           loop(lambda _: xn.sharding.to_hlo_sharding(1)))
    record("· · · GSPMDSharding._device_assignment (a tuple kept from construction)",
           loop(lambda _: in_sharding._device_assignment))

    # -- Python pieces of execute_global
    record("execute_global: input_shardings + _live_pointer + _check_count",
           loop(lambda _: (executable.input_shardings, executable._live_pointer(),
                           executable._check_count(1))))
    record("execute_global: per argument: live_buffers + is_equivalent_to (GSPMD vs itself)",
           loop(lambda _: (x.live_buffers(), x.sharding.is_equivalent_to(in_sharding, 1))))
    record("execute_global: per argument: tuple(shard_shape) (a plain-int shape: from the cache)",
           loop(lambda _: tuple(in_sharding.shard_shape(x.shape))))

    def row(_):
        by_device = dict(zip(x._devices, x._buffers))
        return [by_device[d] for d in devices]
    record("execute_global: per argument: dict(zip(devices, buffers)) + row (only when the shards come in another device order)",
           loop(row))

    def scratch_fill(_):
        scratch = executable._scratch(1, NUM_DEVICES)
        try:
            row = list(x._buffers)
            position = 0
            for d in range(NUM_DEVICES):
                for r in (row,):
                    scratch.arguments[position] = r[d]
                    position += 1
        finally:
            scratch.busy = False
    record("execute_global: _scratch + filling 8 argument slots", loop(scratch_fill))

    scratch = executable._scratch(1, NUM_DEVICES)
    scratch.busy = False
    record("execute_global: per_output lists (cdata indexing)",
           loop(lambda _: [[scratch.outputs[d * 1 + j] for d in range(NUM_DEVICES)]
                           for j in range(1)]))
    record("execute_global: global_shape_of_shards(output sharding, shard shape)",
           loop(lambda _: global_shape_of_shards(out_sharding, executable._output_shapes[0])))
    record("function-level 'from .sharding import PmapSharding' (5 such per call)",
           loop(lambda _: __import__("pjrt.sharding", fromlist=["PmapSharding"])))

    def array_build(_):
        # An 8-buffer Array built and dropped without C buffers (NULLs are never destroyed).
        from pjrt._pjrt_cffi import ffi
        a = pjrt.Array(client, [ffi.NULL] * NUM_DEVICES, devices, (8,), np.dtype(np.float32),
                       None, out_sharding)
        client._handle.buffers.pop(id(a), None)
        del a
    record("output Array(...) construct + drop (no C calls)", loop(array_build))

    # -- host time between launches: the 8 device threads share the machine's cores with the
    #    Python thread, so time spent in Python between calls may not overlap with execution.
    print()
    print("# C launches with a host busy-wait between them (no Python objects)")

    def c_busy(busy_ns):
        def run(k):
            scratch = executable._scratch(1, NUM_DEVICES)
            try:
                for d in range(NUM_DEVICES):
                    scratch.arguments[d] = x._buffers[x._devices.index(devices[d])]
                previous = None
                t0 = perf_ns()
                for _ in range(k):
                    executable._launch(pointer, scratch, NUM_DEVICES, 1, ())
                    outputs = [scratch.outputs[d] for d in range(NUM_DEVICES)]
                    if previous is not None:
                        for buffer in previous:
                            lib.pjrt_shim_buffer_destroy(table, buffer)
                    previous = outputs
                    end = perf_ns() + busy_ns
                    while perf_ns() < end:
                        pass
                for buffer in previous:
                    lib.pjrt_shim_buffer_await_ready(table, buffer)
                elapsed = perf_ns() - t0
                for buffer in previous:
                    lib.pjrt_shim_buffer_destroy(table, buffer)
                return elapsed
            finally:
                scratch.busy = False
        return run

    for busy_us in (0, 10, 25, 50):
        record(f"C launches, N calls then wait, {busy_us} us of host busy-wait between calls",
               c_busy(busy_us * 1000))

    # -- cProfile
    gc.collect()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(n * 3):
        r = compiled(x)
    r.block_until_ready()
    profiler.disable()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(18)
    print()
    print(f"# cProfile of {n * 3} CompiledProgram(x) calls, by own time")
    print("\n".join(line for line in stream.getvalue().splitlines() if line.strip())[:6000])
    return 0


if __name__ == "__main__":
    sys.exit(main())

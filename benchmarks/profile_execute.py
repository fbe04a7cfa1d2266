#!/usr/bin/env python
"""Where the time goes in one ``LoadedExecutable.execute([a, b])`` of the tiny program.

Times, on XLA's CPU plugin (``pjrt_cpu.library_path()``), the whole call and each piece of it
in isolation, by calling pjrt's own internals the way ``execute`` does:

* the C calls themselves, with preallocated cdata: ``PJRT_LoadedExecutable_Execute`` through
  the shim and ``PJRT_Buffer_Destroy`` when the result is freed (the floor);
* Python-side validation (``_live_pointer``, ``_check_count``, ``_check_argument`` per argument,
  ``_check_donations``, ``_consume_donated``);
* the three ``ffi.new`` allocations in ``_run``;
* building the output ``Array`` and freeing it again (``Array.__init__`` with its registrations,
  ``__del__`` with the ``ffi.new`` it makes for the destroy call);
* the cyclic garbage collector's share (the loop run with ``gc`` disabled);
* a prototype fast path built from the same pieces, to size the suggestions in README.md.

Then a cProfile of the plain loop. pjrt itself is not modified; the script reaches into its
private names, so it follows the pjrt it runs against (a piece whose internals changed prints
"n/a"). Run::

    python benchmarks/profile_execute.py [--quick]
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
import weakref

import numpy as np

import pjrt
import pjrt_cpu
from pjrt._pjrt_cffi import ffi, lib
from pjrt.array import Array

perf_ns = time.perf_counter_ns
HERE = os.path.dirname(os.path.abspath(__file__))
TINY_TANH = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "tiny_tanh.mlir")
NULL = ffi.NULL


def median_ns(run, target_s: float, repeats: int) -> float:
    """Median ns per iteration of ``run(n)``, which returns the elapsed ns of n iterations."""
    run(100)
    n = 100
    while run(n) < 20e6:
        n *= 2
    n = max(1, int(n * target_s * 1e9 / run(n)))
    return statistics.median(run(n) / n for _ in range(repeats))


def loop(call):
    """``run(n)`` calling ``call()`` n times."""
    def run(n):
        t0 = perf_ns()
        for _ in range(n):
            call()
        return perf_ns() - t0
    return run


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    target, repeats = (0.05, 3) if args.quick else (0.2, 7)
    measure = lambda run: median_ns(run, target, repeats)  # noqa: E731

    pjrt.load_pjrt_plugin_dynamically("cpu", pjrt_cpu.library_path())
    client = pjrt.make_c_api_client("cpu")
    device = client.local_devices()[0]
    exe = client.compile_and_load(open(TINY_TANH).read(), [device])
    a = client.buffer_from_pyval(np.arange(8, dtype=np.float32))
    b = client.buffer_from_pyval(np.ones(8, dtype=np.float32))
    arguments = [a, b]
    execute = exe.execute
    api = exe._handle.api
    table, pointer = api.table, exe._pointer
    shape, dtype, devices = exe._output_shapes[0], exe._output_dtypes[0], (device,)
    results: dict[str, float | None] = {}
    empty_call = measure(loop(lambda: None))

    def record(name, make):
        try:
            results[name] = make()
        except Exception as error:  # noqa: BLE001 - internals moved: say so, keep going
            results[name] = None
            print(f"# {name}: n/a ({type(error).__name__}: {error})", file=sys.stderr)

    # -- the whole call ----------------------------------------------------------------------
    def full(n):
        t0 = perf_ns()
        for _ in range(n):
            r = execute([a, b])
        r[0].block_until_ready()
        return perf_ns() - t0

    def full_nogc(n):
        gc.disable()
        try:
            return full(n)
        finally:
            gc.enable()

    record("execute([a, b]), incl. freeing the previous result", lambda: measure(full))
    record("  same, gc disabled", lambda: measure(full_nogc))

    # -- the C floor ---------------------------------------------------------------------------
    arg_array = ffi.new("PJRT_Buffer*[]", [a._buffers[0], b._buffers[0]])
    out_array = ffi.new("PJRT_Buffer*[]", 1)
    error = ffi.new("PJRT_Error **")
    execute_c, destroy_c = lib.pjrt_shim_execute, lib.pjrt_shim_buffers_destroy

    def c_floor(n):
        t0 = perf_ns()
        for _ in range(n):
            execute_c(table, pointer, arg_array, 1, 2, out_array, 1, NULL, 0, NULL, NULL, error)
            destroy_c(table, out_array, 1)
        return perf_ns() - t0

    def c_split(n):
        """Execute and destroy timed apart, each between two clock reads."""
        spent_execute = spent_destroy = 0
        for _ in range(n):
            t0 = perf_ns()
            execute_c(table, pointer, arg_array, 1, 2, out_array, 1, NULL, 0, NULL, NULL, error)
            t1 = perf_ns()
            destroy_c(table, out_array, 1)
            t2 = perf_ns()
            spent_execute += t1 - t0
            spent_destroy += t2 - t1
        c_split.destroy_ns = spent_destroy / n
        return spent_execute

    clock = measure(loop(perf_ns)) - empty_call

    record("C floor: shim execute + buffer destroy (preallocated cdata)", lambda: measure(c_floor))
    record("  of which the execute call (timed apart)", lambda: measure(c_split) - clock)
    record("  of which the destroy call (timed apart)", lambda: c_split.destroy_ns - clock)

    # -- Python-side validation ----------------------------------------------------------------
    def validation(n):
        t0 = perf_ns()
        for _ in range(n):
            if len(exe._devices) != 1:
                raise AssertionError
            exe._live_pointer()
            exe._check_count(len(arguments))
            dev = exe._devices[0]
            [exe._check_argument(i, x, dev) for i, x in enumerate(arguments)]
            exe._check_donations([arguments])
            exe._consume_donated([arguments])
        return perf_ns() - t0

    expected_dtype = exe._signature.parameters[0].dtype
    record("validation, as execute() does it (2 arguments)", lambda: measure(validation))
    record("  _live_pointer()", lambda: measure(loop(exe._live_pointer)) - empty_call)
    record("  _check_count(2)", lambda: measure(loop(lambda: exe._check_count(2))) - empty_call)
    record("  _check_donations + _consume_donated (nothing donated)", lambda: measure(loop(
        lambda: (exe._check_donations([arguments]), exe._consume_donated([arguments]))))
        - empty_call)
    record("  one _check_argument", lambda: measure(loop(lambda: exe._check_argument(0, a, device)))
           - empty_call)
    record("    of which a.dtype != expected (numpy)", lambda: measure(loop(
        lambda: a.dtype != expected_dtype)) - empty_call)

    # -- ffi.new ---------------------------------------------------------------------------------
    buffers = [a._buffers[0], b._buffers[0]]
    new = ffi.new

    def ffi_news(n):
        t0 = perf_ns()
        for _ in range(n):
            new("PJRT_Buffer*[]", buffers)
            new("PJRT_Buffer*[]", 1)
            new("PJRT_Error **")
        return perf_ns() - t0

    one = [a._buffers[0]]
    record("_run: 3x ffi.new (arguments, outputs, error)", lambda: measure(ffi_news))
    record("release: ffi.new('PJRT_Buffer*[]', [buffer])", lambda: measure(
        loop(lambda: new("PJRT_Buffer*[]", one))) - empty_call)

    # -- Array construction and release, without C ----------------------------------------------
    class Plain:
        __slots__ = ("__weakref__",)

    live = weakref.WeakSet()

    def weakset_cost(n):
        """A WeakSet add of an object that is then freed (its removal callback runs)."""
        add = live.add
        t0 = perf_ns()
        for _ in range(n):
            add(Plain())
        with_set = perf_ns() - t0
        t0 = perf_ns()
        for _ in range(n):
            Plain()
        return with_set - (perf_ns() - t0)

    # buffers=None: nothing is registered for destruction, so no C call is made on release.
    record("Array(...) construct + free, no C (registrations included)", lambda: measure(
        loop(lambda: Array(client, None, devices, shape, dtype))) - empty_call)
    record("  of which a WeakSet add + its removal on free", lambda: measure(weakset_cost))

    null_outputs = ffi.new("PJRT_Buffer*[]", 1)  # a NULL buffer: the destroy helper skips it
    record("_wrap_outputs + free, NULL buffer (release's ffi.new + C no-op incl.)", lambda: measure(
        loop(lambda: exe._wrap_outputs(null_outputs, 0, devices))) - empty_call)

    # -- a prototype fast path -------------------------------------------------------------------
    # Not pjrt code: the suggestions of benchmarks/README.md sketched with pjrt's own pieces to
    # size them. The same checks (count, type, liveness, device, shape, dtype; closed client),
    # with what is known at load time precomputed, dtypes compared by identity first, and one
    # cdata scratch per executable (per thread in a real version, since cffi releases the GIL
    # around the C call) instead of three ffi.new per call. Output Arrays are built as now.
    params = exe._signature.parameters
    expected = tuple((p.shape, p.dtype) for p in params)
    scratch_args = ffi.new("PJRT_Buffer*[]", len(params))
    scratch_out = ffi.new("PJRT_Buffer*[]", 1)
    scratch_err = ffi.new("PJRT_Error **")
    handle = exe._handle

    def fast_execute(args, Array=Array, device=device, devices=devices, client=client):
        if len(args) != len(expected) or handle.closed or exe._pointer == NULL:
            raise TypeError("take the slow path for the message")
        i = 0
        for x in args:
            held = x._buffers if type(x) is Array else None
            want_shape, want_dtype = expected[i]
            if (held is None or x._devices[0] is not device or x.shape != want_shape
                    or (x.dtype is not want_dtype and x.dtype != want_dtype)):
                raise TypeError("take the slow path for the message")
            scratch_args[i] = held[0]
            i += 1
        execute_c(table, pointer, scratch_args, 1, i, scratch_out, 1, NULL, 0, NULL, NULL,
                  scratch_err)
        if scratch_err[0] != NULL:
            raise RuntimeError("take the slow path for the message")
        return [Array(client, [scratch_out[0]], devices, shape, dtype)]

    def fast(n):
        t0 = perf_ns()
        for _ in range(n):
            r = fast_execute([a, b])
        r[0].block_until_ready()
        return perf_ns() - t0

    assert np.array_equal(np.asarray(fast_execute([a, b])[0]), np.asarray(execute([a, b])[0]))
    record("prototype fast path (same checks, scratch cdata, Array as now)", lambda: measure(fast))

    # -- (b): np.asarray of a fresh 8-element result ----------------------------------------------
    def with_read(n):
        t0 = perf_ns()
        for _ in range(n):
            np.asarray(execute([a, b])[0])
        return perf_ns() - t0

    ready = execute([a, b])[0]
    ready.block_until_ready()
    ready_buffer = ready._buffers[0]
    host = np.empty(8, np.float32)
    host_pointer = ffi.from_buffer(host)
    host_read_c = lib.pjrt_host_read
    empty, from_buffer = np.empty, ffi.from_buffer

    def read_pieces(n):
        t0 = perf_ns()
        for _ in range(n):
            out = empty(shape, dtype)
            from_buffer(out)
            out.nbytes
            np.asarray(memoryview(out).toreadonly())
        return perf_ns() - t0

    def cached_read(n):
        t0 = perf_ns()
        for _ in range(n):
            np.asarray(ready)
        return perf_ns() - t0

    record("(b) np.asarray(execute([a, b])[0])", lambda: measure(with_read))
    record("  np.asarray part: pjrt_host_read of a ready 32-byte buffer (one C call)",
           lambda: measure(loop(lambda: host_read_c(table, ready_buffer, host_pointer, 32)))
           - empty_call)
    record("  np.asarray part: np.empty + ffi.from_buffer + nbytes + read-only memoryview",
           lambda: measure(read_pieces))
    record("  np.asarray of an array read before (its cached copy)", lambda: measure(cached_read))

    # -- report ----------------------------------------------------------------------------------
    width = max(map(len, results))
    print(f"# pjrt {pjrt.__version__} ({os.path.dirname(pjrt.__file__)}), plugin PJRT API "
          f"{'.'.join(map(str, api.version))}; execute([a, b]) of tiny_tanh (8 x f32); "
          f"{os.cpu_count()} CPUs; medians of {repeats} loops of ~{target} s; an empty "
          f"Python call ({empty_call:.0f} ns) is subtracted from the one-call pieces")
    print(f"{'piece':<{width}}  ns/call")
    for name, value in results.items():
        print(f"{name:<{width}}  {'n/a' if value is None else f'{value:7.0f}'}")

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(2000 if args.quick else 20000):
        r = execute([a, b])
    r[0].block_until_ready()
    profiler.disable()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(16)
    print("\n# cProfile of the loop, by own time (cProfile inflates small Python functions)")
    print("\n".join(line for line in stream.getvalue().splitlines()[4:] if line.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

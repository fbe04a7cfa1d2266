#!/usr/bin/env python
"""Sharded placement and SPMD dispatch: pjrt next to jax 0.10.2 on 8 CPU devices.

One run measures, on the same machine:

  (a) ``device_put`` of 256 MiB of float32 sharded over 8 devices (``NamedSharding(mesh,
      P('x'))`` on a 1-d mesh of 8), until every shard is ready, in GB/s, next to memcpy
      bandwidth (``np.copyto`` into a preallocated array, and ``np.empty`` + ``np.copyto``
      into fresh pages) measured in the same run;
  (b) the per-call overhead of an 8-device SPMD program with tiny inputs (``x * 2 + 1`` on
      ``x[8]`` sharded ``P('x')``): pjrt's ``CompiledProgram`` called with pre-placed global
      Arrays, ``LoadedExecutable.execute_global`` directly, and jax's jitted function called
      with committed sharded arrays; N calls, then a wait on the last result. A reference row
      gives pjrt's C floor: the bare launch and the freeing of the outputs, no Python objects
      (``profile_sharding.py`` breaks the rest down).

pjrt loads ``pjrt_cpu.library_path()`` (the ``xla-cpu-pjrt`` wheel) with ``cpu_device_count=8``;
jax uses jaxlib's own built-in CPU client with ``jax_num_cpu_devices=8`` (the same XLA CPU
runtime, linked into jaxlib). jax is optional: without it its column is empty.

Usage::

    python benchmarks/bench_sharding.py              # full run (about 20 s on 2 cores)
    python benchmarks/bench_sharding.py --quick      # CI smoke: fewer, shorter repeats
    python benchmarks/bench_sharding.py --only b     # one section (a or b)
    python benchmarks/bench_sharding.py --markdown   # the table as Markdown (for the README)
    python benchmarks/bench_sharding.py --without jax

Timing follows ``bench_core.py`` (whose helpers this imports): per-call cells are medians of
interleaved loops sized to about 0.2 s (0.03 s with --quick), transfer cells medians of single
transfers after two warm-ups, with the result freed outside the timed part.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import subprocess
import sys
import time
from typing import Callable

os.environ.setdefault("JAX_PLATFORMS", "cpu")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

from bench_core import (QUICK, REPO, Row, Settings, aligned_empty, cpu_model,  # noqa: E402
                        format_ratio, format_value, memcpy_references, one_shot_medians,
                        per_call_medians)

perf_ns = time.perf_counter_ns

NUM_DEVICES = 8
#: 256 MiB of float32 for the sharded placement.
BIG_ELEMENTS = 64 * 1024 * 1024
BIG_BYTES = BIG_ELEMENTS * 4

#: ``x * 2 + 1`` on ``x[8]`` sharded over a mesh of 8 (what jax lowers, Shardy form).
SPMD_AFFINE_MLIR = """\
module @spmd_affine attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=8]>
  func.func public @main(%arg0: tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}]>})
      -> (tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}]>}) {
    %two = stablehlo.constant dense<2.000000e+00> : tensor<8xf32>
    %one = stablehlo.constant dense<1.000000e+00> : tensor<8xf32>
    %0 = stablehlo.multiply %arg0, %two : tensor<8xf32>
    %1 = stablehlo.add %0, %one : tensor<8xf32>
    return %1 : tensor<8xf32>
  }
}
"""

LIBS = ("jax", "pjrt")


# --------------------------------------------------------------------------------------------
# the two libraries, each with a 1-d mesh of 8 devices


class Pjrt:
    name = "pjrt"

    def __init__(self, plugin_path: str):
        import pjrt

        self.pjrt = pjrt
        plugin = pjrt.load_pjrt_plugin_dynamically("bench_cpu", plugin_path)
        self.api_version = plugin.api_version
        self.client = pjrt.make_c_api_client("bench_cpu", {"cpu_device_count": NUM_DEVICES})
        devices = self.client.devices()
        if len(devices) < NUM_DEVICES:
            raise RuntimeError(f"the plugin gave {len(devices)} devices, not {NUM_DEVICES}")
        self.mesh = pjrt.Mesh(np.array(devices[:NUM_DEVICES], dtype=object), ("x",))
        self.sharding = pjrt.NamedSharding(self.mesh, pjrt.P("x"))
        self.version = f"pjrt {pjrt.__version__}"


class Jax:
    name = "jax"

    def __init__(self):
        import jax
        import jaxlib

        jax.config.update("jax_num_cpu_devices", NUM_DEVICES)
        devices = jax.devices("cpu")
        if len(devices) < NUM_DEVICES:
            raise RuntimeError(f"jax sees {len(devices)} CPU devices, not {NUM_DEVICES}")
        self.jax = jax
        self.mesh = jax.sharding.Mesh(np.array(devices[:NUM_DEVICES]), ("x",))
        self.sharding = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec("x"))
        self.version = f"jax {jax.__version__}, jaxlib {jaxlib.__version__}"


def load_libraries(plugin_path: str, without: set[str]) -> tuple[dict, list[str]]:
    libs: dict = {"pjrt": Pjrt(plugin_path)}
    missing: list[str] = []
    if "jax" in without:
        missing.append("jax: skipped (--without)")
    else:
        try:
            libs["jax"] = Jax()
        except Exception as error:  # noqa: BLE001 - reported, and the column is skipped
            missing.append(f"jax: not available ({type(error).__name__}: {error}); "
                           f"its column is skipped")
    return libs, missing


# --------------------------------------------------------------------------------------------
# (a) 256 MiB sharded device_put


def bench_device_put(libs: dict, settings: Settings, notes: list[str]) -> list[Row]:
    # ``x`` starts 16 bytes past a page boundary, as numpy's own large allocations do, so each
    # shard is too weakly aligned for a CPU client to alias: every cell really copies. (jax 0.10
    # aliases 64-byte-aligned host memory in device_put; the aligned row shows that case.)
    x = aligned_empty(BIG_ELEMENTS + 16)[4:4 + BIG_ELEMENTS]
    x[:] = np.arange(BIG_ELEMENTS, dtype=np.float32)
    reps = settings.transfer_repeats
    gbps = lambda seconds: BIG_BYTES / seconds / 1e9  # noqa: E731

    ref = memcpy_references(x, reps)
    memcpy = gbps(ref["pre"])
    rows = [Row("a", "(a) ref: np.copyto into preallocated 256 MiB (memcpy) [GB/s]", "GB/s",
                {"ref": memcpy}),
            Row("a", "(a) ref: np.empty + np.copyto, 256 MiB (fresh pages) [GB/s]", "GB/s",
                {"ref": gbps(ref["fresh"])})]

    def timed(put, release):
        def shot():
            t0 = perf_ns()
            value = put()
            value.block_until_ready()
            elapsed = perf_ns() - t0
            release(value)
            return elapsed
        return shot

    def check(array, shards_of):
        # Each device holds its own 32 MiB slice (its first and last elements are checked).
        shards = shards_of(array)
        assert len(shards) == NUM_DEVICES, len(shards)
        for index, data in shards:
            start, stop = index[0].start or 0, index[0].stop or BIG_ELEMENTS
            value = np.asarray(data)
            assert value[0] == x[start] and value[-1] == x[stop - 1], index

    copy_shots: dict[str, Callable[[], int]] = {}
    aligned_shots: dict[str, Callable[[], int]] = {}
    x_aligned = aligned_empty(BIG_ELEMENTS)
    np.copyto(x_aligned, x)
    if "jax" in libs:
        jax, sharding = libs["jax"].jax, libs["jax"].sharding
        probe = jax.device_put(x, sharding).block_until_ready()
        check(probe, lambda a: [(s.index, s.data) for s in a.addressable_shards])
        aliased = [s.data.unsafe_buffer_pointer() == x.ctypes.data + (s.index[0].start or 0) * 4
                   for s in probe.addressable_shards]
        probe.delete()
        probe = jax.device_put(x_aligned, sharding).block_until_ready()
        aligned_aliased = [s.data.unsafe_buffer_pointer() ==
                           x_aligned.ctypes.data + (s.index[0].start or 0) * 4
                           for s in probe.addressable_shards]
        probe.delete()
        notes.append(f"jax device_put(x, sharding) aliases host memory: {any(aliased)} "
                     f"(16-byte aligned x); {sum(aligned_aliased)}/8 shards aliased for a "
                     f"page-aligned x")
        copy_shots["jax"] = timed(lambda s=sharding: jax.device_put(x, s), lambda a: a.delete())
        aligned_shots["jax"] = timed(lambda s=sharding: jax.device_put(x_aligned, s),
                                     lambda a: a.delete())
    if "pjrt" in libs:
        pjrt, sharding = libs["pjrt"].pjrt, libs["pjrt"].sharding
        probe = pjrt.device_put(x, sharding).block_until_ready()
        check(probe, lambda a: [(s.index, s.data) for s in a.addressable_shards])
        probe.delete()
        copy_shots["pjrt"] = timed(lambda s=sharding: pjrt.device_put(x, s), lambda a: a.delete())
        aligned_shots["pjrt"] = timed(lambda s=sharding: pjrt.device_put(x_aligned, s),
                                      lambda a: a.delete())

    goal = "pjrt >= 80% of memcpy"
    for label, shots in (
            ("(a) device_put 256 MiB f32 -> NamedSharding(mesh8, P('x')), 16-byte-aligned "
             "source [GB/s]", copy_shots),
            ("(a) same, page-aligned source (jax may alias it) [GB/s]", aligned_shots)):
        medians = one_shot_medians(shots, reps)
        row = Row("a", label, "GB/s", {k: gbps(v) for k, v in medians.items()}, goal=goal)
        if "pjrt" in row.values:
            share = row.values["pjrt"] / memcpy
            shown = f"{share:.0%} of memcpy" if share < 10 else f"{share:.0f}x memcpy: no copy"
            row.status = f"{'met' if share >= 0.8 else 'NOT met'} ({shown})"
        rows.append(row)
    del x, x_aligned
    gc.collect()
    notes.append("(a) GB/s are 10^9 bytes/s of the 256 MiB payload, timed from the call to "
                 "block_until_ready() on the result; each cell is the median of single "
                 "transfers, the result deleted outside the timed part.")
    return rows


# --------------------------------------------------------------------------------------------
# (b) per-call overhead of an 8-device SPMD program


def bench_dispatch(libs: dict, settings: Settings, notes: list[str]) -> list[Row]:
    host = np.arange(NUM_DEVICES, dtype=np.float32)
    expected = host * 2 + 1
    n_calls: dict[str, dict[str, Callable[[int], int]]] = {
        "program": {}, "program_named": {}, "floor": {}, "blocking": {}, "execute_global": {}}

    if "jax" in libs:
        jax, sharding = libs["jax"].jax, libs["jax"].sharding
        f = jax.jit(lambda v: v * 2 + 1, in_shardings=sharding, out_shardings=sharding)
        xj = jax.device_put(host, sharding)
        result = f(xj)
        np.testing.assert_array_equal(np.asarray(result), expected)
        assert result.sharding == sharding and xj.committed

        def jax_calls(n, f=f, x=xj):
            t0 = perf_ns()
            for _ in range(n):
                r = f(x)
            r.block_until_ready()
            return perf_ns() - t0

        def jax_blocking(n, f=f, x=xj):
            t0 = perf_ns()
            for _ in range(n):
                f(x).block_until_ready()
            return perf_ns() - t0

        for key in ("program", "execute_global", "program_named"):
            n_calls[key]["jax"] = jax_calls
        n_calls["blocking"]["jax"] = jax_blocking

    if "pjrt" in libs:
        lib = libs["pjrt"]
        pjrt = lib.pjrt
        compiled = pjrt.compile(SPMD_AFFINE_MLIR, lib.mesh)
        # Placed exactly as the program expects (its own input sharding) ...
        xp = pjrt.device_put(host, compiled.input_shardings[0])
        # ... and with an equivalent NamedSharding (the same layout, another Sharding object).
        xn = pjrt.device_put(host, lib.sharding)
        for argument in (xp, xn):
            result = compiled(argument)
            np.testing.assert_array_equal(np.asarray(result), expected)
            assert str(result.sharding.to_hlo_sharding(1)) == "{devices=[8]<=[8]}"
        assert compiled(xn) is not None and not xn.is_deleted()
        execute_global = compiled.executable.execute_global

        def pjrt_program(n, f=compiled, x=xp):
            t0 = perf_ns()
            for _ in range(n):
                r = f(x)
            r.block_until_ready()
            return perf_ns() - t0

        def pjrt_program_named(n, f=compiled, x=xn):
            t0 = perf_ns()
            for _ in range(n):
                r = f(x)
            r.block_until_ready()
            return perf_ns() - t0

        def pjrt_execute_global(n, execute=execute_global, x=xp):
            arguments = [x]
            t0 = perf_ns()
            for _ in range(n):
                r = execute(arguments)
            r[0].block_until_ready()
            return perf_ns() - t0

        def pjrt_blocking(n, f=compiled, x=xp):
            t0 = perf_ns()
            for _ in range(n):
                f(x).block_until_ready()
            return perf_ns() - t0

        try:
            n_calls["floor"]["pjrt"] = c_floor(lib, compiled, xp, expected)
        except Exception as error:  # noqa: BLE001 - private internals: report, skip the row
            notes.append(f"(b) C floor row skipped ({type(error).__name__}: {error})")
        n_calls["program"]["pjrt"] = pjrt_program
        n_calls["execute_global"]["pjrt"] = pjrt_execute_global
        n_calls["program_named"]["pjrt"] = pjrt_program_named
        n_calls["blocking"]["pjrt"] = pjrt_blocking

    labels = {
        "program": "(b) 8-device SPMD x*2+1, N calls then wait: pjrt CompiledProgram(x), x "
                   "placed with the program's own input sharding [us/call]",
        "execute_global": "(b) same, pjrt executable.execute_global([x]) [us/call]",
        "program_named": "(b) same, x placed with an equal NamedSharding the user built "
                         "(another object) [us/call]",
        "blocking": "(b) CompiledProgram(x), wait on every call [us/call]",
        "floor": "(b) ref: pjrt's C floor, PJRT_LoadedExecutable_Execute + freeing 8 outputs, "
                 "no Python objects, N calls then wait [us/call]",
    }
    #: pjrt/jax at most: the calls a program makes at the floor, and the lower-level entry.
    goals = {"program": 0.9, "program_named": 0.9, "blocking": 1.0, "execute_global": 2.0}
    rows = []
    for key, runs in n_calls.items():
        if not runs:
            continue
        medians = per_call_medians(runs, settings)
        goal = goals.get(key)
        rows.append(Row("b", labels[key], "us", {k: v * 1e6 for k, v in medians.items()},
                        goal="" if goal is None else f"pjrt/jax <= {goal:g}"))
        if goal is not None:
            ratio = rows[-1].ratio("pjrt", "jax")
            rows[-1].status = ("n/a (no jax)" if ratio is None
                               else "met" if ratio <= goal else "NOT met")
    notes.append("(b) jax: jax.jit(lambda v: v * 2 + 1, in_shardings=s, out_shardings=s) with "
                 "s = NamedSharding(mesh8, P('x')), called on a committed array placed with s; "
                 "pjrt: "
                 "pjrt.compile(<the same program, Shardy text>, mesh8) called on an Array "
                 "placed with compiled.input_shardings[0] or (the NamedSharding row) with "
                 "NamedSharding(mesh8, P('x')). The jax cell of each row is the same jax loop, "
                 "measured again next to that row's pjrt loop. The C-floor row drives "
                 "pjrt's private internals (one C launch per call into reused cdata, outputs "
                 "freed in C, no Array objects).")
    return rows


def c_floor(lib, compiled, x, expected) -> Callable[[int], int]:
    """A loop of the bare C launch of ``compiled`` on ``x``'s buffers, and the freeing of
    each call's outputs (pjrt's private internals, as ``profile_execute.py`` uses them): two
    cffi calls per call, what any Python host pays at least."""
    from pjrt._pjrt_cffi import ffi
    from pjrt._pjrt_cffi import lib as c

    executable = compiled.executable
    table = lib.client._handle.api.table
    pointer = executable._live_pointer()
    by_device = dict(zip(x._devices, x._buffers))
    devices = executable._devices
    count = len(devices)
    null = ffi.NULL
    launch, destroy = c.pjrt_shim_execute, c.pjrt_shim_buffers_destroy

    def run(n):
        arguments = ffi.new("PJRT_Buffer*[]", [by_device[d] for d in devices])
        slots = [ffi.new("PJRT_Buffer*[]", count), ffi.new("PJRT_Buffer*[]", count)]
        error = ffi.new("PJRT_Error **")
        previous = None
        t0 = perf_ns()
        for i in range(n):
            outputs = slots[i & 1]  # the previous call's outputs are in the other one
            launch(table, pointer, arguments, count, 1, outputs, 1, null, 0, null, null, error)
            if previous is not None:
                destroy(table, previous, count)
            previous = outputs
        for d in range(count):
            c.pjrt_shim_buffer_await_ready(table, previous[d])
        elapsed = perf_ns() - t0
        assert error[0] == null
        value = np.empty(1, np.float32)
        c.pjrt_shim_buffer_to_host(table, previous[0], ffi.from_buffer(value), 4)
        assert value[0] == expected[0], value   # device 0's shard is x[0:1]
        destroy(table, previous, count)
        return elapsed

    return run


# --------------------------------------------------------------------------------------------
# output


HEADERS = ("measurement", "ref (numpy)", "jax (jaxlib CPU)", "pjrt", "pjrt/jax", "goal",
           "status")


def table_cells(rows: list[Row]) -> list[list[str]]:
    return [[row.label, format_value(row.values.get("ref"), row.unit)]
            + [format_value(row.values.get(lib), row.unit) for lib in LIBS]
            + [format_ratio(row.ratio("pjrt", "jax")), row.goal or "-", row.status or "-"]
            for row in rows]


def render_text(rows: list[Row]) -> str:
    cells = table_cells(rows)
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h)
              for i, h in enumerate(HEADERS)]
    right = {1, 2, 3, 4}

    def line(values):
        return "  ".join(v.rjust(w) if i in right else v.ljust(w)
                         for i, (v, w) in enumerate(zip(values, widths))).rstrip()

    return "\n".join([line(HEADERS), line(["-" * w for w in widths])]
                     + [line(c) for c in table_cells(rows)])


def render_markdown(rows: list[Row]) -> str:
    out = ["| " + " | ".join(HEADERS) + " |",
           "| " + " | ".join(["---"] + ["---:"] * 4 + ["---", "---"]) + " |"]
    out += ["| " + " | ".join(c) + " |" for c in table_cells(rows)]
    return "\n".join(out)


def machine_facts(libs: dict, plugin_path: str) -> list[str]:
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    versions = [libs["pjrt"].version, f"numpy {np.__version__}",
                f"python {platform.python_version()}"]
    if "jax" in libs:
        versions.append(libs["jax"].version)
    try:
        head = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head = ""
    major, minor = libs["pjrt"].api_version
    return [
        f"date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"machine: {cpu_model()}; nproc {affinity} (os.cpu_count {os.cpu_count()}); "
        f"{platform.system()} {platform.release()} {platform.machine()}",
        f"versions: {', '.join(versions)}" + (f" (checkout {head})" if head else ""),
        f"plugin for pjrt: {plugin_path} (PJRT API {major}.{minor}), {NUM_DEVICES} devices; "
        f"jax uses jaxlib's own CPU client with {NUM_DEVICES} devices",
    ]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="fewer and shorter repeats (a CI smoke run)")
    parser.add_argument("--only", default="a,b", help="comma-separated sections: a, b")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--without", default="", help="'jax' to leave jax out")
    parser.add_argument("--plugin", default=None,
                        help="plugin library for pjrt (default: pjrt_cpu.library_path())")
    args = parser.parse_args(argv)
    args.sections = {s.strip() for s in args.only.split(",") if s.strip()}
    if not args.sections or args.sections - {"a", "b"}:
        parser.error(f"--only takes a comma-separated subset of a,b (got {args.only!r})")
    args.without = {s.strip() for s in args.without.split(",") if s.strip()}
    if args.without - {"jax"}:
        parser.error("--without takes jax")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    settings = QUICK if args.quick else Settings()
    if args.plugin is None:
        import pjrt_cpu

        args.plugin = pjrt_cpu.library_path()
    started = time.perf_counter()
    libs, missing = load_libraries(args.plugin, args.without)
    notes: list[str] = ["jax is its own jaxlib CPU client (same XLA CPU runtime, but not the "
                        "xla-cpu-pjrt library that pjrt loads)."]
    rows: list[Row] = []
    if "a" in args.sections:
        rows += bench_device_put(libs, settings, notes)
    if "b" in args.sections:
        rows += bench_dispatch(libs, settings, notes)
    elapsed = time.perf_counter() - started

    print(f"# pjrt sharding benchmarks ({'quick' if args.quick else 'full'} run, "
          f"{elapsed:.0f} s)")
    for fact in machine_facts(libs, args.plugin):
        print(f"# {fact}")
    for line in missing:
        print(f"# SKIPPED {line}")
    print(f"# settings: per-call loops ~{settings.target_s} s x {settings.repeats} repeats; "
          f"{settings.transfer_repeats} transfers per cell; medians. For GB/s higher is "
          f"better, for us lower is better.")
    print()
    print(render_markdown(rows) if args.markdown else render_text(rows))
    print()
    for note in notes:
        print(f"* {note}" if args.markdown else f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

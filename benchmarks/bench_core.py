#!/usr/bin/env python
"""Side-by-side micro-benchmarks of pjrt, jax and pypjrt on XLA's CPU plugin.

One run measures, on the same machine and (for pjrt and pypjrt) the same plugin library,
``pjrt_cpu.library_path()`` from the ``xla-cpu-pjrt`` wheel:

  (a) executing a tiny program (``tanh(a*b+1)`` on 8 float32 values) with its inputs already
      on the device, per call: N back-to-back calls then one wait on the last result, and a
      variant that waits on every call;
  (b) execute + copy the result to the host (``np.asarray``) per call;
  (c) 64 MiB float32 host-to-device and device-to-host throughput, next to ``np.copyto``
      (memcpy bandwidth) measured in the same run;
  (d) import + client creation time and peak RSS, each in fresh subprocesses.

jax does not go through the plugin library: it uses jaxlib's own built-in CPU client (the
same XLA CPU runtime, linked into jaxlib). pypjrt and jax are optional; a missing one is
reported and its columns are left empty.

Usage::

    python benchmarks/bench_core.py                 # full run (about 30 s on 2 cores)
    python benchmarks/bench_core.py --quick         # CI smoke: fewer, shorter repeats (~10 s)
    python benchmarks/bench_core.py --only a,c      # some sections only
    python benchmarks/bench_core.py --markdown      # the table as Markdown (for the README)
    python benchmarks/bench_core.py --without jax   # leave an installed library out

Per-call numbers are medians over repeats of loops sized to about 0.2 s each (0.03 s --quick);
the libraries' repeats are interleaved so that drift in machine speed hits all of them alike.
The garbage collector stays enabled: what a library allocates per call is part of its cost.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

perf_ns = time.perf_counter_ns

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TINY_TANH = os.path.join(REPO, "tests", "fixtures", "tiny_tanh.mlir")

#: 64 MiB of float32 for the transfer benchmarks.
BIG_ELEMENTS = 16 * 1024 * 1024
BIG_BYTES = BIG_ELEMENTS * 4

ADD_ZERO_MLIR = f"""\
module @add_zero attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func public @main(%arg0: tensor<{BIG_ELEMENTS}xf32>) -> tensor<{BIG_ELEMENTS}xf32> {{
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<{BIG_ELEMENTS}xf32>
    %0 = stablehlo.add %arg0, %cst : tensor<{BIG_ELEMENTS}xf32>
    return %0 : tensor<{BIG_ELEMENTS}xf32>
  }}
}}
"""

LIBS = ("jax", "pjrt", "pypjrt")


# --------------------------------------------------------------------------------------------
# settings and results


@dataclass
class Settings:
    target_s: float = 0.2        # one timed loop of a per-call benchmark lasts about this long
    repeats: int = 7             # timed loops per per-call benchmark (median taken)
    transfer_repeats: int = 11   # single 64 MiB transfers per transfer benchmark
    process_repeats: int = 5     # fresh subprocesses per start-up benchmark


QUICK = Settings(target_s=0.03, repeats=3, transfer_repeats=3, process_repeats=2)


@dataclass
class Row:
    section: str
    label: str
    unit: str                                   # "us", "GB/s", "ms", "MiB"
    values: dict = field(default_factory=dict)  # lib -> float (or "ref" for a reference row)
    goal: str = ""
    status: str = ""

    def ratio(self, numerator: str, denominator: str) -> float | None:
        a, b = self.values.get(numerator), self.values.get(denominator)
        if a is None or b is None or b == 0:
            return None
        return a / b


# --------------------------------------------------------------------------------------------
# timing helpers


def calibrate(run: Callable[[int], int], target_s: float) -> int:
    """How many iterations make ``run(n)`` last about ``target_s`` (after one warm-up)."""
    run(1)
    n = 1
    while True:
        elapsed = run(n) / 1e9
        if elapsed >= min(0.02, target_s / 2):
            return max(1, int(n * target_s / elapsed))
        n *= 4 if elapsed < 0.002 else 2


def per_call_medians(runs: dict[str, Callable[[int], int]], settings: Settings) -> dict[str, float]:
    """Median seconds per iteration of each ``run(n)`` (which returns elapsed ns for n calls).

    Each run is warmed up and calibrated, then the timed loops of all runs are interleaved.
    """
    sizes = {name: calibrate(run, settings.target_s) for name, run in runs.items()}
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(settings.repeats):
        for name, run in runs.items():
            n = sizes[name]
            samples[name].append(run(n) / 1e9 / n)
    return {name: statistics.median(values) for name, values in samples.items()}


def one_shot_medians(shots: dict[str, Callable[[], int]], repeats: int) -> dict[str, float]:
    """Median seconds of each ``shot()`` (which returns the ns of its timed part), interleaved."""
    for _ in range(2):  # warm-ups: first transfers pay one-off costs (allocator, thread pools)
        for shot in shots.values():
            shot()
    samples: dict[str, list[float]] = {name: [] for name in shots}
    for _ in range(repeats):
        for name, shot in shots.items():
            samples[name].append(shot() / 1e9)
    return {name: statistics.median(values) for name, values in samples.items()}



def memcpy_references(x: np.ndarray, repeats: int) -> dict:
    """Median seconds of copying ``x`` into a preallocated, faulted-in array ("pre": memcpy
    bandwidth) and into a fresh one ("fresh": memcpy plus the page faults every transfer into
    new memory pays)."""
    destination = np.empty_like(x)
    np.copyto(destination, x)  # fault the pages in once

    def copyto_preallocated():
        t0 = perf_ns()
        np.copyto(destination, x)
        return perf_ns() - t0

    def copyto_fresh():
        t0 = perf_ns()
        fresh = np.empty_like(x)
        np.copyto(fresh, x)
        elapsed = perf_ns() - t0
        del fresh
        return elapsed

    return one_shot_medians({"pre": copyto_preallocated, "fresh": copyto_fresh}, repeats)


def aligned_empty(n: int, dtype=np.float32, alignment: int = 4096) -> np.ndarray:
    """An uninitialised 1-D array whose data starts on an ``alignment`` boundary.

    XLA's CPU client can only alias (zero-copy) host memory that is suitably aligned; numpy's
    own large allocations start 16 bytes into a page, so without this every "zero-copy" path
    would silently copy.
    """
    itemsize = np.dtype(dtype).itemsize
    raw = np.empty(n * itemsize + alignment, dtype=np.uint8)
    offset = (-raw.ctypes.data) % alignment
    return raw[offset:offset + n * itemsize].view(dtype)


# --------------------------------------------------------------------------------------------
# the three libraries


class Pjrt:
    name = "pjrt"

    def __init__(self, plugin_path: str):
        import pjrt

        self.pjrt = pjrt
        plugin = pjrt.load_pjrt_plugin_dynamically("bench_cpu", plugin_path)
        self.api_version = plugin.api_version
        self.client = pjrt.make_c_api_client("bench_cpu")
        self.device = self.client.local_devices()[0]

    def compile(self, text: str):
        return self.client.compile_and_load(text, [self.device])

    def put(self, x: np.ndarray, semantics=None):
        if semantics is None:
            return self.client.buffer_from_pyval(x, self.device)
        return self.client.buffer_from_pyval(x, self.device, host_buffer_semantics=semantics)


class Jax:
    name = "jax"

    def __init__(self):
        import jax
        import jax.numpy as jnp
        import jaxlib

        self.jax, self.jnp = jax, jnp
        self.version = f"jax {jax.__version__}, jaxlib {jaxlib.__version__}"
        self.device = jax.devices("cpu")[0]


class Pypjrt:
    name = "pypjrt"

    def __init__(self, plugin_path: str):
        import pypjrt
        from pypjrt.typing import F32

        self.pypjrt = pypjrt
        self.F32 = F32
        self.plugin = pypjrt.Plugin(plugin_path)
        self.client = pypjrt.Client.create(self.plugin)
        self._stack = contextlib.ExitStack()
        self.device = self._stack.enter_context(self.client.device(0))
        self.version = f"pypjrt {pypjrt.__version__}"

    def compile(self, text: str):
        return self.client.compile(text)

    def put(self, x: np.ndarray):
        return self.client.buffer_from_host(x, self.F32.code, list(x.shape), self.device)

    def close(self):
        self._stack.close()
        self.client.close()


def load_libraries(plugin_path: str, without: set[str]) -> tuple[dict, list[str]]:
    """The libraries that load, and a line for each that does not."""
    libs: dict = {}
    missing: list[str] = []
    libs["pjrt"] = Pjrt(plugin_path)  # required: let it raise
    if "jax" in without:
        missing.append("jax: skipped (--without)")
    else:
        try:
            libs["jax"] = Jax()
        except Exception as error:  # noqa: BLE001 - reported, and the column is skipped
            missing.append(f"jax: not available ({type(error).__name__}: {error}); "
                           f"its columns are skipped")
    if "pypjrt" in without:
        missing.append("pypjrt: skipped (--without)")
    else:
        try:
            libs["pypjrt"] = Pypjrt(plugin_path)
        except Exception as error:  # noqa: BLE001
            missing.append(f"pypjrt: not available ({type(error).__name__}: {error}); "
                           f"its columns are skipped")
    return libs, missing


# --------------------------------------------------------------------------------------------
# (a) and (b): a tiny program per call


def tiny_inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32))


def bench_execute(libs: dict, settings: Settings, notes: list[str],
                  sections: set[str]) -> list[Row]:
    a_host, b_host = tiny_inputs()
    expected = np.tanh(a_host * b_host + 1)
    text = open(TINY_TANH).read()

    dispatch: dict[str, Callable[[int], int]] = {}
    blocking: dict[str, Callable[[int], int]] = {}
    to_host: dict[str, Callable[[int], int]] = {}

    if "jax" in libs:
        jax, jnp = libs["jax"].jax, libs["jax"].jnp
        f = jax.jit(lambda a, b: jnp.tanh(a * b + 1))
        ja = jax.device_put(a_host, libs["jax"].device)
        jb = jax.device_put(b_host, libs["jax"].device)
        np.testing.assert_allclose(np.asarray(f(ja, jb)), expected, rtol=1e-6)

        def jax_dispatch(n, f=f, a=ja, b=jb):
            t0 = perf_ns()
            for _ in range(n):
                r = f(a, b)
            r.block_until_ready()
            return perf_ns() - t0

        def jax_blocking(n, f=f, a=ja, b=jb):
            t0 = perf_ns()
            for _ in range(n):
                f(a, b).block_until_ready()
            return perf_ns() - t0

        def jax_to_host(n, f=f, a=ja, b=jb, asarray=np.asarray):
            t0 = perf_ns()
            for _ in range(n):
                asarray(f(a, b))
            return perf_ns() - t0

        dispatch["jax"], blocking["jax"], to_host["jax"] = jax_dispatch, jax_blocking, jax_to_host

    if "pjrt" in libs:
        lib = libs["pjrt"]
        executable = lib.compile(text)
        pa, pb = lib.put(a_host), lib.put(b_host)
        np.testing.assert_allclose(np.asarray(executable.execute([pa, pb])[0]), expected, rtol=1e-6)

        def pjrt_dispatch(n, execute=executable.execute, a=pa, b=pb):
            t0 = perf_ns()
            for _ in range(n):
                r = execute([a, b])
            r[0].block_until_ready()
            return perf_ns() - t0

        def pjrt_blocking(n, execute=executable.execute, a=pa, b=pb):
            t0 = perf_ns()
            for _ in range(n):
                execute([a, b])[0].block_until_ready()
            return perf_ns() - t0

        def pjrt_to_host(n, execute=executable.execute, a=pa, b=pb, asarray=np.asarray):
            t0 = perf_ns()
            for _ in range(n):
                asarray(execute([a, b])[0])
            return perf_ns() - t0

        dispatch["pjrt"], blocking["pjrt"], to_host["pjrt"] = pjrt_dispatch, pjrt_blocking, pjrt_to_host

    if "pypjrt" in libs:
        lib = libs["pypjrt"]
        executable = lib.compile(text)
        qa, qb = lib.put(a_host), lib.put(b_host)
        check = np.empty(8, np.float32)
        out = executable(qa, qb)[0]
        out.to_host(check)
        out.close()
        np.testing.assert_allclose(check, expected, rtol=1e-6)

        # pypjrt's execute waits for the program to finish before it returns (it awaits the
        # device-complete events), so "dispatch" and "blocking" are the same code for it.
        # Outputs are closed explicitly: pypjrt's documented way to free a Buffer (its
        # finaliser frees it too, but warns).
        def pypjrt_call(n, call=executable, a=qa, b=qb):
            t0 = perf_ns()
            for _ in range(n):
                call(a, b)[0].close()
            return perf_ns() - t0

        def pypjrt_to_host(n, call=executable, a=qa, b=qb, empty=np.empty, f32=np.float32):
            t0 = perf_ns()
            for _ in range(n):
                o = call(a, b)[0]
                o.to_host(empty(8, f32))
                o.close()
            return perf_ns() - t0

        dispatch["pypjrt"], blocking["pypjrt"], to_host["pypjrt"] = (pypjrt_call, pypjrt_call,
                                                                     pypjrt_to_host)
        notes.append("pypjrt's execute always waits for the program to finish (it awaits the "
                     "device-complete events) and outputs are freed with Buffer.close(); its "
                     "(a) rows are therefore the same measurement.")

    rows = []
    if "a" in sections:
        for label, runs in (("(a) execute, N calls then wait on last [us/call]", dispatch),
                            ("(a) execute, wait on every call [us/call]", blocking)):
            medians = per_call_medians(runs, settings)
            rows.append(Row("a", label, "us", {k: v * 1e6 for k, v in medians.items()}))
    if "b" in sections:
        medians = per_call_medians(to_host, settings)
        rows.append(Row("b", "(b) execute + np.asarray(result) [us/call]", "us",
                        {k: v * 1e6 for k, v in medians.items()}))
        for size in FRESH_READ_SIZES:
            medians = per_call_medians(fresh_reads(libs, size), settings)
            rows.append(Row("b", f"(b) np.asarray of a fresh computed {size}-float result "
                                 f"[us/read]", "us", {k: v * 1e6 for k, v in medians.items()}))
    return rows


#: Result sizes (float32 elements) of the fresh-read rows: jaxlib reads both through the buffer
#: protocol, as a view of the buffer.
FRESH_READ_SIZES = (8, 4096)


def fresh_reads(libs: dict, size: int) -> dict[str, Callable[[int], int]]:
    """Per library, a run timing ``np.asarray`` alone of ``n`` results of ``tanh(a * b + 1)``
    on ``size`` floats, each computed and waited for before the timed loop."""
    rng = np.random.default_rng(1)
    a_host = rng.standard_normal(size).astype(np.float32)
    b_host = rng.standard_normal(size).astype(np.float32)
    expected = np.tanh(a_host * b_host + 1)
    runs: dict[str, Callable[[int], int]] = {}

    def timed(produce, chunk=500):
        # In chunks, so that a calibrated loop of many reads does not hold its results at once.
        def run(n, asarray=np.asarray):
            elapsed = 0
            for start in range(0, n, chunk):
                results = [produce() for _ in range(min(chunk, n - start))]
                for result in results:
                    result.block_until_ready()
                t0 = perf_ns()
                for result in results:
                    asarray(result)
                elapsed += perf_ns() - t0
            return elapsed
        return run

    if "jax" in libs:
        jax, jnp = libs["jax"].jax, libs["jax"].jnp
        f = jax.jit(lambda a, b: jnp.tanh(a * b + 1))
        ja = jax.device_put(a_host, libs["jax"].device)
        jb = jax.device_put(b_host, libs["jax"].device)
        np.testing.assert_allclose(np.asarray(f(ja, jb)), expected, rtol=1e-5, atol=1e-6)
        runs["jax"] = timed(lambda: f(ja, jb))
    if "pjrt" in libs:
        lib = libs["pjrt"]
        executable = lib.compile(open(TINY_TANH).read().replace("8xf32", f"{size}xf32"))
        pa, pb = lib.put(a_host), lib.put(b_host)
        np.testing.assert_allclose(np.asarray(executable.execute([pa, pb])[0]), expected,
                                   rtol=1e-5, atol=1e-6)
        runs["pjrt"] = timed(lambda: executable.execute([pa, pb])[0])
    return runs


# --------------------------------------------------------------------------------------------
# (c) 64 MiB transfers


def bench_transfers(libs: dict, settings: Settings, notes: list[str]) -> list[Row]:
    # Two copies of the same 64 MiB: ``x`` starts 16 bytes past a 4096-byte boundary, as numpy's
    # own large allocations do, so no library can alias it and every H2D "copy" cell really
    # copies (jax 0.10's device_put aliases aligned host memory even with may_alias=False);
    # ``x_aligned`` is page-aligned, for the zero-copy row.
    x = aligned_empty(BIG_ELEMENTS + 16)[4:4 + BIG_ELEMENTS]
    x[:] = np.arange(BIG_ELEMENTS, dtype=np.float32)
    x_aligned = aligned_empty(BIG_ELEMENTS)
    np.copyto(x_aligned, x)
    reps = settings.transfer_repeats
    gbps = lambda seconds: BIG_BYTES / seconds / 1e9  # noqa: E731

    ref = memcpy_references(x, reps)
    memcpy = gbps(ref["pre"])
    rows = [Row("c", "(c) ref: np.copyto into preallocated array (memcpy) [GB/s]", "GB/s",
                {"ref": memcpy}),
            Row("c", "(c) ref: np.empty + np.copyto (fresh pages) [GB/s]", "GB/s",
                {"ref": gbps(ref["fresh"])})]

    h2d_copy: dict[str, Callable[[], int]] = {}
    h2d_alias: dict[str, Callable[[], int]] = {}
    d2h: dict[str, Callable[[], int]] = {}
    d2h_copy: dict[str, Callable[[], int]] = {}
    aliasing: list[str] = []

    def timed(make, wait, release):
        """A shot timing ``wait(make())``; the result is released outside the timed part."""
        def shot():
            t0 = perf_ns()
            value = make()
            wait(value)
            elapsed = perf_ns() - t0
            release(value)
            return elapsed
        return shot

    def fresh_read(produce, read, release):
        """A shot timing ``read(y)`` of a fresh on-device ``y`` made outside the timed part."""
        def shot():
            y = produce()
            t0 = perf_ns()
            host = read(y)
            elapsed = perf_ns() - t0
            assert host[12345] == 12345.0
            del host
            release(y)
            return elapsed
        return shot

    if "jax" in libs:
        jax = libs["jax"].jax
        device = libs["jax"].device
        ready = lambda y: y.block_until_ready()  # noqa: E731
        drop = lambda y: y.delete()  # noqa: E731
        for source, name in ((x, "x (16-byte aligned)"), (x_aligned, "x_aligned")):
            probe = jax.device_put(source, device)
            aliasing.append(f"jax device_put({name}) aliases it: "
                            f"{probe.unsafe_buffer_pointer() == source.ctypes.data}")
            probe.delete()
        h2d_copy["jax"] = timed(lambda: jax.device_put(x, device), ready, drop)
        h2d_alias["jax"] = timed(lambda: jax.device_put(x_aligned, device), ready, drop)
        jax_add_zero = jax.jit(lambda v: v + 0)
        xj = jax.device_put(x, device)
        jax_produce = lambda: jax_add_zero(xj).block_until_ready()  # noqa: E731
        probe = jax_produce()
        view = np.asarray(probe)
        aliasing.append(f"jax np.asarray(y) is a view of the device buffer: "
                        f"{view.ctypes.data == probe.unsafe_buffer_pointer()}")
        del view
        probe.delete()
        d2h["jax"] = fresh_read(jax_produce, np.asarray, drop)
        d2h_copy["jax"] = fresh_read(jax_produce, lambda y: np.array(y, copy=True), drop)
        notes.append("jax (c) rows: jax.device_put(x) copies x (16-byte aligned, like numpy's own "
                     "allocations) and aliases x_aligned (page-aligned); jax on CPU returns a view "
                     "of the device buffer from np.asarray, so its first D2H row copies nothing.")

    if "pjrt" in libs:
        pjrt_lib = libs["pjrt"]
        zero_copy = pjrt_lib.pjrt.HostBufferSemantics.ZERO_COPY
        ready = lambda y: y.block_until_ready()  # noqa: E731
        drop = lambda y: y.delete()  # noqa: E731
        probe = pjrt_lib.put(x_aligned, zero_copy)
        aliasing.append(f"pjrt buffer_from_pyval(x_aligned, ZERO_COPY) aliases it: "
                        f"{probe.unsafe_buffer_pointer() == x_aligned.ctypes.data}")
        probe.delete()
        h2d_copy["pjrt"] = timed(lambda: pjrt_lib.put(x), ready, drop)
        h2d_alias["pjrt"] = timed(lambda: pjrt_lib.put(x_aligned, zero_copy), ready, drop)
        pjrt_add_zero = pjrt_lib.compile(ADD_ZERO_MLIR)
        xp = pjrt_lib.put(x)
        pjrt_produce = lambda: pjrt_add_zero.execute([xp])[0].block_until_ready()  # noqa: E731
        d2h["pjrt"] = fresh_read(pjrt_produce, np.asarray, drop)
        # On CPU plugins np.asarray is a view (as in jax); time an actual copy as well.
        d2h_copy["pjrt"] = fresh_read(pjrt_produce, lambda y: np.array(y, copy=True), drop)

    if "pypjrt" in libs:
        pypjrt_lib = libs["pypjrt"]
        close = lambda y: y.close()  # noqa: E731
        nothing = lambda y: None  # noqa: E731
        h2d_copy["pypjrt"] = timed(lambda: pypjrt_lib.put(x), nothing, close)
        try:
            probe = pypjrt_lib.client.from_dlpack(x_aligned)
            aliasing.append(f"pypjrt from_dlpack(x_aligned) aliases it: "
                            f"{probe.unsafe_pointer() == x_aligned.ctypes.data}")
            probe.close()
            h2d_alias["pypjrt"] = timed(lambda: pypjrt_lib.client.from_dlpack(x_aligned), nothing,
                                        close)
        except Exception as error:  # noqa: BLE001
            notes.append(f"pypjrt from_dlpack(x) failed ({type(error).__name__}: {error}); "
                         f"its zero-copy cell is empty")
        pypjrt_add_zero = pypjrt_lib.compile(ADD_ZERO_MLIR)
        xq = pypjrt_lib.put(x)

        def read(y):
            host = np.empty(BIG_ELEMENTS, np.float32)
            y.to_host(host)
            return host

        d2h["pypjrt"] = fresh_read(lambda: pypjrt_add_zero(xq)[0], read, close)
        d2h_copy["pypjrt"] = d2h["pypjrt"]
        notes.append("pypjrt (c) rows: buffer_from_host (it always copies; its Event is awaited "
                     "inside), from_dlpack(x) as its zero-copy path, and Buffer.to_host into a "
                     "new np.empty for the read.")

    goal = "pjrt >= 80% of memcpy"
    for label, shots in (
            ("(c) H2D copy: jax device_put / pjrt buffer_from_pyval / pypjrt buffer_from_host [GB/s]",
             h2d_copy),
            ("(c) H2D zero-copy: jax device_put(x) / pjrt ZERO_COPY / pypjrt from_dlpack [GB/s]",
             h2d_alias),
            ("(c) D2H np.asarray of a fresh array (jax: a view, no copy) [GB/s]", d2h),
            ("(c) D2H with a real copy (jax, pjrt: np.array(y, copy=True)) [GB/s]", d2h_copy)):
        # The rows sharing a shot measure it separately, so each row's columns are of one pass.
        medians = one_shot_medians(shots, reps)
        row = Row("c", label, "GB/s", {k: gbps(v) for k, v in medians.items()}, goal=goal)
        if "pjrt" in row.values:
            share = row.values["pjrt"] / memcpy
            shown = f"{share:.0%} of memcpy" if share < 10 else f"{share:.0f}x memcpy: no copy"
            row.status = f"{'met' if share >= 0.8 else 'NOT met'} ({shown})"
        rows.append(row)
    notes.extend(aliasing)
    notes.append("(c) GB/s are 10^9 bytes/s of the 64 MiB payload; each cell is the median of "
                 "single transfers, the result freed outside the timed part. Device buffers are "
                 "new allocations, so a copy into one pays page faults; the second ref row "
                 "(np.empty + np.copyto) is memcpy with the same handicap.")
    gc.collect()
    return rows


# --------------------------------------------------------------------------------------------
# (d) start-up in fresh processes

_STARTUP_PREFIX = "import time,resource; t=time.perf_counter(); "
# Peak RSS is VmHWM, the high-water mark of this process image. ru_maxrss is not usable here: on
# Linux a child keeps the RSS high-water mark of the process it was forked from across exec, so
# every probe started by this (large) benchmark process would report the benchmark's own RSS.
_STARTUP_SUFFIX = ("; print(time.perf_counter()-t, "
                   "next((int(l.split()[1]) for l in open('/proc/self/status') "
                   "if l.startswith('VmHWM:')), None) "
                   "or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")


def startup_programs(plugin_path: str, libs_present: set[str]) -> dict[str, str]:
    """The body of each start-up probe: imports and client creation, nothing else."""
    programs = {"ref": "import numpy"}
    programs["pjrt"] = ("import pjrt, pjrt_cpu; "
                        "pjrt.load_pjrt_plugin_dynamically('cpu', pjrt_cpu.library_path()); "
                        "c = pjrt.make_c_api_client('cpu'); c.local_devices()")
    if "jax" in libs_present:
        programs["jax"] = "import jax; jax.devices()"
    if "pypjrt" in libs_present:
        programs["pypjrt"] = (f"import pypjrt; c = pypjrt.Client.create(pypjrt.Plugin({plugin_path!r})); "
                              f"c.device_count")
    return programs


def probe(body: str, preload: str, env: dict) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of one fresh process running ``body`` after ``preload``."""
    program = preload + _STARTUP_PREFIX + body + _STARTUP_SUFFIX
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"start-up probe failed: {program}\n{done.stderr}")
    seconds, rss_kib = done.stdout.split()[-2:]
    return float(seconds), int(rss_kib) / 1024


def bench_startup(plugin_path: str, libs_present: set[str], settings: Settings,
                  notes: list[str]) -> list[Row]:
    programs = startup_programs(plugin_path, libs_present)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    # Cold: as the goal is stated. Warm numpy: numpy imported before the clock starts, as in
    # any program that already uses numpy (pypjrt alone does not import it; pjrt does).
    variants = (("", "(d) import + client creation, fresh process [ms]",
                 "(d) peak RSS after client creation (VmHWM) [MiB]"),
                ("import numpy; ", "(d) same, numpy imported before the clock starts [ms]",
                 "(d) same, numpy imported first: peak RSS (VmHWM) [MiB]"))
    rows = []
    for preload, time_label, rss_label in variants:
        bodies = {name: body for name, body in programs.items() if not (preload and name == "ref")}
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in bodies}
        for _ in range(settings.process_repeats):
            for name, body in bodies.items():
                samples[name].append(probe(body, preload, env))
        times = {name: statistics.median(s for s, _ in values) * 1e3
                 for name, values in samples.items()}
        rss = {name: statistics.median(r for _, r in values) for name, values in samples.items()}
        goal = "pjrt <= pypjrt" if not preload else ""
        rows += [Row("d", time_label, "ms", times, goal=goal),
                 Row("d", rss_label, "MiB", rss, goal=goal)]
    for row in rows:
        if not row.goal:
            continue
        ratio = row.ratio("pjrt", "pypjrt")
        row.status = ("n/a (no pypjrt)" if ratio is None else "met" if ratio <= 1.0 else "NOT met")
    notes.append("(d) each probe is a fresh `python -c` timed from before its imports to after "
                 "the client exists (ref = `import numpy` alone): "
                 + "; ".join(f"{name}: `{body}`" for name, body in programs.items())
                 + ". The second pair of rows imports numpy before the clock starts.")
    return rows


# --------------------------------------------------------------------------------------------
# goals and output


def judge_execute(rows: list[Row]) -> None:
    for row in rows:
        if row.section != "a":
            continue
        row.goal = "pjrt/jax <= 2; pjrt/pypjrt <= 0.2"
        verdicts = []
        for other, limit in (("jax", 2.0), ("pypjrt", 0.2)):
            ratio = row.ratio("pjrt", other)
            verdicts.append("n/a" if ratio is None else ("met" if ratio <= limit else "NOT met"))
        if all(v == "met" for v in verdicts):
            row.status = "met"
        else:
            row.status = f"vs jax: {verdicts[0]}; vs pypjrt: {verdicts[1]}"


def format_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "us":
        return f"{value:.2f}" if value < 100 else f"{value:.0f}"
    if unit == "GB/s":
        return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 1000 else f"{value:.0f}"
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def format_ratio(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 0.1:
        return f"{value:.2g}x"
    return f"{value:.2f}x" if value < 100 else f"{value:.0f}x"


HEADERS = ("measurement", "ref (numpy)", "jax (jaxlib CPU)", "pjrt", "pypjrt", "pjrt/jax",
           "pjrt/pypjrt", "goal", "status")


def table_cells(rows: list[Row]) -> list[list[str]]:
    cells = []
    for row in rows:
        cells.append([row.label, format_value(row.values.get("ref"), row.unit)]
                     + [format_value(row.values.get(lib), row.unit) for lib in LIBS]
                     + [format_ratio(row.ratio("pjrt", "jax")), format_ratio(row.ratio("pjrt", "pypjrt")),
                        row.goal or "-", row.status or "-"])
    return cells


def render_text(rows: list[Row]) -> str:
    cells = table_cells(rows)
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h)
              for i, h in enumerate(HEADERS)]
    right = {1, 2, 3, 4, 5, 6}

    def line(values):
        return "  ".join(v.rjust(w) if i in right else v.ljust(w)
                         for i, (v, w) in enumerate(zip(values, widths))).rstrip()

    out = [line(HEADERS), line(["-" * w for w in widths])]
    out += [line(c) for c in cells]
    return "\n".join(out)


def render_markdown(rows: list[Row]) -> str:
    cells = table_cells(rows)
    out = ["| " + " | ".join(HEADERS) + " |",
           "| " + " | ".join(["---"] + ["---:"] * 6 + ["---", "---"]) + " |"]
    out += ["| " + " | ".join(c) + " |" for c in cells]
    return "\n".join(out)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_facts(libs: dict, plugin_path: str) -> list[str]:
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    versions = [f"numpy {np.__version__}", f"python {platform.python_version()}"]
    import pjrt

    versions.insert(0, f"pjrt {pjrt.__version__}")
    for name in ("jax", "pypjrt"):
        if name in libs:
            versions.append(libs[name].version)
    major, minor = libs["pjrt"].api_version
    try:
        head = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head = ""
    versions.append(f"pjrt imported from {os.path.dirname(pjrt.__file__)}"
                    + (f" (checkout at {head})" if head else ""))
    return [
        f"date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"machine: {cpu_model()}; nproc {affinity} (os.cpu_count {os.cpu_count()}); "
        f"{platform.system()} {platform.release()} {platform.machine()}",
        f"versions: {', '.join(versions)}",
        f"plugin for pjrt and pypjrt: {plugin_path} (PJRT API {major}.{minor}); "
        f"jax uses jaxlib's own built-in CPU client, not this library",
    ]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="fewer and shorter repeats (a CI smoke run, a few seconds)")
    parser.add_argument("--only", default="a,b,c,d",
                        help="comma-separated sections to run, of a,b,c,d (default: all)")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--without", default="",
                        help="comma-separated libraries to leave out even if installed "
                             "(jax, pypjrt); pjrt always runs")
    parser.add_argument("--plugin", default=None,
                        help="plugin library for pjrt and pypjrt (default: pjrt_cpu.library_path())")
    args = parser.parse_args(argv)
    args.sections = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = args.sections - set("abcd")
    if unknown or not args.sections:
        parser.error(f"--only takes a comma-separated subset of a,b,c,d (got {args.only!r})")
    args.without = {s.strip() for s in args.without.split(",") if s.strip()}
    if args.without - {"jax", "pypjrt"}:
        parser.error("--without takes jax and/or pypjrt")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    settings = QUICK if args.quick else Settings()
    if args.plugin is None:
        import pjrt_cpu

        args.plugin = pjrt_cpu.library_path()
    started = time.perf_counter()
    libs, missing = load_libraries(args.plugin, args.without)
    notes: list[str] = ["jax is always its own jaxlib CPU client (same XLA CPU runtime, but not "
                        "the xla-cpu-pjrt library that pjrt and pypjrt load)."]
    rows: list[Row] = []
    if args.sections & {"a", "b"}:
        rows += bench_execute(libs, settings, notes, args.sections)
        judge_execute(rows)
    if "c" in args.sections:
        rows += bench_transfers(libs, settings, notes)
    if "d" in args.sections:
        rows += bench_startup(args.plugin, set(libs), settings, notes)
    elapsed = time.perf_counter() - started

    if "pypjrt" in libs:
        libs["pypjrt"].close()

    mode = "quick" if args.quick else "full"
    print(f"# pjrt core benchmarks ({mode} run, {elapsed:.0f} s)")
    for fact in machine_facts(libs, args.plugin):
        print(f"# {fact}")
    for line in missing:
        print(f"# SKIPPED {line}")
    print(f"# settings: per-call loops ~{settings.target_s} s x {settings.repeats} repeats; "
          f"{settings.transfer_repeats} transfers per cell; {settings.process_repeats} fresh "
          f"processes per cell; medians. Ratios divide the row's values (for GB/s higher is "
          f"better, otherwise lower is better).")
    print()
    print(render_markdown(rows) if args.markdown else render_text(rows))
    print()
    for note in notes:
        print(f"* {note}" if args.markdown else f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

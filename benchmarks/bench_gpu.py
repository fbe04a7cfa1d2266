#!/usr/bin/env python
"""pjrt next to jax on one device of one platform, in one process: an NVIDIA GPU with
``--platform cuda`` (both libraries drive the CUDA plugin library of the jax-cudaNN-pjrt wheel),
or the CPU with ``--platform cpu`` (pjrt loads pjrt_cpu's plugin, jax uses jaxlib's built-in
CPU client), so that the script runs, and is tested, anywhere.

  (a) a tiny program (``tanh(a*b+1)`` on 8 float32) with its inputs on the device, per call:
      N calls then one wait on the last result, and a wait on every call;
  (b) the same with a read of every result (``np.asarray``);
  (c) 256 MiB of float32 host-to-device and device-to-host, in GB/s: from and to pageable host
      memory (a numpy array; the read is ``np.asarray``), and from and to the device's
      ``pinned_host`` memory where it has one (pjrt: ``Array.copy_to_memory``; jax:
      ``device_put`` to a ``memory_kind="pinned_host"`` sharding), "n/a" where it has none;
  (d) a 1 GiB upload streamed in 64 MiB chunks through pjrt's TransferManager (the
      ``put_streamed`` shot of bench_streaming.py), next to ``device_put`` of the whole input;
  (e) one training step of an MLP with Adam (3 hidden layers of 1024, batch 256): jax jits the
      step, pjrt compiles the StableHLO text jax lowers it to, so both run the same program;
      their losses over three steps must agree, and the first must equal numpy's.

pypjrt, where installed, joins (a) and (b) on the plugin library pjrt loads. jax and pypjrt are
optional: a missing one is reported in a ``# SKIPPED`` line and its cells are left empty.

Usage::

    python benchmarks/bench_gpu.py --platform cuda           # on a GPU (about a minute)
    python benchmarks/bench_gpu.py --platform cpu --quick    # anywhere (about 20 s on 2 cores)
    python benchmarks/bench_gpu.py --only a,e                # some sections (of a, b, c, d, e)
    python benchmarks/bench_gpu.py --markdown                # the table as Markdown
    python benchmarks/bench_gpu.py --without jax,pypjrt      # pjrt alone
    python benchmarks/bench_gpu.py --platform cpu --plugin PATH   # another CPU plugin build

``--quick`` moves 16 MiB in (c) and streams 64 MiB in 16 MiB chunks in (d), with fewer and
shorter repeats. Per-call cells are medians over repeats of loops sized to about 0.2 s
(0.03 s quick), transfer cells medians of single transfers; the libraries' repeats are
interleaved so that drift in machine speed hits them alike. A cell that is not a number says
why in the row's notes: "n/a" (the device lacks what the row needs), "skip" (this run cannot
measure it) or "error" (the measurement failed). Exit status 1 when a cell is "error" or the
MLP losses disagree; the table is printed either way.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import importlib.metadata
import os
import platform as host_platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import bench_core  # noqa: E402
from bench_core import (REPO, TINY_TANH, aligned_empty, cpu_model, one_shot_medians,  # noqa: E402
                        per_call_medians)

perf_ns = time.perf_counter_ns

SECTIONS = "abcde"
OPTIONAL_LIBS = ("jax", "pypjrt")

#: Distributions whose versions the header names, where installed.
DISTRIBUTIONS = ("pjrt-cuda", "jax-cuda13-pjrt", "jax-cuda13-plugin", "jax-cuda12-pjrt",
                 "jax-cuda12-plugin", "xla-cpu-pjrt")


@dataclass
class Settings(bench_core.Settings):
    """bench_core's per-call settings (target_s, repeats), and the sizes of (c) and (d)."""
    transfer_mib: int = 256       # (c)
    transfer_repeats: int = 7     # single transfers per (c) cell, after 2 warm-ups
    stream_mib: int = 1024        # (d): the whole upload
    chunk_mib: int = 64           # (d): one chunk
    stream_repeats: int = 3       # single uploads per (d) cell, after 1 warm-up


QUICK = Settings(target_s=0.03, repeats=3, transfer_mib=16, transfer_repeats=3, stream_mib=64,
                 chunk_mib=16, stream_repeats=2)

NOT_A_NUMBER = ("n/a", "skip", "error")


@dataclass
class Row:
    label: str
    unit: str                                    # "us", "ms", "GB/s"
    values: dict = field(default_factory=dict)   # lib -> float, or one of NOT_A_NUMBER
    notes: list = field(default_factory=list)    # why a cell is not a number; checks made

    def mark(self, lib: str, kind: str, reason: str) -> None:
        assert kind in NOT_A_NUMBER, kind
        self.values[lib] = kind
        self.notes.append(f"{lib} {kind}: {reason}")

    def ratio(self, numerator: str, denominator: str) -> float | None:
        a, b = self.values.get(numerator), self.values.get(denominator)
        if not isinstance(a, float) or not isinstance(b, float) or b == 0:
            return None
        return a / b


def describe(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:300]}"


def mark_all(rows: list[Row], lib: str, kind: str, reason: str) -> None:
    for row in rows:
        row.mark(lib, kind, reason)


def fill(row: Row, runs: dict, measure: Callable[[dict], dict],
         scale: Callable[[float], float]) -> None:
    """Put ``scale`` of each median ``measure(runs)`` returns into ``row``; a failure of the
    interleaved run (which holds the shots of every library in ``runs``) marks each of them
    as an error."""
    try:
        medians = measure(runs)
    except Exception as error:  # noqa: BLE001 - reported in the row, the run goes on
        for lib in runs:
            row.mark(lib, "error", describe(error))
        return
    for lib, seconds in medians.items():
        row.values[lib] = scale(seconds)


# --------------------------------------------------------------------------------------------
# the libraries, each on device 0 of the platform


class Pjrt:
    name = "pjrt"

    def __init__(self, platform: str, plugin_path: str | None = None):
        import pjrt

        self.pjrt = pjrt
        if plugin_path:  # another build of the CPU plugin
            plugin = pjrt.load_pjrt_plugin_dynamically(f"bench_{platform}", plugin_path)
            self.client = pjrt.make_c_api_client(plugin.name)
        else:
            pjrt.set_platforms(platform)
            self.client = pjrt.get_backend(platform)
        self.device = self.client.local_devices()[0]
        self.memory = self.device.default_memory()
        self.version = f"pjrt {pjrt.__version__}"

    def compile(self, text: str):
        return self.client.compile_and_load(text, [self.device])

    def put(self, x: np.ndarray, memory=None):
        return self.client.buffer_from_pyval(x, self.device, memory=memory)

    def memory_kinds(self) -> list[str]:
        return [m.kind for m in self.device.addressable_memories()]


class Jax:
    name = "jax"

    def __init__(self, platform: str):
        import jax
        import jax.numpy as jnp
        import jaxlib

        self.jax, self.jnp = jax, jnp
        self.device = jax.devices(platform)[0]
        self.version = f"jax {jax.__version__}, jaxlib {jaxlib.__version__}"

    def sharding(self, kind: str | None = None):
        kind = kind or self.device.default_memory().kind
        return self.jax.sharding.SingleDeviceSharding(self.device, memory_kind=kind)

    def memory_kinds(self) -> list[str]:
        return [m.kind for m in self.device.addressable_memories()]


class Pypjrt:
    name = "pypjrt"

    def __init__(self, platform: str, plugin_path: str):
        import contextlib

        import pypjrt
        from pypjrt.typing import F32

        self.F32 = F32
        options = None
        if platform == "cuda":
            import pjrt_cuda

            options = pjrt_cuda.client_options()
        self.client = pypjrt.Client.create(pypjrt.Plugin(plugin_path), options=options)
        self._stack = contextlib.ExitStack()
        self.device = self._stack.enter_context(self.client.device(0))
        self.version = f"pypjrt {pypjrt.__version__}"

    def compile(self, text: str):
        return self.client.compile(text)

    def put(self, x: np.ndarray):
        return self.client.buffer_from_host(x, self.F32.code, list(x.shape), self.device)

    def close(self) -> None:
        self._stack.close()
        self.client.close()


def load_libraries(platform: str, without: set[str], plugin_path: str | None
                   ) -> tuple[dict, list[str]]:
    """pjrt (required: an error propagates), then jax and pypjrt where they load; a line for
    each left out."""
    libs: dict = {"pjrt": Pjrt(platform, plugin_path)}
    missing: list[str] = []
    loaders = {"jax": lambda: Jax(platform),
               "pypjrt": lambda: Pypjrt(platform, libs["pjrt"].client.plugin.library_path)}
    for name in OPTIONAL_LIBS:
        if name in without:
            missing.append(f"{name}: skipped (--without)")
            continue
        try:
            libs[name] = loaders[name]()
        except Exception as error:  # noqa: BLE001 - reported, and its cells stay empty
            missing.append(f"{name}: not available ({describe(error)}); its cells are empty")
    return libs, missing


# --------------------------------------------------------------------------------------------
# (a), (b): a tiny program per call


def bench_tiny(libs: dict, settings: Settings, sections: str) -> list[Row]:
    rng = np.random.default_rng(0)
    a_host, b_host = (rng.standard_normal(8).astype(np.float32) for _ in range(2))
    expected = np.tanh(a_host * b_host + 1)
    text = open(TINY_TANH).read()
    labels = {"dispatch": "(a) tiny program, N calls then wait on the last [us/call]",
              "blocking": "(a) tiny program, wait on every call [us/call]",
              "read": "(b) tiny program + np.asarray(result) [us/call]"}
    kinds = (["dispatch", "blocking"] if "a" in sections else []) + (
        ["read"] if "b" in sections else [])
    rows = {kind: Row(labels[kind], "us") for kind in kinds}
    runs: dict[str, dict[str, Callable[[int], int]]] = {kind: {} for kind in kinds}

    def check(value) -> None:
        # A sanity check of the program, loose enough for a GPU's tanh approximation.
        np.testing.assert_allclose(np.asarray(value), expected, rtol=1e-4, atol=1e-6)

    for name, lib in libs.items():
        try:
            runs_of_lib = tiny_runs(name, lib, text, a_host, b_host, check)
        except Exception as error:  # noqa: BLE001
            mark_all(list(rows.values()), name, "error", describe(error))
            continue
        for kind in kinds:
            runs[kind][name] = runs_of_lib[kind]
    if "pypjrt" in libs and "a" in sections:
        rows["dispatch"].notes.append("pypjrt's execute waits for the program to finish, so its "
                                      "two (a) cells are the same measurement")
    for kind, row in rows.items():
        fill(row, runs[kind], lambda r: per_call_medians(r, settings), lambda s: s * 1e6)
    return list(rows.values())


def tiny_runs(name: str, lib, text: str, a_host, b_host, check) -> dict[str, Callable]:
    """``run(n)`` for each kind of per-call row: ns for ``n`` calls."""
    asarray = np.asarray
    if name == "jax":
        jax, jnp = lib.jax, lib.jnp
        f = jax.jit(lambda a, b: jnp.tanh(a * b + 1))
        a, b = jax.device_put(a_host, lib.device), jax.device_put(b_host, lib.device)
        check(f(a, b))

        def call():
            return f(a, b)
    elif name == "pjrt":
        execute = lib.compile(text).execute
        a, b = lib.put(a_host), lib.put(b_host)
        check(execute([a, b])[0])

        def call():
            return execute([a, b])[0]
    else:  # pypjrt: outputs are freed with close(), its documented way
        executable = lib.compile(text)
        a, b = lib.put(a_host), lib.put(b_host)
        out = executable(a, b)[0]
        host = np.empty(8, np.float32)
        out.to_host(host)
        out.close()
        check(host)

        def closed(n):
            t0 = perf_ns()
            for _ in range(n):
                executable(a, b)[0].close()
            return perf_ns() - t0

        def read_closed(n, empty=np.empty, f32=np.float32):
            t0 = perf_ns()
            for _ in range(n):
                o = executable(a, b)[0]
                o.to_host(empty(8, f32))
                o.close()
            return perf_ns() - t0

        return {"dispatch": closed, "blocking": closed, "read": read_closed}

    def dispatch(n):
        t0 = perf_ns()
        r = None
        for _ in range(n):
            r = call()
        r.block_until_ready()
        return perf_ns() - t0

    def blocking(n):
        t0 = perf_ns()
        for _ in range(n):
            call().block_until_ready()
        return perf_ns() - t0

    def read(n):
        t0 = perf_ns()
        for _ in range(n):
            asarray(call())
        return perf_ns() - t0

    return {"dispatch": dispatch, "blocking": blocking, "read": read}


# --------------------------------------------------------------------------------------------
# (c) host <-> device throughput


def add_zero_program(elements: int) -> str:
    """``x + 0`` of ``elements`` float32: a fresh device array to read, made by a program."""
    return f"""\
module @add_zero attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func public @main(%x: tensor<{elements}xf32>) -> tensor<{elements}xf32> {{
    %zero = stablehlo.constant dense<0.000000e+00> : tensor<{elements}xf32>
    %y = stablehlo.add %x, %zero : tensor<{elements}xf32>
    return %y : tensor<{elements}xf32>
  }}
}}
"""


#: Where each (c) row moves its bytes, and whether it needs a pinned_host memory.
TRANSFERS = (("h2d", False, "(c) H2D {size} from pageable host memory (numpy) [GB/s]"),
             ("h2d", True, "(c) H2D {size} from pinned_host memory [GB/s]"),
             ("d2h", False, "(c) D2H {size} to pageable host memory (np.asarray) [GB/s]"),
             ("d2h", True, "(c) D2H {size} to pinned_host memory [GB/s]"))

PROBE = 12345  # the element each transfer's result is checked at


def bench_transfers(libs: dict, settings: Settings, platform: str) -> list[Row]:
    elements = settings.transfer_mib * (1 << 20) // 4
    size = f"{settings.transfer_mib} MiB"
    # 16 bytes past a page boundary, as numpy's own large allocations are: no library can
    # alias it, so every host-to-device cell copies.
    x = aligned_empty(elements + 16)[4:4 + elements]
    x[:] = np.arange(elements, dtype=np.float32)
    rows = [Row(label.format(size=size), "GB/s") for _, _, label in TRANSFERS]
    shots: list[dict[str, Callable[[], int]]] = [{} for _ in TRANSFERS]
    for name in ("jax", "pjrt"):
        if name not in libs:
            continue
        lib = libs[name]
        kinds = lib.memory_kinds()
        try:
            place, fresh = (jax_placement if name == "jax" else pjrt_placement)(lib, elements)
            made = transfer_shots(place, fresh, x, "pinned_host" in kinds)
        except Exception as error:  # noqa: BLE001
            mark_all(rows, name, "error", describe(error))
            continue
        for i, (direction, pinned, _) in enumerate(TRANSFERS):
            shot = made.get((direction, pinned))
            if isinstance(shot, Exception):
                rows[i].mark(name, "error", describe(shot))
            elif shot is not None:
                shots[i][name] = shot
            else:
                rows[i].mark(name, "n/a", f"{lib.device} has no pinned_host memory (its "
                                          f"memory kinds: {', '.join(kinds) or 'none'})")
    for row, row_shots in zip(rows, shots):
        fill(row, row_shots, lambda s: one_shot_medians(s, settings.transfer_repeats),
             lambda seconds: elements * 4 / seconds / 1e9)
    if platform == "cpu":
        rows[2].notes.append("on the CPU np.asarray returns a view of the device buffer (jax "
                             "and pjrt alike): nothing is copied")
    gc.collect()
    return rows


def pjrt_placement(lib: Pjrt, elements: int) -> tuple[Callable, Callable]:
    """``place(value, where)``: a numpy array or an Array into the device's default memory
    (``"device"``) or its pinned_host memory (``"pinned"``); ``fresh()``: a new, computed
    array of ``elements`` float32 on the device."""
    memories = {"device": lib.memory}
    if "pinned_host" in lib.memory_kinds():
        memories["pinned"] = lib.device.memory("pinned_host")

    def place(value, where):
        if isinstance(value, np.ndarray):
            return lib.put(value, memory=memories[where])
        return value.copy_to_memory(memories[where])

    add_zero = lib.compile(add_zero_program(elements))
    on_device = lib.put(np.arange(elements, dtype=np.float32))
    return place, lambda: add_zero.execute([on_device])[0]


def jax_placement(lib: Jax, elements: int) -> tuple[Callable, Callable]:
    """As pjrt_placement, with jax.device_put to a sharding of each memory kind."""
    jax = lib.jax
    shardings = {"device": lib.sharding()}
    if "pinned_host" in lib.memory_kinds():
        shardings["pinned"] = lib.sharding("pinned_host")
    add_zero = jax.jit(lambda v: v + 0)
    on_device = jax.device_put(np.arange(elements, dtype=np.float32), shardings["device"])
    return (lambda value, where: jax.device_put(value, shardings[where]),
            lambda: add_zero(on_device))


def transfer_shots(place: Callable, fresh: Callable, x: np.ndarray, pinned: bool) -> dict:
    """(direction, pinned) -> a shot returning the ns of one transfer of ``x``'s bytes (an
    arange, as ``fresh()`` computes), or the exception its first, checked run raised; the
    pinned ones only with ``pinned``. What a shot makes is freed outside its timed part."""
    def timed(make, move):
        def shot():
            source = make()
            t0 = perf_ns()
            moved = move(source)
            elapsed = perf_ns() - t0
            # Free the device arrays made for this shot alone; a host view of one goes first.
            if not isinstance(moved, np.ndarray):
                moved.delete()
            del moved
            if source is not kept and not isinstance(source, np.ndarray):
                source.delete()
            return elapsed
        return shot

    def ready(array):
        return array.block_until_ready()

    paths = {("h2d", False): (lambda: x, lambda v: ready(place(v, "device"))),
             ("d2h", False): (lambda: ready(fresh()), np.asarray)}
    kept = None
    if pinned:
        paths[("h2d", True)] = (lambda: kept, lambda v: ready(place(v, "device")))
        paths[("d2h", True)] = (lambda: ready(fresh()), lambda v: ready(place(v, "pinned")))
    shots: dict = {}
    for key, (make, move) in paths.items():
        try:
            if key == ("h2d", True):
                kept = ready(place(x, "pinned"))
            value = np.asarray(move(make()))[PROBE]
            assert value == x[PROBE], f"{key}: read {value}, expected {x[PROBE]}"
            shots[key] = timed(make, move)
        except Exception as error:  # noqa: BLE001 - reported in its row
            shots[key] = error
    return shots


# --------------------------------------------------------------------------------------------
# (d) a streamed upload, through bench_streaming.py's shots


class StreamedUpload:
    """What bench_streaming's ``put_streamed``, ``put_whole`` and ``put_jax`` shots read: the
    host input in chunks, pjrt's device and a TransferManager of one buffer per chunk, and
    jax (None without it)."""

    def __init__(self, settings: Settings, libs: dict):
        pjrt_lib = libs["pjrt"]
        self.pjrt = pjrt_lib.pjrt
        self.client, self.device, self.memory = pjrt_lib.client, pjrt_lib.device, pjrt_lib.memory
        self.chunk = settings.chunk_mib * (1 << 20) // 4  # float32 elements per chunk
        self.chunks = settings.stream_mib // settings.chunk_mib
        total = self.chunk * self.chunks
        self.host = aligned_empty(total + 16)[4:4 + total]  # not aliasable, as in (c)
        self.host[:] = np.arange(total, dtype=np.float32)
        self.jax = libs["jax"].jax if "jax" in libs else None

    def piece(self, i: int) -> np.ndarray:
        return self.host[i * self.chunk:(i + 1) * self.chunk]

    def new_manager(self):
        return self.client.create_buffers_for_async_host_to_device(
            [((self.chunk,), np.float32)] * self.chunks, self.memory)

    def check(self, values) -> None:  # the upload shots return nothing to check
        pass


def bench_streamed(libs: dict, settings: Settings) -> list[Row]:
    total = (f"{settings.stream_mib // 1024} GiB" if settings.stream_mib % 1024 == 0
             else f"{settings.stream_mib} MiB")
    count = settings.stream_mib // settings.chunk_mib
    streamed = Row(f"(d) H2D {total} streamed, {count} x {settings.chunk_mib} MiB chunks "
                   f"(pjrt TransferManager) [GB/s]", "GB/s")
    whole = Row(f"(d) H2D {total} whole (device_put), for comparison [GB/s]", "GB/s")
    if "jax" in libs:
        streamed.mark("jax", "n/a", "jax has no public streamed host-to-device transfer")
    try:
        import bench_streaming

        measure, shots = bench_streaming.measure, {
            "streamed": bench_streaming.put_streamed, "pjrt": bench_streaming.put_whole,
            "jax": bench_streaming.put_jax}
    except (ImportError, AttributeError) as error:
        reason = f"benchmarks/bench_streaming.py has no shots to call ({describe(error)})"
        streamed.mark("pjrt", "skip", reason)
        whole.mark("pjrt", "skip", reason)
        if "jax" in libs:
            whole.mark("jax", "skip", reason)
        return [streamed, whole]
    if not hasattr(libs["pjrt"].client, "create_buffers_for_async_host_to_device"):
        streamed.mark("pjrt", "skip", "this pjrt's Client has no "
                                      "create_buffers_for_async_host_to_device")
        del shots["streamed"]
    if "jax" not in libs:
        del shots["jax"]
    work = StreamedUpload(settings, libs)
    nbytes = work.host.nbytes
    if "streamed" in shots:
        try:  # a plugin that cannot stream says so here; the whole row still runs
            work.new_manager().close()
        except libs["pjrt"].pjrt.UnsupportedFeatureError as error:
            streamed.mark("pjrt", "n/a", describe(error))
            del shots["streamed"]
        except Exception as error:  # noqa: BLE001 - reported in the row
            streamed.mark("pjrt", "error", describe(error))
            del shots["streamed"]
    try:
        # The shots read only what StreamedUpload has of bench_streaming's Work.
        medians = measure(work, shots, settings.stream_repeats)  # pyright: ignore[reportArgumentType]
    except Exception as error:  # noqa: BLE001 - reported in the rows, the run goes on
        for name in shots:
            (streamed if name == "streamed" else whole).mark(
                "pjrt" if name == "streamed" else name, "error", describe(error))
        medians = {}
    for name, seconds in medians.items():
        if name == "streamed":
            streamed.values["pjrt"] = nbytes / seconds / 1e9
        else:
            whole.values[name] = nbytes / seconds / 1e9
    del work
    gc.collect()
    return [streamed, whole]


# --------------------------------------------------------------------------------------------
# (e) an MLP training step with Adam, lowered by jax, run by both

MLP_WIDTH = 1024
MLP_BATCH = 256
MLP_HIDDEN = 3
LEARNING_RATE = 1e-4
CHECK_STEPS = 3


def mlp_host_state(rng) -> tuple[tuple, tuple]:
    """The initial (params, m, v, t) and a batch (x, y), as numpy float32."""
    sizes = [(MLP_WIDTH, MLP_WIDTH)] * MLP_HIDDEN + [(MLP_WIDTH, 1)]
    params = [((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32),
               np.zeros(shape[1], np.float32)) for shape in sizes]
    zeros = [(np.zeros_like(w), np.zeros_like(b)) for w, b in params]
    x = rng.standard_normal((MLP_BATCH, MLP_WIDTH)).astype(np.float32)
    y = rng.standard_normal((MLP_BATCH, 1)).astype(np.float32)
    return (params, zeros, [(w.copy(), b.copy()) for w, b in zeros], np.float32(0)), (x, y)


def numpy_loss(params, x, y) -> float:
    """The MLP's loss at ``params``, in float64: what the first step reports."""
    h = x.astype(np.float64)
    for w, b in params[:-1]:
        h = np.maximum(h @ w + b, 0)
    w, b = params[-1]
    return float(np.mean((h @ w + b - y) ** 2))


def make_step(jax, jnp):
    """One Adam step: (params, m, v, t, x, y) -> (params, m, v, t, loss at the old params)."""
    def loss_of(params, x, y):
        h = x
        for w, b in params[:-1]:
            h = jax.nn.relu(h @ w + b)
        w, b = params[-1]
        return jnp.mean((h @ w + b - y) ** 2)

    def step(params, m, v, t, x, y):
        loss, grads = jax.value_and_grad(loss_of)(params, x, y)
        t = t + 1
        b1, b2, eps = 0.9, 0.999, 1e-8
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
        m_scale, v_scale = 1 / (1 - b1 ** t), 1 / (1 - b2 ** t)
        params = jax.tree.map(
            lambda p, m, v: p - LEARNING_RATE * (m * m_scale) / (jnp.sqrt(v * v_scale) + eps),
            params, m, v)
        return params, m, v, t, loss

    return step


def loss_tolerances(platform: str) -> tuple[float, float]:
    """(jax vs pjrt, first loss vs numpy) relative tolerances. A GPU's float32 matmuls may
    round their inputs to TF32, and the two libraries' compilations may pick other kernels."""
    return (1e-4, 1e-4) if platform == "cpu" else (5e-3, 2e-2)


def bench_mlp(libs: dict, settings: Settings, platform: str) -> tuple[list[Row], bool]:
    """The rows, and whether the losses agree."""
    shape = f"{MLP_HIDDEN + 1} layers, batch {MLP_BATCH}, width {MLP_WIDTH}"
    chained = Row(f"(e) MLP Adam step ({shape}): N steps then wait [ms/step]", "ms")
    read = Row("(e) MLP Adam step + np.asarray(loss) every step [ms/step]", "ms")
    rows = [chained, read]
    if "jax" in libs:
        jax = libs["jax"].jax
    else:
        try:  # the step is lowered by jax even when its column is left out
            import jax
        except ImportError as error:
            mark_all(rows, "pjrt", "skip", f"jax lowers the step to StableHLO and is not "
                                           f"importable ({describe(error)})")
            return rows, True
    step = make_step(jax, jax.numpy)
    state, batch = mlp_host_state(np.random.default_rng(0))
    expected_first = numpy_loss(state[0], *batch)
    leaves = jax.tree.leaves((state, batch))
    state_count = len(jax.tree.leaves(state))
    runs: dict[str, dict[str, Callable[[int], int]]] = {"chained": {}, "read": {}}
    losses: dict[str, list[float]] = {}
    try:
        text = jax.jit(step).lower(*state, *batch).as_text()
    except Exception as error:  # noqa: BLE001
        mark_all(rows, "pjrt", "error", f"jax could not lower the step: {describe(error)}")
        return rows, True
    for name in ("jax", "pjrt"):
        if name not in libs:
            continue
        try:
            runs_of_lib, losses[name] = (jax_mlp_runs(libs["jax"], step, state, batch)
                                         if name == "jax" else
                                         pjrt_mlp_runs(libs["pjrt"], text, leaves, state_count))
        except Exception as error:  # noqa: BLE001
            mark_all(rows, name, "error", describe(error))
            continue
        for kind in runs:
            runs[kind][name] = runs_of_lib[kind]
    agree = judge_losses(chained, losses, expected_first, platform)
    fill(chained, runs["chained"], lambda r: per_call_medians(r, settings), lambda s: s * 1e3)
    fill(read, runs["read"], lambda r: per_call_medians(r, settings), lambda s: s * 1e3)
    gc.collect()
    return rows, agree


def judge_losses(row: Row, losses: dict[str, list[float]], expected_first: float,
                 platform: str) -> bool:
    between, against_numpy = loss_tolerances(platform)
    verdicts, agree = [], True
    for name, values in losses.items():
        off = abs(values[0] - expected_first) / abs(expected_first)
        ok = off <= against_numpy
        agree &= ok
        verdicts.append(f"{name}'s first loss vs numpy float64: {off:.1e} "
                        f"({'within' if ok else 'OVER'} {against_numpy:g})")
    if "jax" in losses and "pjrt" in losses:
        a, b = np.array(losses["jax"]), np.array(losses["pjrt"])
        off = float(np.max(np.abs(a - b) / np.abs(a)))
        ok = off <= between
        agree &= ok
        verdicts.insert(0, f"jax vs pjrt over {CHECK_STEPS} steps: max relative difference "
                           f"{off:.1e} ({'within' if ok else 'OVER'} {between:g})")
    listed = "; ".join(f"{name} {[float(f'{v:.7g}') for v in values]}"
                       for name, values in losses.items())
    if losses:
        row.notes.append(f"losses {'agree' if agree else 'DISAGREE'}: " + "; ".join(verdicts)
                         + f"; losses: {listed}")
    return agree


def jax_mlp_runs(lib: Jax, step, state, batch) -> tuple[dict, list[float]]:
    jax = lib.jax
    f = jax.jit(step)
    put = lambda tree: jax.device_put(tree, lib.device)  # noqa: E731
    x, y = put(batch)
    losses = []
    current = put(state)
    for _ in range(CHECK_STEPS):
        *current, loss = f(*current, x, y)
        losses.append(float(np.asarray(loss)))
    current = put(state)

    def chained(n):
        nonlocal current
        t0 = perf_ns()
        loss = None
        for _ in range(n):
            *current, loss = f(*current, x, y)
        loss.block_until_ready()
        return perf_ns() - t0

    def read(n, asarray=np.asarray):
        nonlocal current
        t0 = perf_ns()
        for _ in range(n):
            *current, loss = f(*current, x, y)
            asarray(loss)
        return perf_ns() - t0

    return {"chained": chained, "read": read}, losses


def pjrt_mlp_runs(lib: Pjrt, text: str, leaves: list, state_count: int
                  ) -> tuple[dict, list[float]]:
    execute = lib.compile(text).execute
    placed = [lib.put(np.asarray(leaf)) for leaf in leaves]
    batch = placed[state_count:]
    losses = []
    current = placed[:state_count]
    for _ in range(CHECK_STEPS):
        out = execute(current + batch)
        current = out[:state_count]
        losses.append(float(np.asarray(out[-1])))
    current = placed[:state_count]

    def chained(n):
        nonlocal current
        t0 = perf_ns()
        out = []
        for _ in range(n):
            out = execute(current + batch)
            current = out[:state_count]
        out[-1].block_until_ready()
        return perf_ns() - t0

    def read(n, asarray=np.asarray):
        nonlocal current
        t0 = perf_ns()
        for _ in range(n):
            out = execute(current + batch)
            current = out[:state_count]
            asarray(out[-1])
        return perf_ns() - t0

    return {"chained": chained, "read": read}, losses


# --------------------------------------------------------------------------------------------
# output


def format_value(value, unit: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if unit in ("us", "ms"):
        return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 100 else f"{value:.0f}"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 1000 else f"{value:.0f}"


def format_ratio(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2g}x" if value < 0.1 else f"{value:.2f}x" if value < 100 else f"{value:.0f}x"


def columns(libs: dict) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """Headers, the libraries shown, and the ratios shown: pypjrt's only when it ran."""
    shown = ["jax", "pjrt"] + (["pypjrt"] if "pypjrt" in libs else [])
    ratios = [("pjrt", "jax")] + ([("pjrt", "pypjrt")] if "pypjrt" in libs else [])
    headers = (["measurement"] + shown + [f"{a}/{b}" for a, b in ratios] + ["notes"])
    return headers, shown, ratios


def table_cells(rows: list[Row], libs: dict) -> list[list[str]]:
    _, shown, ratios = columns(libs)
    return [[row.label] + [format_value(row.values.get(lib), row.unit) for lib in shown]
            + [format_ratio(row.ratio(a, b)) for a, b in ratios]
            + ["; ".join(row.notes) or "-"] for row in rows]


def render_text(rows: list[Row], libs: dict) -> str:
    headers = columns(libs)[0]
    cells = table_cells(rows, libs)
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    last = len(headers) - 1

    def line(values):
        return "  ".join(v if i == last else v.rjust(w) if i else v.ljust(w)
                         for i, (v, w) in enumerate(zip(values, widths))).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(c) for c in cells])


def render_markdown(rows: list[Row], libs: dict) -> str:
    headers = columns(libs)[0]
    out = ["| " + " | ".join(headers) + " |",
           "| " + " | ".join(["---"] + ["---:"] * (len(headers) - 2) + ["---"]) + " |"]
    out += ["| " + " | ".join(c.replace("|", "/") for c in cells) + " |"
            for cells in table_cells(rows, libs)]
    return "\n".join(out)


def installed_versions() -> list[str]:
    found = []
    for name in DISTRIBUTIONS:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def header(libs: dict, platform: str) -> list[str]:
    pjrt_lib = libs["pjrt"]
    kind = pjrt_lib.device.device_kind
    device = f"device: {kind} ({platform}:{pjrt_lib.device.id}"
    if "jax" in libs and libs["jax"].device.device_kind != kind:
        device += f"; jax names it {libs['jax'].device.device_kind}"
    device += ")"
    versions = [pjrt_lib.version] + [libs[n].version for n in OPTIONAL_LIBS if n in libs]
    versions += installed_versions() + [f"numpy {np.__version__}",
                                        f"python {host_platform.python_version()}"]
    plugin = pjrt_lib.client.plugin
    major, minor = plugin.api_version
    jax_side = ("jax uses jaxlib's built-in CPU client" if platform == "cpu" else
                "jax loads the same library through its jax_plugins module")
    try:
        head = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head = ""
    try:
        nproc = len(os.sched_getaffinity(0))
    except AttributeError:
        nproc = os.cpu_count()
    return [
        device,
        f"versions: {', '.join(versions)}" + (f" (checkout {head})" if head else ""),
        f"plugin for pjrt: {plugin.library_path} (PJRT API {major}.{minor}, platform version "
        f"{pjrt_lib.client.platform_version!r}); {jax_side}",
        f"host: {cpu_model()}; nproc {nproc}; {host_platform.system()} "
        f"{host_platform.release()}",
        f"date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
    ]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--platform", default="cuda",
                        help="the platform both libraries run on: cuda (default) or cpu")
    parser.add_argument("--quick", action="store_true",
                        help="smaller transfers, fewer and shorter repeats")
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help="comma-separated sections to run, of a,b,c,d,e (default: all)")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--without", default="",
                        help="comma-separated libraries to leave out even if installed "
                             "(jax, pypjrt); pjrt always runs")
    parser.add_argument("--plugin", default=None,
                        help="with --platform cpu: the CPU plugin library pjrt and pypjrt load "
                             "(default: the cpu backend's, pjrt_cpu.library_path())")
    args = parser.parse_args(argv)
    if args.plugin and args.platform != "cpu":
        parser.error("--plugin takes a CPU plugin library, with --platform cpu")
    args.sections = "".join(s for s in SECTIONS if s in {p.strip() for p in args.only.split(",")})
    if not args.sections or set(p.strip() for p in args.only.split(",")) - set(SECTIONS):
        parser.error(f"--only takes a comma-separated subset of a,b,c,d,e (got {args.only!r})")
    args.without = {s.strip() for s in args.without.split(",") if s.strip()}
    if args.without - set(OPTIONAL_LIBS):
        parser.error("--without takes jax and/or pypjrt")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    settings = QUICK if args.quick else Settings()
    # Before jax is imported: jax brings up only this platform. Two clients share the device
    # here, so neither takes most of its memory up front.
    os.environ["JAX_PLATFORMS"] = args.platform
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    started = time.perf_counter()
    libs, missing = load_libraries(args.platform, args.without, args.plugin)
    rows: list[Row] = []
    agree = True
    if "a" in args.sections or "b" in args.sections:
        rows += bench_tiny(libs, settings, args.sections)
    if "c" in args.sections:
        rows += bench_transfers(libs, settings, args.platform)
    if "d" in args.sections:
        rows += bench_streamed(libs, settings)
    if "e" in args.sections:
        mlp_rows, agree = bench_mlp(libs, settings, args.platform)
        rows += mlp_rows
    elapsed = time.perf_counter() - started
    if "pypjrt" in libs:
        libs["pypjrt"].close()

    print(f"# pjrt next to jax on {args.platform} ({'quick' if args.quick else 'full'} run, "
          f"{elapsed:.0f} s)")
    for line in header(libs, args.platform):
        print(f"# {line}")
    for line in missing:
        print(f"# SKIPPED {line}")
    print(f"# settings: per-call loops ~{settings.target_s} s x {settings.repeats} repeats; "
          f"{settings.transfer_repeats} transfers per (c) cell, {settings.stream_repeats} "
          f"uploads per (d) cell; medians. GB/s are 10^9 bytes/s (higher is better); times "
          f"per call or step (lower is better). Ratios divide the row's values."
          + (" pypjrt joins (a) and (b) only." if "pypjrt" in libs else ""))
    print()
    print(render_markdown(rows, libs) if args.markdown else render_text(rows, libs))
    failed = [row.label for row in rows if "error" in row.values.values()]
    if failed or not agree:
        print()
        print("FAILED: " + "; ".join(failed + ([] if agree else ["the MLP losses disagree"])))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

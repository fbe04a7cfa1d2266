#!/usr/bin/env python
"""Streamed host-to-device transfers: a large input sent in chunks while a program consumes
the chunks already in, next to sending it whole and then running, and next to jax.

One run measures, on the same machine, a 1 GiB float32 input in 64 MiB chunks (16 of them)
and a consumer that reduces each chunk (``sum(x * x)``, one result per chunk):

  (a) the input already in host memory: pjrt streamed (a ``TransferManager`` of 16 buffers;
      chunk i's program is launched on buffer i before its bytes are sent, then the bytes),
      pjrt whole (``pjrt.device_put`` of the whole array, then one program over all of it)
      and jax (``jax.device_put``, then the same program jitted), until every result is
      ready;
  (b) the transfer alone, no program: the same three, until the data are on the device
      (what ``device_put`` would gain by streaming: see the notes);
  (c) an input produced chunk by chunk on the host (each chunk computed from a 64 MiB base):
      streamed, each chunk is sent as soon as it is made, into one of two reused 64 MiB host
      buffers, while the programs of the earlier chunks run; whole and jax make all of it
      first, then place and run.

pjrt loads ``pjrt_cpu.library_path()`` (the ``xla-cpu-pjrt`` wheel) with one device; jax uses
jaxlib's own built-in CPU client (the same XLA CPU runtime, linked into jaxlib). jax is
optional: without it its column is empty. The host input starts 16 bytes past a page
boundary, as numpy's own large allocations do, so jax copies it rather than aliasing it.

Usage::

    python benchmarks/bench_streaming.py              # full run (about a minute on 2 cores)
    python benchmarks/bench_streaming.py --quick      # fewer repeats, 256 MiB
    python benchmarks/bench_streaming.py --only a,b   # some sections (any of a, b, c)
    python benchmarks/bench_streaming.py --markdown   # the table as Markdown (for the README)
    python benchmarks/bench_streaming.py --without jax
    python benchmarks/bench_streaming.py --repeats 7  # steadier medians, longer

Each cell is the median of single shots after one warm-up, the three libraries' shots
interleaved so that drift in machine speed hits them alike; what a shot made is freed outside
its timed part. Peak memory is about three times the input (host input, device copy, one
library's temporaries).
"""
from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

os.environ.setdefault("JAX_PLATFORMS", "cpu")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

from bench_core import REPO, aligned_empty, cpu_model  # noqa: E402

perf_ns = time.perf_counter_ns

COLUMNS = ("streamed", "whole", "jax")


@dataclass
class Settings:
    total_mib: int = 1024
    chunk_mib: int = 64
    repeats: int = 3


QUICK = Settings(total_mib=256, chunk_mib=64, repeats=2)


@dataclass
class Row:
    label: str
    values: dict  # column -> seconds


def chunk_program(elements: int) -> str:
    """``sum(x * x)`` of one chunk of ``elements`` float32."""
    return f"""\
module @chunk_sum_squares attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func public @main(%x: tensor<{elements}xf32>) -> tensor<f32> {{
    %zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %sq = stablehlo.multiply %x, %x : tensor<{elements}xf32>
    %sum = stablehlo.reduce(%sq init: %zero) applies stablehlo.add across dimensions = [0]
        : (tensor<{elements}xf32>, tensor<f32>) -> tensor<f32>
    return %sum : tensor<f32>
  }}
}}
"""


def whole_program(chunks: int, elements: int) -> str:
    """The same over the whole input seen as ``[chunks, elements]``: one sum per chunk."""
    return f"""\
module @whole_sum_squares attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func public @main(%x: tensor<{chunks}x{elements}xf32>) -> tensor<{chunks}xf32> {{
    %zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %sq = stablehlo.multiply %x, %x : tensor<{chunks}x{elements}xf32>
    %sum = stablehlo.reduce(%sq init: %zero) applies stablehlo.add across dimensions = [1]
        : (tensor<{chunks}x{elements}xf32>, tensor<f32>) -> tensor<{chunks}xf32>
    return %sum : tensor<{chunks}xf32>
  }}
}}
"""


class Work:
    """The input, its shape in chunks, and each library's programs."""

    def __init__(self, settings: Settings, plugin_path: str, without: set[str],
                 notes: list[str], missing: list[str]):
        import pjrt

        self.chunk = settings.chunk_mib * (1 << 20) // 4  # float32 elements per chunk
        self.chunks = settings.total_mib // settings.chunk_mib
        total = self.chunk * self.chunks
        rng = np.random.default_rng(0)
        # The base chunk, and the input built from it (chunk i is base * (1 + i/64)): cheap
        # to make, and every chunk differs.
        self.base = rng.random(self.chunk, dtype=np.float32)
        self.host = aligned_empty(total + 16)[4:4 + total]  # 16 bytes past a page boundary
        for i in range(self.chunks):
            self.produce(i, self.host[i * self.chunk:(i + 1) * self.chunk])
        self.expected = np.array([np.dot(piece, piece) for piece in
                                  (self.piece(i).astype(np.float64) for i in range(self.chunks))])

        self.pjrt = pjrt
        plugin = pjrt.load_pjrt_plugin_dynamically("bench_cpu", plugin_path)
        self.api_version = plugin.api_version
        self.client = pjrt.make_c_api_client("bench_cpu", {"cpu_device_count": 1})
        self.device = self.client.local_devices()[0]
        self.memory = self.device.default_memory()
        self.chunk_exe = self.client.compile_and_load(chunk_program(self.chunk), [self.device])
        self.whole_exe = self.client.compile_and_load(whole_program(self.chunks, self.chunk),
                                                      [self.device])
        self.jax = None
        if "jax" in without:
            missing.append("jax: skipped (--without)")
        else:
            try:
                import jax
                import jax.numpy as jnp

                chunks, chunk = self.chunks, self.chunk
                self.jax = jax
                self.jax_program = jax.jit(
                    lambda x: jnp.sum(jnp.square(x.reshape(chunks, chunk)), axis=1))
                probe = jax.device_put(self.host).block_until_ready()
                notes.append(f"jax.device_put aliased the 16-byte-aligned host input: "
                             f"{probe.unsafe_buffer_pointer() == self.host.ctypes.data}")
                del probe
            except Exception as error:  # noqa: BLE001 - reported, and the column is skipped
                missing.append(f"jax: not available ({type(error).__name__}: {error}); its "
                               f"column is skipped")
                self.jax = None
        # (c): whole and jax make the input where it already is (the same values); streamed
        # makes each chunk into one of two reused buffers.
        self.buffers = [np.empty(self.chunk, np.float32) for _ in range(2)]  # (c): streamed

    def produce(self, i: int, out: np.ndarray) -> None:
        """Make chunk ``i`` of the input into ``out`` (a 64 MiB host computation)."""
        np.multiply(self.base, np.float32(1 + i / 64), out=out)

    def piece(self, i: int) -> np.ndarray:
        return self.host[i * self.chunk:(i + 1) * self.chunk]

    def new_manager(self):
        return self.client.create_buffers_for_async_host_to_device(
            [((self.chunk,), np.float32)] * self.chunks, self.memory)

    def check(self, values) -> None:
        np.testing.assert_allclose(np.asarray(values, np.float64).ravel(), self.expected,
                                   rtol=1e-4)


# --------------------------------------------------------------------------------------------
# the shots: each returns (ns of its timed part, what to check or None)


def consume_streamed(work: Work):
    t0 = perf_ns()
    with work.new_manager() as manager:
        results = []
        for i in range(work.chunks):
            # Launched before its bytes are sent: it runs as soon as they are in.
            results.append(work.chunk_exe.execute([manager.retrieve_buffer(i)])[0])
            manager.transfer_data(i, work.piece(i))
    for result in results:
        result.block_until_ready()
    elapsed = perf_ns() - t0
    return elapsed, [np.asarray(r) for r in results]


def consume_whole(work: Work):
    t0 = perf_ns()
    placed = work.pjrt.device_put(work.host.reshape(work.chunks, work.chunk), work.device)
    result = work.whole_exe.execute([placed])[0].block_until_ready()
    elapsed = perf_ns() - t0
    placed.delete()
    return elapsed, np.asarray(result)


def consume_jax(work: Work):
    jax = work.jax
    assert jax is not None
    t0 = perf_ns()
    placed = jax.device_put(work.host)
    result = work.jax_program(placed).block_until_ready()
    elapsed = perf_ns() - t0
    placed.delete()
    return elapsed, np.asarray(result)


def put_streamed(work: Work):
    t0 = perf_ns()
    with work.new_manager() as manager:
        arrays = []
        for i in range(work.chunks):
            arrays.append(manager.retrieve_buffer(i))
            manager.transfer_data(i, work.piece(i))
    for array in arrays:
        array.block_until_ready()
    elapsed = perf_ns() - t0
    del arrays
    return elapsed, None


def put_whole(work: Work):
    t0 = perf_ns()
    placed = work.pjrt.device_put(work.host, work.device).block_until_ready()
    elapsed = perf_ns() - t0
    placed.delete()
    return elapsed, None


def put_jax(work: Work):
    jax = work.jax
    assert jax is not None
    t0 = perf_ns()
    placed = jax.device_put(work.host).block_until_ready()
    elapsed = perf_ns() - t0
    placed.delete()
    return elapsed, None


def produce_streamed(work: Work):
    t0 = perf_ns()
    with work.new_manager() as manager:
        results = []
        sent: list = [None, None]
        for i in range(work.chunks):
            slot = i % 2
            if sent[slot] is not None:
                sent[slot].block_until_ready()  # the plugin has read this buffer: reuse it
            out = work.buffers[slot]
            work.produce(i, out)
            results.append(work.chunk_exe.execute([manager.retrieve_buffer(i)])[0])
            sent[slot] = manager.transfer_data(i, out)
    for result in results:
        result.block_until_ready()
    elapsed = perf_ns() - t0
    return elapsed, [np.asarray(r) for r in results]


def produce_whole(work: Work):
    t0 = perf_ns()
    for i in range(work.chunks):
        work.produce(i, work.piece(i))
    placed = work.pjrt.device_put(work.host.reshape(work.chunks, work.chunk), work.device)
    result = work.whole_exe.execute([placed])[0].block_until_ready()
    elapsed = perf_ns() - t0
    placed.delete()
    return elapsed, np.asarray(result)


def produce_jax(work: Work):
    jax = work.jax
    assert jax is not None
    t0 = perf_ns()
    for i in range(work.chunks):
        work.produce(i, work.piece(i))
    placed = jax.device_put(work.host)
    result = work.jax_program(placed).block_until_ready()
    elapsed = perf_ns() - t0
    placed.delete()
    return elapsed, np.asarray(result)


SECTIONS = {
    "a": ("(a) {total} input in host memory, {count} x {chunk} chunks, sum(x*x) per chunk, "
          "until every result is ready [s]", (consume_streamed, consume_whole, consume_jax)),
    "b": ("(b) transfer alone, {total}: until the data are on the device [s]",
          (put_streamed, put_whole, put_jax)),
    "c": ("(c) input made chunk by chunk on the host, then as (a) [s]",
          (produce_streamed, produce_whole, produce_jax)),
}


def measure(work: Work, shots: dict[str, Callable], repeats: int) -> dict[str, float]:
    """Median seconds of each shot after one warm-up (whose results are checked), the
    columns' shots interleaved."""
    for shot in shots.values():
        _, values = shot(work)
        if values is not None:
            work.check(values)
        gc.collect()
    samples: dict[str, list[float]] = {name: [] for name in shots}
    for _ in range(repeats):
        for name, shot in shots.items():
            elapsed, _ = shot(work)
            samples[name].append(elapsed / 1e9)
            gc.collect()
    return {name: statistics.median(values) for name, values in samples.items()}


# --------------------------------------------------------------------------------------------
# output


HEADERS = ("measurement", "pjrt streamed", "pjrt whole, then run", "jax (jaxlib CPU)",
           "streamed/whole", "streamed/jax")


def ratio(row: Row, a: str, b: str) -> str:
    x, y = row.values.get(a), row.values.get(b)
    return "-" if x is None or y is None or y == 0 else f"{x / y:.2f}x"


def table_cells(rows: list[Row]) -> list[list[str]]:
    return [[row.label] + [f"{row.values[c]:.3f}" if c in row.values else "-" for c in COLUMNS]
            + [ratio(row, "streamed", "whole"), ratio(row, "streamed", "jax")] for row in rows]


def render_text(rows: list[Row]) -> str:
    cells = table_cells(rows)
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h)
              for i, h in enumerate(HEADERS)]

    def line(values):
        return "  ".join(v.rjust(w) if i else v.ljust(w)
                         for i, (v, w) in enumerate(zip(values, widths))).rstrip()

    return "\n".join([line(HEADERS), line(["-" * w for w in widths])] + [line(c) for c in cells])


def render_markdown(rows: list[Row]) -> str:
    out = ["| " + " | ".join(HEADERS) + " |",
           "| " + " | ".join(["---"] + ["---:"] * 5) + " |"]
    out += ["| " + " | ".join(c) + " |" for c in table_cells(rows)]
    return "\n".join(out)


def machine_facts(work: Work, plugin_path: str) -> list[str]:
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    versions = [f"pjrt {work.pjrt.__version__}", f"numpy {np.__version__}",
                f"python {platform.python_version()}"]
    if work.jax is not None:
        import jaxlib

        versions.append(f"jax {work.jax.__version__}, jaxlib {jaxlib.__version__}")
    try:
        head = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head = ""
    major, minor = work.api_version
    return [
        f"date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"machine: {cpu_model()}; nproc {affinity} (os.cpu_count {os.cpu_count()}); "
        f"{platform.system()} {platform.release()} {platform.machine()}",
        f"versions: {', '.join(versions)}" + (f" (checkout {head})" if head else ""),
        f"plugin for pjrt: {plugin_path} (PJRT API {major}.{minor}), 1 device; jax uses "
        f"jaxlib's own CPU client",
    ]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats, 256 MiB")
    parser.add_argument("--only", default="a,b,c", help="comma-separated sections: a, b, c")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--without", default="", help="'jax' to leave jax out")
    parser.add_argument("--plugin", default=None,
                        help="plugin library for pjrt (default: pjrt_cpu.library_path())")
    parser.add_argument("--total-mib", type=int, default=None, help="input size (1024)")
    parser.add_argument("--chunk-mib", type=int, default=None, help="chunk size (64)")
    parser.add_argument("--repeats", type=int, default=None, help="timed shots per cell (3)")
    args = parser.parse_args(argv)
    args.sections = [s.strip() for s in args.only.split(",") if s.strip()]
    if not args.sections or set(args.sections) - set(SECTIONS):
        parser.error(f"--only takes a comma-separated subset of a,b,c (got {args.only!r})")
    args.without = {s.strip() for s in args.without.split(",") if s.strip()}
    if args.without - {"jax"}:
        parser.error("--without takes jax")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    settings = QUICK if args.quick else Settings()
    if args.total_mib is not None:
        settings.total_mib = args.total_mib
    if args.chunk_mib is not None:
        settings.chunk_mib = args.chunk_mib
    if args.repeats is not None:
        settings.repeats = max(1, args.repeats)
    if settings.chunk_mib <= 0 or settings.total_mib % settings.chunk_mib:
        raise SystemExit("--total-mib must be a positive multiple of --chunk-mib")
    if args.plugin is None:
        import pjrt_cpu

        args.plugin = pjrt_cpu.library_path()
    started = time.perf_counter()
    notes: list[str] = []
    missing: list[str] = []
    work = Work(settings, args.plugin, args.without, notes, missing)
    names = {"total": f"{settings.total_mib} MiB", "count": work.chunks,
             "chunk": f"{settings.chunk_mib} MiB"}
    rows = []
    for section in args.sections:
        label, shots = SECTIONS[section]
        chosen: dict[str, Callable] = dict(zip(COLUMNS, shots))
        if work.jax is None:
            del chosen["jax"]
        rows.append(Row(label.format(**names), measure(work, chosen, settings.repeats)))
    elapsed = time.perf_counter() - started

    print(f"# pjrt streaming benchmarks ({'quick' if args.quick else 'full'} run, "
          f"{elapsed:.0f} s)")
    for fact in machine_facts(work, args.plugin):
        print(f"# {fact}")
    for line in missing:
        print(f"# SKIPPED {line}")
    print(f"# settings: {settings.total_mib} MiB in {settings.chunk_mib} MiB chunks; medians of "
          f"{settings.repeats} shots after one warm-up; seconds, lower is better.")
    print()
    print(render_markdown(rows) if args.markdown else render_text(rows))
    print()
    notes += [
        "streamed: client.create_buffers_for_async_host_to_device with one buffer per chunk; "
        "XLA's CPU plugin copies each chunk inside transfer_data, on the calling thread, while "
        "the programs of the chunks already in run on its own threads.",
        "whole: pjrt.device_put copies the input once into staging memory the plugin adopts "
        "(fresh memory above 512 MiB, copied on several threads), then runs one program over "
        "all of it.",
    ]
    for note in notes:
        print(f"* {note}" if args.markdown else f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

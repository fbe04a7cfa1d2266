#!/usr/bin/env python
"""Compute-bound programs: pjrt on each installed build of XLA's CPU plugin next to jax's own
CPU backend (jaxlib's built-in client), on the same StableHLO.

Each program is written with jax, lowered once by jax, and that StableHLO text is compiled by
pjrt on every CPU plugin build found here; jax runs it through ``jax.jit`` on its built-in CPU
client. Inputs are resident on the device on both sides (``jax.device_put``,
``pjrt.device_put``), so the rows measure the compiled code and the runtime, not transfers.
Every side's result is checked against jax's before timing.

Programs:

  shortest-paths   min-plus squaring of a 64-node distance matrix in a while loop (to fixpoint)
  closure          transitive closure, boolean matmul (as float32 0/1) to fixpoint, 256 nodes
  transformer      a pre-norm transformer block forward, batch 4, seq 128, width 256, 4 heads
  conv-pool-dense  two 3x3 conv layers (32, 64 channels) + 2x2 max pooling + dense, batch 16
  matmul           1024x1024 float32 matmul
  gelu-layernorm   gelu then layer norm over 4096x1024 float32
  resnet-block     a residual conv net: 3 blocks of two 3x3 convs (64 channels) on 32x32, batch 8
  rnn-step         an LSTM cell scanned over 32 steps, batch 64, width 256
  fft              2-D real FFT and back, 8 x 256 x 256 float32
  sort             sort of 2^18 float32 (and its argsort)
  scatter-add      segment sum of 2^20 float32 values into 4096 bins by random index

Builds: each of ``xla_plugins.xla_cpu_pjrt`` (xla-cpu-pjrt, pjrt-cpu's dependency),
``fastatomstruct_xla_cpu`` and ``lammps_jax_pjrt_cpu`` that is importable (a directory on
PYTHONPATH will do, e.g. one ``pip install --no-deps --target DIR`` filled), plus any
``--plugin NAME=PATH``. Each is loaded into this one process and makes its own client.

Usage::

    python benchmarks/bench_compute.py                    # all programs, all builds (minutes)
    python benchmarks/bench_compute.py --quick            # short repeats (about a minute)
    python benchmarks/bench_compute.py --only matmul,sort # some programs
    python benchmarks/bench_compute.py --markdown         # the table as Markdown
    python benchmarks/bench_compute.py --dump DIR         # XLA dumps of each side in DIR/<build>/<program>

Timing: each side is warmed up and calibrated to loops of about 0.2 s (0.03 s quick); then
loops of jax and of every build are interleaved, ``repeats`` times (7; 3 quick), and a build's
ratio is the median over repeats of its loop's time over jax's loop of the same repeat, so
that drift in machine load hits both alike. The time cells are medians of the loops. The
"CPU time" ratios are the same of the process's CPU time (all its threads) over each loop:
less swayed by other processes on a loaded machine, though spinning worker threads count.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from dataclasses import dataclass, field

os.environ.setdefault("JAX_PLATFORMS", "cpu")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

from bench_core import QUICK, Settings, calibrate, cpu_model, format_ratio  # noqa: E402

perf_ns = time.perf_counter_ns

#: Known builds of XLA's CPU plugin: name -> (module, library file in it).
KNOWN_BUILDS = {
    "xla-cpu-pjrt": ("xla_plugins.xla_cpu_pjrt", "xla_cpu_pjrt.so"),
    "fastatomstruct-xla-cpu": ("fastatomstruct_xla_cpu", "libpjrt_cpu.so"),
    "lammps-jax-pjrt-cpu": ("lammps_jax_pjrt_cpu", "pjrt_c_api_cpu_plugin.so"),
}


def installed_builds() -> dict[str, str]:
    """name -> library path of each known build importable here."""
    found = {}
    for name, (module, filename) in KNOWN_BUILDS.items():
        try:
            spec = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            spec = None
        if spec is None or not spec.submodule_search_locations:
            continue
        for directory in spec.submodule_search_locations:
            path = os.path.join(directory, filename)
            if os.path.isfile(path):
                found[name] = path
                break
    return found


# --------------------------------------------------------------------------------------------
# the programs: builder(jax, jnp, rng) -> (function, args, tolerance)


def shortest_paths(jax, jnp, rng, n: int = 64):
    weights = rng.uniform(1, 10, (n, n)).astype(np.float32)
    weights[rng.random((n, n)) < 0.9] = np.inf      # a sparse graph: long paths, more squarings
    np.fill_diagonal(weights, 0)

    def apsp(d):
        def square(state):
            d, _ = state
            new = jnp.min(d[:, :, None] + d[None, :, :], axis=1)
            return new, jnp.any(new != d)

        return jax.lax.while_loop(lambda s: s[1], square, (d, jnp.bool_(True)))[0]

    return apsp, (weights,), 0.0


def closure(jax, jnp, rng, n: int = 256):
    edges = (rng.random((n, n)) < 1.5 / n).astype(np.float32)

    def close(r):
        def step(state):
            r, _ = state
            new = jnp.maximum(r, (r @ r > 0).astype(r.dtype))
            return new, jnp.any(new != r)

        return jax.lax.while_loop(lambda s: s[1], step, (r, jnp.bool_(True)))[0]

    return close, (edges,), 0.0


def transformer(jax, jnp, rng, batch: int = 4, seq: int = 128, width: int = 256, heads: int = 4):
    def dense(n_in, n_out):
        return (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)

    params = {"qkv": dense(width, 3 * width), "out": dense(width, width),
              "up": dense(width, 4 * width), "down": dense(4 * width, width),
              "ln1": np.ones(width, np.float32), "ln2": np.ones(width, np.float32)}
    x = rng.standard_normal((batch, seq, width)).astype(np.float32)

    def norm(x, scale):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-5) * scale

    def block(p, x):
        b, s, w = x.shape
        q, k, v = jnp.split(norm(x, p["ln1"]) @ p["qkv"], 3, axis=-1)
        split = lambda t: t.reshape(b, s, heads, w // heads).transpose(0, 2, 1, 3)  # noqa: E731
        q, k, v = split(q), split(k), split(v)
        attention = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(w // heads), axis=-1)
        x = x + (attention @ v).transpose(0, 2, 1, 3).reshape(b, s, w) @ p["out"]
        return x + jax.nn.gelu(norm(x, p["ln2"]) @ p["up"]) @ p["down"]

    return block, (params, x), 2e-4


def _conv(jax, x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _pool(jax, x):
    return jax.lax.reduce_window(x, -np.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def conv_pool_dense(jax, jnp, rng, batch: int = 16):
    def weight(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[:-1]))).astype(np.float32)

    params = (weight(3, 3, 1, 32), weight(3, 3, 32, 64), weight(7 * 7 * 64, 10))
    x = rng.standard_normal((batch, 28, 28, 1)).astype(np.float32)

    def net(p, x):
        x = _pool(jax, jax.nn.relu(_conv(jax, x, p[0])))
        x = _pool(jax, jax.nn.relu(_conv(jax, x, p[1])))
        return x.reshape(x.shape[0], -1) @ p[2]

    return net, (params, x), 2e-4


def matmul(jax, jnp, rng, n: int = 1024):
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    return (lambda a, b: a @ b), (a, b), 2e-4


def gelu_layernorm(jax, jnp, rng, rows: int = 4096, width: int = 1024):
    x = rng.standard_normal((rows, width)).astype(np.float32)
    scale = rng.standard_normal(width).astype(np.float32)
    bias = rng.standard_normal(width).astype(np.float32)

    def f(x, scale, bias):
        y = jax.nn.gelu(x)
        mean = y.mean(-1, keepdims=True)
        var = ((y - mean) ** 2).mean(-1, keepdims=True)
        return (y - mean) * jax.lax.rsqrt(var + 1e-5) * scale + bias

    return f, (x, scale, bias), 2e-4


def resnet_block(jax, jnp, rng, batch: int = 8, size: int = 32, channels: int = 64,
                 blocks: int = 3):
    def weight(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[:-1]))).astype(np.float32)

    params = [(weight(3, 3, channels, channels), weight(3, 3, channels, channels))
              for _ in range(blocks)]
    x = rng.standard_normal((batch, size, size, channels)).astype(np.float32)

    def net(p, x):
        for w1, w2 in p:
            x = jax.nn.relu(x + _conv(jax, jax.nn.relu(_conv(jax, x, w1)), w2))
        return x.mean(axis=(1, 2))

    return net, (params, x), 2e-4


def rnn_step(jax, jnp, rng, batch: int = 64, width: int = 256, steps: int = 32):
    w = (rng.standard_normal((2 * width, 4 * width)) / np.sqrt(2 * width)).astype(np.float32)
    b = np.zeros(4 * width, np.float32)
    xs = rng.standard_normal((steps, batch, width)).astype(np.float32)

    def lstm(w, b, xs):
        def cell(carry, x):
            h, c = carry
            i, f, g, o = jnp.split(jnp.concatenate([x, h], -1) @ w + b, 4, axis=-1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (h, c), h

        zeros = jnp.zeros((xs.shape[1], width), xs.dtype)
        return jax.lax.scan(cell, (zeros, zeros), xs)[1]

    return lstm, (w, b, xs), 2e-4


def fft(jax, jnp, rng, batch: int = 8, n: int = 256):
    x = rng.standard_normal((batch, n, n)).astype(np.float32)

    def f(x):
        spectrum = jnp.fft.rfft2(x)
        return jnp.fft.irfft2(spectrum * jnp.conj(spectrum).real, s=x.shape[1:])

    return f, (x,), 1e-3


def sort(jax, jnp, rng, n: int = 1 << 18):
    x = rng.standard_normal(n).astype(np.float32)
    return (lambda x: (jnp.sort(x), jnp.argsort(x))), (x,), 0.0


def scatter_add(jax, jnp, rng, n: int = 1 << 20, bins: int = 4096):
    values = rng.standard_normal(n).astype(np.float32)
    index = rng.integers(0, bins, n).astype(np.int32)
    return (lambda v, i: jnp.zeros(bins, v.dtype).at[i].add(v)), (values, index), 1e-3


PROGRAMS = {
    "shortest-paths": (shortest_paths, "shortest paths, min-plus squaring in a while loop (64 nodes)"),
    "closure": (closure, "transitive closure, boolean matmul fixpoint (256 nodes)"),
    "transformer": (transformer, "transformer block forward (batch 4, seq 128, width 256, 4 heads)"),
    "conv-pool-dense": (conv_pool_dense, "two conv layers + pooling + dense, batch 16"),
    "matmul": (matmul, "1024x1024 f32 matmul"),
    "gelu-layernorm": (gelu_layernorm, "gelu + layer norm, 4096x1024"),
    "resnet-block": (resnet_block, "residual conv net, 3 blocks, 8x32x32x64"),
    "rnn-step": (rnn_step, "LSTM cell scanned over 32 steps, batch 64, width 256"),
    "fft": (fft, "2-D real FFT and back, 8x256x256"),
    "sort": (sort, "sort + argsort of 2^18 f32"),
    "scatter-add": (scatter_add, "scatter-add of 2^20 f32 into 4096 bins"),
}


# --------------------------------------------------------------------------------------------
# one program on every side


@dataclass
class Row:
    name: str
    label: str
    seconds: dict = field(default_factory=dict)   # side -> median seconds per call
    ratios: dict = field(default_factory=dict)    # build -> median of per-repeat ratios
    cpu_ratios: dict = field(default_factory=dict)  # the same of the process's CPU time
    differences: dict = field(default_factory=dict)  # build -> max relative difference to jax
    tolerance: float = 0.0
    notes: list = field(default_factory=list)


def max_relative_difference(expected, got) -> float:
    worst = 0.0
    for e, g in zip(expected, got):
        e, g = np.asarray(e, np.float64), np.asarray(g, np.float64)
        finite = np.isfinite(e)
        if not np.array_equal(finite, np.isfinite(g)) or not np.array_equal(e[~finite], g[~finite]):
            return float("inf")
        if finite.any():
            scale = max(float(np.max(np.abs(e[finite]))), 1e-30)
            worst = max(worst, float(np.max(np.abs(e[finite] - g[finite]))) / scale)
    return worst


def pjrt_options(pjrt, dump: str | None, overrides: list[tuple[str, str]]):
    """CompileOptions for pjrt's compiles: dumps into ``dump``, ``overrides`` as XLA options."""
    if not dump and not overrides:
        return None
    options = pjrt.CompileOptions()
    if dump:
        debug = options.executable_build_options.debug_options
        debug.xla_dump_to = dump
        debug.xla_dump_hlo_as_text = True
    options.env_option_overrides = list(overrides)
    return options


def measure(name: str, jax, pjrt, clients: dict, settings: Settings, dump: str | None,
            overrides: list[tuple[str, str]] = ()) -> Row:
    builder, label = PROGRAMS[name]
    rng = np.random.default_rng(0)
    function, args, tolerance = builder(jax, jax.numpy, rng)
    leaves, tree = jax.tree.flatten(args)
    flat = lambda *values: function(*jax.tree.unflatten(tree, values))  # noqa: E731
    jitted = jax.jit(flat)
    lowered = jitted.lower(*leaves)
    text = lowered.as_text()
    if dump:
        compiled_jax = lowered.compile(compiler_options={
            "xla_dump_to": os.path.join(dump, "jax", name), "xla_dump_hlo_as_text": True})
    else:
        compiled_jax = lowered.compile()
    jax_args = [jax.device_put(v, jax.devices("cpu")[0]) for v in leaves]
    expected = jax.tree.leaves(compiled_jax(*jax_args))
    row = Row(name, label, tolerance=tolerance)

    def jax_run(n: int) -> int:
        start = perf_ns()
        for _ in range(n):
            jax.block_until_ready(compiled_jax(*jax_args))
        return perf_ns() - start

    runs = {"jax": jax_run}
    for build, client in clients.items():
        options = pjrt_options(pjrt, dump and os.path.join(dump, build, name), overrides)
        compiled = pjrt.compile(text, client.devices()[0], options)
        placed = [pjrt.device_put(v, s) for v, s in zip(leaves, compiled.input_shardings)]
        out = compiled(*placed)
        got = list(out) if isinstance(out, tuple) else [out]
        difference = max_relative_difference(expected, [np.asarray(g) for g in got])
        agree = difference <= tolerance
        row.differences[build] = difference
        if not agree:
            row.notes.append(f"{build} DISAGREES with jax: max relative difference "
                             f"{difference:.2g} (tolerance {tolerance:g})")

        def pjrt_run(n: int, compiled=compiled, placed=placed) -> int:
            start = perf_ns()
            for _ in range(n):
                out = compiled(*placed)
                pjrt.block_until_ready(list(out) if isinstance(out, tuple) else [out])
            return perf_ns() - start

        runs[build] = pjrt_run

    sizes = {side: calibrate(run, settings.target_s) for side, run in runs.items()}
    samples: dict[str, list[float]] = {side: [] for side in runs}
    cpu: dict[str, list[float]] = {side: [] for side in runs}
    for _ in range(settings.repeats):
        for side, run in runs.items():
            cpu_start = time.process_time_ns()
            samples[side].append(run(sizes[side]) / 1e9 / sizes[side])
            cpu[side].append((time.process_time_ns() - cpu_start) / 1e9 / sizes[side])
    row.seconds = {side: statistics.median(values) for side, values in samples.items()}

    def ratios(values):
        return {build: statistics.median(p / j for p, j in zip(values[build], values["jax"]))
                for build in clients}

    row.ratios, row.cpu_ratios = ratios(samples), ratios(cpu)
    return row


# --------------------------------------------------------------------------------------------
# output


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def table(rows: list[Row], builds: list[str]) -> list[list[str]]:
    headers = (["program", "jax ms"] + [f"{b} ms" for b in builds] + [f"{b}/jax" for b in builds]
               + [f"{b}/jax CPU time" for b in builds] + ["notes"])
    cells = [headers]
    for row in rows:
        cells.append([row.label, _ms(row.seconds.get("jax"))]
                     + [_ms(row.seconds.get(b)) for b in builds]
                     + [format_ratio(row.ratios.get(b)) for b in builds]
                     + [format_ratio(row.cpu_ratios.get(b)) for b in builds]
                     + ["; ".join(row.notes + [agreement(row)])])
    return cells


def agreement(row: Row) -> str:
    differences = "/".join(f"{row.differences[b]:.2g}" for b in row.differences)
    verdict = "agree" if all(d <= row.tolerance for d in row.differences.values()) else "DISAGREE"
    return f"results {verdict} with jax (max relative difference {differences}, " \
           f"tolerance {row.tolerance:g})"


def render(cells: list[list[str]], markdown: bool) -> str:
    if markdown:
        head, *body = cells
        out = ["| " + " | ".join(head) + " |",
               "| " + " | ".join(["---"] + ["---:"] * (len(head) - 2) + ["---"]) + " |"]
        return "\n".join(out + ["| " + " | ".join(c) + " |" for c in body])
    widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]) - 1)]
    return "\n".join("  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                               for i, (v, w) in enumerate(zip(c, widths))) + "  " + c[-1]
                     for c in cells)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short repeats")
    parser.add_argument("--only", help="comma-separated programs: " + ", ".join(PROGRAMS))
    parser.add_argument("--plugin", action="append", default=[], metavar="NAME=PATH",
                        help="another build of XLA's CPU plugin (repeatable)")
    parser.add_argument("--builds", help="comma-separated builds to run (default: all found)")
    parser.add_argument("--markdown", action="store_true", help="the table as Markdown")
    parser.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                        help="an XLA option for pjrt's compiles (CompileOptions."
                             "env_option_overrides; repeatable)")
    parser.add_argument("--cpu-device-count", type=int, metavar="N",
                        help="devices of each pjrt client (create option cpu_device_count; "
                             "default: the plugin's own)")
    parser.add_argument("--dump", metavar="DIR", help="XLA dumps of every compile in DIR")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else Settings()
    names = args.only.split(",") if args.only else list(PROGRAMS)
    unknown = [n for n in names if n not in PROGRAMS]
    if unknown:
        parser.error(f"unknown program(s) {', '.join(unknown)}; choose from {', '.join(PROGRAMS)}")
    builds = installed_builds()
    for item in args.plugin:
        name, sep, path = item.partition("=")
        if not sep or not os.path.isfile(path):
            parser.error(f"--plugin takes NAME=PATH to a plugin library, got {item!r}")
        builds[name] = path
    if args.builds:
        wanted = args.builds.split(",")
        missing = [b for b in wanted if b not in builds]
        if missing:
            parser.error(f"build(s) not found here: {', '.join(missing)} (found: "
                         f"{', '.join(builds) or 'none'})")
        builds = {b: builds[b] for b in wanted}
    if not builds:
        parser.error("no build of XLA's CPU plugin found; install pjrt-cpu or pass --plugin")

    overrides = []
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--option takes NAME=VALUE, got {item!r}")
        lowered = value.lower()
        overrides.append((key, lowered == "true" if lowered in ("true", "false")
                          else int(value) if value.lstrip("-").isdigit() else value))

    import jax
    import jaxlib
    import pjrt

    clients = {}
    for build, path in builds.items():
        plugin = pjrt.load_pjrt_plugin_dynamically("bench_" + build.replace("-", "_"), path)
        create = {} if args.cpu_device_count is None else {
            "cpu_device_count": args.cpu_device_count}
        clients[build] = pjrt.make_c_api_client(plugin.name, create)
        print(f"# build {build}: PJRT {plugin.api_version[0]}.{plugin.api_version[1]}, "
              f"{len(clients[build].devices())} devices, {path}")
    print(f"# jax {jax.__version__}, jaxlib {jaxlib.__version__} (built-in CPU client); "
          f"pjrt {pjrt.__version__}")
    print(f"# cpu: {cpu_model()}, {os.cpu_count()} cores; load average "
          f"{', '.join(f'{v:.1f}' for v in os.getloadavg())}")
    if overrides:
        print("# pjrt compiles with " + ", ".join(f"{k}={v}" for k, v in overrides))
    print(f"# target {settings.target_s} s per loop, {settings.repeats} interleaved repeats; "
          f"ratio = median over repeats of build/jax")
    rows = []
    failed = False
    for name in names:
        row = measure(name, jax, pjrt, clients, settings, args.dump, overrides)
        failed = failed or any(d > row.tolerance for d in row.differences.values())
        rows.append(row)
    print(render(table(rows, list(clients)), args.markdown))
    for client in clients.values():
        client.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

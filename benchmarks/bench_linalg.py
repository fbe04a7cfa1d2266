#!/usr/bin/env python
"""Cholesky, QR and SVD of a 1024x1024 float64 matrix: pjrt (XLA's CPU plugin with
pjrt_cpu's LAPACK kernels) next to jax 0.10.2 on CPU, in the same run.

Each operation is ``jax.jit(jnp.linalg.<op>)`` lowered by jax once; jax runs it on jaxlib's
built-in CPU client, pjrt compiles the same StableHLO text on ``pjrt_cpu.library_path()``.
Both end up in the same LAPACK (SciPy's OpenBLAS, reached through
``scipy.linalg.cython_lapack``), so the comparison measures the custom-call path around it:
argument handling, the FFI call, workspace queries and the jax-lowered code around the call.

Timing: inputs are placed on the device once; one sample is one call followed by a wait for
its results (``block_until_ready``), with no copy to the host. The libraries' samples are
interleaved so that drift in machine speed hits both alike; the table shows medians.
Goal: pjrt at most 1.2x jax's time.

Usage::

    python benchmarks/bench_linalg.py               # 1024x1024, 15 samples each
    python benchmarks/bench_linalg.py --size 512 --repeats 5
    python benchmarks/bench_linalg.py --markdown    # the table as Markdown
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

#: pjrt's time over jax's that counts as on target.
GOAL_RATIO = 1.2


def _operations(jnp):
    return {
        "cholesky": (jnp.linalg.cholesky, "spd"),
        "qr": (jnp.linalg.qr, "general"),
        "svd": (jnp.linalg.svd, "general"),
    }


def _input(kind: str, size: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size))
    if kind == "spd":
        return a @ a.T + size * np.eye(size)
    return a


def _time(call, wait) -> float:
    start = time.perf_counter()
    wait(call())
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1024, help="matrix order (default 1024)")
    parser.add_argument("--repeats", type=int, default=15, help="timed samples per library")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)

    import pjrt
    import pjrt_cpu

    pjrt.load_pjrt_plugin_dynamically("cpu", pjrt_cpu.library_path())
    client = pjrt.make_c_api_client("cpu")
    pjrt_cpu.register_lapack_kernels()
    device = client.local_devices()[0]

    rows = []
    for name, (function, kind) in _operations(jnp).items():
        a = _input(kind, args.size)
        jitted = jax.jit(function)
        text = jitted.lower(a).as_text()
        executable = client.compile_and_load(text, [device])
        on_jax = jax.device_put(a)
        on_pjrt = client.buffer_from_pyval(a, device)

        def run_jax():
            return jitted(on_jax)

        def run_pjrt():
            return executable.execute([on_pjrt])

        # Warm up both (first-call work, page faults, OpenBLAS thread start-up), and check
        # that both computed the same thing.
        jax_out = [np.asarray(x) for x in jax.tree_util.tree_leaves(run_jax())]
        pjrt_out = [np.asarray(x) for x in run_pjrt()]
        for ours, theirs in zip(pjrt_out, jax_out):
            np.testing.assert_allclose(ours, theirs, rtol=1e-8, atol=1e-8 * args.size)

        jax_times, pjrt_times = [], []
        for _ in range(args.repeats):
            jax_times.append(_time(run_jax, jax.block_until_ready))
            pjrt_times.append(_time(run_pjrt, pjrt.block_until_ready))
        jax_ms = statistics.median(jax_times) * 1e3
        pjrt_ms = statistics.median(pjrt_times) * 1e3
        rows.append((name, pjrt_ms, jax_ms, pjrt_ms / jax_ms))

    title = (f"{args.size}x{args.size} float64, median of {args.repeats}; jax {jax.__version__}, "
             f"{platform.machine()}, {os.cpu_count()} CPUs")
    header = ("operation", "pjrt ms", "jax ms", "pjrt/jax", f"goal <= {GOAL_RATIO}x")
    lines = []
    for name, pjrt_ms, jax_ms, ratio in rows:
        lines.append((name, f"{pjrt_ms:.1f}", f"{jax_ms:.1f}", f"{ratio:.2f}x",
                      "ok" if ratio <= GOAL_RATIO else "MISSED"))
    print(title)
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join("---" for _ in header) + "|")
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        widths = [max(len(str(r[i])) for r in (header, *lines)) for i in range(len(header))]
        for line in (header, *lines):
            print("  ".join(str(c).rjust(w) for c, w in zip(line, widths)))


if __name__ == "__main__":
    main()

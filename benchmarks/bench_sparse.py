#!/usr/bin/env python
"""jaxlib's CPU sparse kernel (``cpu_csr_sparse_dense_ffi``, pjrt-cpu's ``cpu_sparse``) next to
jax's own: a BCSR matrix times a dense one, lowered once by jax, run by pjrt on XLA's CPU
plugin (pjrt-cpu's handler) and by jax on its built-in CPU client (jaxlib's handler).

Cases (float32, 1% non-zeros unless named):

  4000x4000 @ 4000x64     the product the kernel's README figures are for
  4000x4000 @ 4000        a matrix-vector product
  20000x20000 @ 20000x8   a larger, sparser matrix (0.1%)
  500x500 @ 500x16        a small one (below the size the kernel splits over threads)

Each side runs with its inputs on the device, its result checked against jax's first. Runs
are interleaved: per repeat, one short loop (about 20 ms) of each side, so drift in the
machine's load hits all alike; the cells are the median over repeats of the wall-clock time
per call, with the first quartile beside it (what a loaded machine's bursts sway least), and
the ratio is the median of the per-repeat ratios to jax. ``pjrt 1 thread`` is pjrt-cpu's kernel held to the calling thread
(``cpu_sparse.set_max_threads(1)``: the kernel before it split rows over threads).

Usage::

    python benchmarks/bench_sparse.py             # 41 repeats (about a minute)
    python benchmarks/bench_sparse.py --repeats 11
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

CASES = [
    ("4000x4000 @ 4000x64", 4000, 4000, (64,), 0.01),
    ("4000x4000 @ 4000", 4000, 4000, (), 0.01),
    ("20000x20000 @ 20000x8", 20000, 20000, (8,), 0.001),
    ("500x500 @ 500x16", 500, 500, (16,), 0.01),
]


def _loop(call, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - start) / n


def _size(call, target_s: float = 0.02) -> int:
    n = 1
    while True:
        elapsed = _loop(call, n) * n
        if elapsed >= target_s / 4:
            return max(1, int(n * target_s / elapsed))
        n *= 4


def measure(repeats: int) -> list[dict]:
    import jax
    from jax.experimental import sparse

    import pjrt
    import pjrt_cpu
    from pjrt_cpu import cpu_sparse

    pjrt_cpu.initialize()
    client = pjrt.make_cpu_client(1)
    threaded = hasattr(cpu_sparse, "set_max_threads")
    rows_out = []
    for label, rows, cols, rhs_shape, density in CASES:
        rng = np.random.default_rng(0)
        # The stored entries drawn directly (a dense 20000 x 20000 matrix would take 1.6 GB).
        flat = np.unique(rng.integers(0, rows * cols, int(rows * cols * density)))
        entry_rows, entry_cols = np.divmod(flat, cols)
        indptr = np.searchsorted(entry_rows, np.arange(rows + 1)).astype(np.int32)
        values = rng.standard_normal(len(flat)).astype(np.float32)
        x = rng.standard_normal((cols, *rhs_shape)).astype(np.float32)
        matrix = sparse.BCSR((values, entry_cols.astype(np.int32), indptr), shape=(rows, cols))
        product = jax.jit(lambda m, v: m @ v)
        leaves = jax.tree_util.tree_leaves((matrix, x))
        jax_args = [jax.device_put(leaf) for leaf in leaves]
        expected = np.asarray(product(matrix, x))
        text = product.lower(matrix, x).as_text()
        compiled = pjrt.compile(text, client=client)
        placed = [pjrt.device_put(np.asarray(leaf), sharding)
                  for leaf, sharding in zip(leaves, compiled.input_shardings)]
        got = np.asarray(compiled(*placed))
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * cols)

        def jax_call():
            jax.block_until_ready(product(*jax.tree_util.tree_unflatten(
                jax.tree_util.tree_structure((matrix, x)), jax_args)))

        def pjrt_call():
            pjrt.block_until_ready([compiled(*placed)])

        sides = {"jax": jax_call, "pjrt": pjrt_call}
        if threaded:
            sides["pjrt 1 thread"] = pjrt_call  # run with the kernel held to one thread

        def timed(side, n=None):
            one = side == "pjrt 1 thread"
            previous = cpu_sparse.set_max_threads(1) if one else None
            try:
                return _size(sides[side]) if n is None else _loop(sides[side], n)
            finally:
                if one:
                    cpu_sparse.set_max_threads(previous)

        sizes = {side: timed(side) for side in sides}
        samples: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(repeats):
            for side in sides:
                samples[side].append(timed(side, sizes[side]))
        row = {"case": label, "nnz": len(flat)}
        for side, values in samples.items():
            row[side] = statistics.median(values)
            row[f"{side} q1"] = statistics.quantiles(values, n=4)[0]
            if side != "jax":
                row[f"{side} / jax"] = statistics.median(
                    p / j for p, j in zip(values, samples["jax"]))
        rows_out.append(row)
    return rows_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=41)
    arguments = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores")
    for row in measure(arguments.repeats):
        cells = [f"{row['case']:<24} nnz {row['nnz']:>7}"]
        for side in ("jax", "pjrt", "pjrt 1 thread"):
            if side in row:
                cells.append(f"{side} {row[side] * 1e3:6.3f} ms (q1 {row[side + ' q1'] * 1e3:.3f})")
                if side != "jax":
                    cells.append(f"({row[f'{side} / jax']:.2f}x jax)")
        print("  ".join(cells))


if __name__ == "__main__":
    main()

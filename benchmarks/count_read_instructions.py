#!/usr/bin/env python
"""Instructions per host read, counted by callgrind: deterministic where wall-clock timings on a
shared machine are not.

Each mode runs one loop of N iterations after a warm-up, and only that loop is counted (the
script runs itself under ``valgrind --tool=callgrind``, collecting inside one call of
``itertools.filterfalse``'s ``next``, which nothing else here uses). Modes:

* ``read``: ``np.asarray(execute([a, b])[0])`` of tiny_tanh (row (b) of bench_core.py);
* ``dispatch``: ``execute([a, b])`` alone (the result freed at the next call);
* ``readmany``: ``np.asarray`` of N ready results made beforehand (the read alone);
* ``readsame``: ``np.asarray`` of one array over and over (its cached copy);
* ``jax-read``, ``jax-dispatch``, ``jax-readmany``: the same through jax on its CPU client.

Run::

    python benchmarks/count_read_instructions.py [--n 2000] [MODE ...]

It prints instructions per iteration for each mode (about a minute each: valgrind is slow).
"""
from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TINY_TANH = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "tiny_tanh.mlir")
MODES = ("read", "dispatch", "readmany", "readsame", "jax-read", "jax-dispatch", "jax-readmany")


def loop_body(mode: str, n: int):
    """The function to count for ``mode``, after its warm-up."""
    import numpy as np

    a_host, b_host = np.arange(8, dtype=np.float32), np.ones(8, dtype=np.float32)
    if mode.startswith("jax-"):
        import jax
        import jax.numpy as jnp

        f = jax.jit(lambda a, b: jnp.tanh(a * b + 1))
        a, b = jax.device_put(a_host), jax.device_put(b_host)

        def execute(arguments):
            return [f(*arguments)]
        mode = mode[len("jax-"):]
    else:
        import pjrt
        import pjrt_cpu

        pjrt.load_pjrt_plugin_dynamically("cpu", pjrt_cpu.library_path())
        client = pjrt.make_c_api_client("cpu")
        with open(TINY_TANH) as file:
            executable = client.compile_and_load(file.read(), client.local_devices()[:1])
        a, b = client.buffer_from_pyval(a_host), client.buffer_from_pyval(b_host)
        execute = executable.execute
    expected = np.tanh(a_host * b_host + 1)
    assert np.allclose(np.asarray(execute([a, b])[0]), expected, rtol=1e-6)
    asarray = np.asarray

    def make_loop(count: int):
        if mode == "read":
            def body():
                for _ in range(count):
                    asarray(execute([a, b])[0])
        elif mode == "dispatch":
            def body():
                for _ in range(count):
                    execute([a, b])
        elif mode == "readmany":
            ready = [execute([a, b])[0] for _ in range(count)]
            for x in ready:
                x.block_until_ready()

            def body():
                for x in ready:
                    asarray(x)
        elif mode == "readsame":
            x = execute([a, b])[0]

            def body():
                for _ in range(count):
                    asarray(x)
        else:
            raise SystemExit(f"unknown mode {mode!r}; pick from {', '.join(MODES)}")
        return body

    for _ in range(3):
        make_loop(200)()
    return make_loop(n)


def count(mode: str, n: int) -> float:
    """Instructions per iteration of ``mode``'s loop, from a callgrind run of this script."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "callgrind.out")
        subprocess.run(
            ["valgrind", "--tool=callgrind", "--collect-atstart=no",
             "--toggle-collect=filterfalse_next", f"--callgrind-out-file={out}",
             sys.executable, os.path.abspath(__file__), "--counted", mode, "--n", str(n)],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONHASHSEED": "0", "JAX_PLATFORMS": "cpu"})
        with open(out) as file:
            totals = re.search(r"^totals:\s+(\d+)", file.read(), re.MULTILINE)
    if totals is None:
        raise RuntimeError("callgrind wrote no totals")
    return int(totals.group(1)) / n


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modes", nargs="*", default=["read", "dispatch", "readmany", "readsame"])
    parser.add_argument("--n", type=int, default=2000, help="iterations counted (default 2000)")
    parser.add_argument("--counted", help=argparse.SUPPRESS)  # the run under valgrind
    args = parser.parse_args(argv)
    if args.counted:
        body = loop_body(args.counted, args.n)
        list(itertools.filterfalse(lambda _: body(), [None]))  # the counted region
        return 0
    print(f"# instructions per iteration (callgrind, N={args.n}, after warm-up)")
    for mode in args.modes:
        print(f"{mode:<14} {count(mode, args.n):10.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Host instructions per 8-device SPMD call (bench_sharding.py's (b)), counted by callgrind.

Wall-clock timings on a busy 2-core machine move by 2-10x from run to run; the instructions the
calling thread executes per call do not (to about 1%). This runs itself under
``valgrind --tool=callgrind`` with instrumentation off until the measured loop, counts the
loop's instructions on the calling thread only (the plugin's device threads spin and wait, so
theirs depend on scheduling), and prints thousands of instructions (kIr) per call:

  own       CompiledProgram(x), x placed with the program's own input sharding, N calls then
            a wait on the last result
  named     the same, x placed with an equal NamedSharding the user built
  blocking  CompiledProgram(x).block_until_ready() on every call
  floor     pjrt's C floor: the bare launch and the freeing of the outputs (bench_sharding.py)
  jax_calls, jax_blocking
            jax's jitted function the same two ways (jax's calling thread)

Needs valgrind, its ``valgrind/callgrind.h`` and a C compiler (for a two-function marker
library loaded with ctypes). Usage::

    python benchmarks/count_sharding.py                 # pjrt's four rows and jax's two
    python benchmarks/count_sharding.py --calls 400 --modes own,named
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PJRT_MODES = ("own", "named", "blocking", "floor")
JAX_MODES = ("jax_calls", "jax_blocking")

MARKER_C = """
#include <valgrind/callgrind.h>
void count_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void count_stop(const char* name) { CALLGRIND_DUMP_STATS_AT(name); CALLGRIND_STOP_INSTRUMENTATION; }
"""


def build_marker(directory: str) -> str:
    source = os.path.join(directory, "marker.c")
    library = os.path.join(directory, "libmarker.so")
    with open(source, "w") as f:
        f.write(MARKER_C)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", library, source], check=True)
    return library


def pjrt_loops(n: int) -> dict:
    import numpy as np

    sys.path.insert(0, HERE)
    from types import SimpleNamespace

    from bench_sharding import NUM_DEVICES, SPMD_AFFINE_MLIR, c_floor

    import pjrt
    import pjrt_cpu

    pjrt.load_pjrt_plugin_dynamically("cpu", pjrt_cpu.library_path())
    client = pjrt.make_c_api_client("cpu", {"cpu_device_count": NUM_DEVICES})
    mesh = pjrt.Mesh(np.array(client.devices()[:NUM_DEVICES], dtype=object), ("x",))
    compiled = pjrt.compile(SPMD_AFFINE_MLIR, mesh)
    host = np.arange(NUM_DEVICES, dtype=np.float32)
    own = pjrt.device_put(host, compiled.input_shardings[0])
    named = pjrt.device_put(host, pjrt.NamedSharding(mesh, pjrt.P("x")))
    for x in (own, named):
        np.testing.assert_array_equal(np.asarray(compiled(x)), host * 2 + 1)

    def calls(x):
        def run():
            for _ in range(n):
                r = compiled(x)
            r.block_until_ready()
        return run

    def blocking():
        for _ in range(n):
            compiled(own).block_until_ready()

    floor = c_floor(SimpleNamespace(client=client), compiled, own, host * 2 + 1)
    return {"own": calls(own), "named": calls(named), "blocking": blocking,
            "floor": lambda: floor(n)}


def jax_loops(n: int) -> dict:
    import jax
    import numpy as np

    jax.config.update("jax_num_cpu_devices", 8)
    mesh = jax.sharding.Mesh(np.array(jax.devices("cpu")[:8]), ("x",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    f = jax.jit(lambda v: v * 2 + 1, in_shardings=sharding, out_shardings=sharding)
    x = jax.device_put(np.arange(8, dtype=np.float32), sharding)
    f(x).block_until_ready()

    def calls():
        for _ in range(n):
            r = f(x)
        r.block_until_ready()

    def blocking():
        for _ in range(n):
            f(x).block_until_ready()
    return {"jax_calls": calls, "jax_blocking": blocking}


def child(args) -> None:
    marker = ctypes.CDLL(args.marker)
    modes = args.modes.split(",")
    loops = pjrt_loops(args.calls) if any(m in PJRT_MODES for m in modes) else {}
    if any(m in JAX_MODES for m in modes):
        loops.update(jax_loops(args.calls))
    for mode in modes:
        loops[mode]()  # warm
        marker.count_start()
        loops[mode]()
        marker.count_stop(mode.encode())


def parent(args) -> int:
    modes = args.modes.split(",")
    with tempfile.TemporaryDirectory() as directory:
        marker = build_marker(directory)
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        # pjrt and jax each in their own process (one of them would load the other's CPU
        # runtime otherwise).
        for group in ([m for m in modes if m in PJRT_MODES], [m for m in modes if m in JAX_MODES]):
            if not group:
                continue
            command = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                       "--separate-threads=yes", f"--callgrind-out-file={directory}/out.%p",
                       sys.executable, os.path.abspath(__file__), "--child", "--marker", marker,
                       "--calls", str(args.calls), "--modes", ",".join(group)]
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                sys.stderr.write(done.stderr[-4000:])
                return done.returncode
        # Each dump of the calling thread (thread 1) is one mode.
        for path in sorted(glob.glob(os.path.join(directory, "out.*.*-01"))):
            with open(path) as f:
                text = f.read()
            name = text.split("Client Request: ", 1)[1].split("\n", 1)[0]
            total = int(text.split("\nsummary: ", 1)[1].split("\n", 1)[0])
            print(f"{name:14s} {total / args.calls / 1000:8.1f} kIr/call (calling thread)")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per counted loop")
    parser.add_argument("--modes", default=",".join(PJRT_MODES + JAX_MODES))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--marker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())

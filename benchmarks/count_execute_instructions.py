#!/usr/bin/env python
"""Instructions per ``execute`` call, counted by callgrind: deterministic on a busy machine.

Each mode makes 2000 calls of tiny_tanh (two float32[8] inputs) after a warm-up, inside
``operator.call``, and callgrind counts only what runs inside it (``--toggle-collect``):

* ``floor``: the shim's launch and the output's destroy, with preallocated cdata;
* ``dev``: ``execute([a, b])`` with device-resident Arrays (each result freed by the next);
* ``np``: ``execute([a_np, b_np], copy_host_values=True)``;
* ``jax``, ``jaxnp``: jax's jitted ``tanh(a * b + 1)`` with device arrays / numpy arrays.

Run (needs valgrind; each mode takes a minute or more, most of it start-up)::

    python benchmarks/count_execute_instructions.py [mode ...]     # default: floor dev np jax jaxnp
"""
from __future__ import annotations

import operator
import os
import subprocess
import sys
import tempfile

CALLS = 2000
MODES = ("floor", "dev", "np", "jax", "jaxnp")
TINY_TANH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests",
                         "fixtures", "tiny_tanh.mlir")


def target(mode: str) -> None:
    """The measured process: warm up, then CALLS calls inside operator.call."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import numpy as np

    a_host, b_host = np.arange(8, dtype=np.float32), np.ones(8, dtype=np.float32)
    if mode.startswith("jax"):
        import jax
        import jax.numpy as jnp

        f = jax.jit(lambda x, y: jnp.tanh(x * y + 1))
        a, b = (jax.device_put(a_host), jax.device_put(b_host)) if mode == "jax" else (a_host,
                                                                                      b_host)
        call = lambda: f(a, b)  # noqa: E731
    else:
        import pjrt
        import pjrt_cpu
        from pjrt._pjrt_cffi import ffi, lib

        pjrt.load_pjrt_plugin_dynamically("cpu", pjrt_cpu.library_path())
        client = pjrt.make_c_api_client("cpu")
        exe = client.compile_and_load(open(TINY_TANH).read(), client.local_devices()[:1])
        a, b = client.buffer_from_pyval(a_host), client.buffer_from_pyval(b_host)
        execute = exe.execute
        if mode == "dev":
            call = lambda: execute([a, b])  # noqa: E731
        elif mode == "np":
            call = lambda: execute([a_host, b_host], copy_host_values=True)  # noqa: E731
        else:
            table, pointer = exe._handle.api.table, exe._launcher.pointer
            arguments = ffi.new("PJRT_Buffer*[]", [a.live_buffers()[0], b.live_buffers()[0]])
            outputs, error = ffi.new("PJRT_Buffer*[]", 1), ffi.new("PJRT_Error **")
            launch, destroy, null = lib.pjrt_shim_execute, lib.pjrt_shim_buffers_destroy, ffi.NULL

            def call():
                launch(table, pointer, arguments, 1, 2, outputs, 1, null, 0, null, null, error)
                destroy(table, outputs, 1)

    def run(n: int) -> None:
        for _ in range(n):
            call()

    run(300)
    operator.call(run, CALLS)


def count(mode: str) -> int:
    """Instructions per call of ``mode``, from a callgrind run of this script."""
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "callgrind.out")
        subprocess.run(["valgrind", "--tool=callgrind", "--toggle-collect=_operator_call",
                        f"--callgrind-out-file={out}", sys.executable, __file__, "--target",
                        mode], check=True, capture_output=True)
        with open(out) as stream:
            totals = next(line for line in stream if line.startswith("totals:"))
    return int(totals.split()[1]) // CALLS


def main(argv: list[str]) -> int:
    if argv[:1] == ["--target"]:
        target(argv[1])
        return 0
    for mode in argv or MODES:
        print(f"{mode:6} {count(mode):8,} instructions per call", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

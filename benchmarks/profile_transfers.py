#!/usr/bin/env python
"""Why a 64 MiB host-to-device copy on the CPU plugin runs at half of memcpy, and what helps.

Compares, as medians of single transfers of a 64 MiB float32 array (16 bytes past a page
boundary, like numpy's own allocations, so nothing can alias it):

* ``np.empty`` + ``np.copyto`` (fresh pages; numpy asks for transparent huge pages);
* ``client.buffer_from_pyval(x)`` (the plugin copies into memory it allocates itself);
* a prototype of another strategy: pjrt copies into a 64-byte-aligned numpy buffer and hands
  that to the plugin with ``ZERO_COPY`` semantics (the array keeps the buffer alive);

each with numpy's huge-page advice on and off, plus ``np.asarray`` (device to host) of a fresh
result. Nothing in pjrt is modified. Run::

    python benchmarks/profile_transfers.py [--quick]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

import pjrt
import pjrt_cpu

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_core import ADD_ZERO_MLIR, BIG_BYTES, BIG_ELEMENTS, aligned_empty  # noqa: E402

perf_ns = time.perf_counter_ns


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    repeats = 3 if args.quick else 15

    pjrt.load_pjrt_plugin_dynamically("cpu", pjrt_cpu.library_path())
    client = pjrt.make_c_api_client("cpu")
    device = client.local_devices()[0]
    zero_copy = pjrt.HostBufferSemantics.ZERO_COPY
    x = aligned_empty(BIG_ELEMENTS + 16)[4:4 + BIG_ELEMENTS]
    x[:] = np.arange(BIG_ELEMENTS, dtype=np.float32)
    preallocated = aligned_empty(BIG_ELEMENTS)
    np.copyto(preallocated, x)
    add_zero = client.compile_and_load(ADD_ZERO_MLIR, [device])
    on_device = client.buffer_from_pyval(x)

    def median_gbps(shot) -> float:
        shot(), shot()
        return BIG_BYTES / (statistics.median(shot() for _ in range(repeats)) / 1e9)

    def memcpy_preallocated():
        t0 = perf_ns()
        np.copyto(preallocated, x)
        return perf_ns() - t0

    def memcpy_fresh():
        t0 = perf_ns()
        fresh = np.empty_like(x)
        np.copyto(fresh, x)
        elapsed = perf_ns() - t0
        del fresh
        return elapsed

    def plugin_copy():
        t0 = perf_ns()
        y = client.buffer_from_pyval(x, device)
        y.block_until_ready()
        elapsed = perf_ns() - t0
        y.delete()
        return elapsed

    def own_copy_then_zero_copy():
        t0 = perf_ns()
        staging = aligned_empty(BIG_ELEMENTS, alignment=64)
        np.copyto(staging, x)
        y = client.buffer_from_pyval(staging, device, host_buffer_semantics=zero_copy)
        y.block_until_ready()
        elapsed = perf_ns() - t0
        assert y.unsafe_buffer_pointer() == staging.ctypes.data, "the plugin copied after all"
        y.delete()
        return elapsed

    def read_fresh():
        y = add_zero.execute([on_device])[0].block_until_ready()
        t0 = perf_ns()
        host = np.asarray(y)
        elapsed = perf_ns() - t0
        del host
        y.delete()
        return elapsed

    print(f"# 64 MiB float32, medians of {repeats}; GB/s = 1e9 bytes/s; {os.cpu_count()} CPUs; "
          f"THP: {open('/sys/kernel/mm/transparent_hugepage/enabled').read().strip()}")
    print(f"{'numpy huge pages':<17}{'memcpy prealloc':>16}{'memcpy fresh':>14}"
          f"{'buffer_from_pyval':>19}{'own copy+ZERO_COPY':>20}{'np.asarray(fresh)':>19}")
    set_hugepage = np._core.multiarray._set_madvise_hugepage
    previous = set_hugepage(True)
    try:
        for hugepage in (True, False):
            set_hugepage(hugepage)
            cells = [median_gbps(f) / 1e9 for f in (memcpy_preallocated, memcpy_fresh, plugin_copy,
                                                    own_copy_then_zero_copy, read_fresh)]
            print(f"{'on' if hugepage else 'off':<17}" + "".join(
                f"{c:>{w}.2f}" for c, w in zip(cells, (16, 14, 19, 20, 19))))
    finally:
        set_hugepage(previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())

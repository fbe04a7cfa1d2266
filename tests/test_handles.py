"""Lifetimes over a whole process: exit with everything still alive, and long loops."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import numpy as np

from conftest import cpu_plugin_path
from fixtures import programs

TINY = programs.get("tiny_tanh")


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_exit_with_clients_arrays_executables_and_views_alive(cpu_plugin):
    """Nothing is closed by hand: the atexit hook frees it all, and the exit is clean."""
    script = textwrap.dedent(f"""
        import numpy as np, pjrt
        pjrt.load_pjrt_plugin_dynamically("cpu", {cpu_plugin_path(cpu_plugin.name)!r})
        client = pjrt.make_c_api_client("cpu", {{"cpu_device_count": 2}})
        executable = client.compile_and_load(open({TINY.path()!r}).read())
        a = client.buffer_from_pyval(np.ones(8, np.float32))
        out = executable.execute([a, a])
        big = client.buffer_from_pyval(np.ones(1 << 18, np.float32))
        view = np.asarray(big)                  # a zero-copy view, alive at exit
        cycle = {{"client": client, "arrays": [a, big]}}
        cycle["self"] = cycle                   # and a reference cycle through the client
        print("ok", float(np.asarray(out[0])[0]), float(view[-1]))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("ok ")
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr


def test_long_loops_do_not_grow_memory(client):
    executable = client.compile_and_load(TINY.read_text())
    inputs = TINY.inputs()

    def round_trip():
        arrays = [client.buffer_from_pyval(x) for x in inputs]
        (out,) = executable.execute(arrays)
        np.asarray(out)

    for _ in range(2000):  # warm up: allocator pools and caches settle
        round_trip()
    gc.collect()
    before = _resident_bytes()
    for _ in range(20000):
        round_trip()
    gc.collect()
    grown = _resident_bytes() - before
    # 20000 rounds of 3 buffers: one leaked buffer (>= 32 bytes plus the plugin's own records)
    # per round would show as several MB.
    assert grown < 4 << 20, f"resident memory grew by {grown / 2**20:.1f} MiB"

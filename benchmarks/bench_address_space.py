#!/usr/bin/env python
"""Address space and resident memory after the first tiny program: pjrt next to jax 0.10.2
driving the same XLA CPU plugin library.

Each figure comes from a fresh process that brings the default backend up (pjrt: the plugin
named by ``PJRT_NAMES_AND_LIBRARY_PATHS``; jax: the same library through
``xla_bridge.register_plugin``), runs ``tanh`` on 8 floats and reads the result, then reports
its virtual size (``VmSize``, what ``ulimit -v`` limits) and resident set (``VmRSS``). Both XLA
CPU builds of the tests are measured where installed (``xla-cpu-pjrt``, PJRT API 0.81, and
``fastatomstruct-xla-cpu``, 0.106). Fresh processes are repeated and the medians printed; the
figures barely move between runs.

Usage::

    python benchmarks/bench_address_space.py            # 3 processes per cell
    python benchmarks/bench_address_space.py --runs 7
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys

#: name -> (module holding the library, its file name)
PLUGINS = {
    "xla-cpu-pjrt (0.81)": ("xla_plugins.xla_cpu_pjrt", "xla_cpu_pjrt.so"),
    "fastatomstruct-xla-cpu (0.106)": ("fastatomstruct_xla_cpu", "libpjrt_cpu.so"),
}

REPORT = """
with open("/proc/self/status") as status:
    fields = dict(line.split(":", 1) for line in status)
print(int(fields["VmSize"].split()[0]) >> 10, int(fields["VmRSS"].split()[0]) >> 10)
"""

CHILD = {
    "pjrt": """
import numpy as np, pjrt
f = pjrt.compile('''func.func public @main(%a: tensor<8xf32>) -> tensor<8xf32> {
  %0 = stablehlo.tanh %a : tensor<8xf32>
  return %0 : tensor<8xf32>
}''', pjrt.devices()[0])
np.asarray(f(np.ones(8, np.float32)))
""" + REPORT,
    "jax": """
import sys, numpy as np
import jax, jax.numpy as jnp
from jax._src import xla_bridge
xla_bridge.register_plugin("cpu_plugin", library_path=sys.argv[1], priority=500)
jax.config.update("jax_platforms", "cpu_plugin")
np.asarray(jax.jit(jnp.tanh)(np.ones(8, np.float32)))
""" + REPORT,
}


def library(module: str, filename: str) -> str | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    for directory in spec.submodule_search_locations:
        path = os.path.join(directory, filename)
        if os.path.isfile(path):
            return path
    return None


def measure(host: str, path: str) -> tuple[int, int]:
    """(VmSize MiB, VmRSS MiB) of one fresh process of ``host`` on the library ``path``."""
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith(("PJRT_", "JAX_PLATFORMS"))}
    environment.update(PJRT_PLATFORMS="benchcpu", PJRT_NAMES_AND_LIBRARY_PATHS=f"benchcpu:{path}")
    result = subprocess.run([sys.executable, "-c", CHILD[host], path], capture_output=True,
                            text=True, env=environment, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"{host} failed:\n{result.stderr[-2000:]}")
    size, resident = result.stdout.split()[-2:]
    return int(size), int(resident)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per cell")
    options = parser.parse_args()
    hosts = ["pjrt"]
    if importlib.util.find_spec("jax") is not None:
        hosts.append("jax")
    else:
        print("# SKIPPED jax: not installed")
    print("| plugin | host | address space (VmSize) | resident (VmRSS) | pjrt/jax address space |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, (module, filename) in PLUGINS.items():
        path = library(module, filename)
        if path is None:
            print(f"# SKIPPED {name}: not installed")
            continue
        medians = {}
        for host in hosts:
            samples = [measure(host, path) for _ in range(options.runs)]
            medians[host] = (statistics.median(s[0] for s in samples),
                             statistics.median(s[1] for s in samples))
        for host in hosts:
            size, resident = medians[host]
            ratio = (f"{medians['pjrt'][0] / medians['jax'][0]:.2f}x"
                     if host == "pjrt" and "jax" in medians else "")
            print(f"| {name} | {host} | {size:.0f} MiB | {resident:.0f} MiB | {ratio} |")


if __name__ == "__main__":
    main()

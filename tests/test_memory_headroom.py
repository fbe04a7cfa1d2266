"""Out of memory inside a plugin call (pjrt._runtime.memory_headroom).

Under an address-space limit (``RLIMIT_AS``), a launch whose outputs and kernel workspace do
not fit can end the process inside ``PJRT_LoadedExecutable_Execute`` (the 0.81 CPU build
crashes with SIGSEGV on a 4096 x 4096 product with 64 MiB left). pjrt refuses such a launch
with ``MemoryError`` before the plugin runs it. Each case runs in a child process, since the
limit is process-wide and the failure it guards against kills the process.
"""
from __future__ import annotations

import json
import resource

import pytest

from conftest import CPU_PLUGINS, cpu_plugin_path, run_python

N = 4096

#: A product of two N x N float32 matrices (64 MiB out; the plugins report no temporaries).
PRODUCT = f"""
func.func public @main(%a: tensor<{N}x{N}xf32>, %b: tensor<{N}x{N}xf32>) -> tensor<{N}x{N}xf32> {{
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<{N}x{N}xf32>, tensor<{N}x{N}xf32>) -> tensor<{N}x{N}xf32>
  return %0 : tensor<{N}x{N}xf32>
}}"""

#: 4 KiB out: a launch that needs no fresh memory of note.
SMALL = """
func.func public @main(%a: tensor<1024xf32>) -> tensor<1024xf32> {
  %0 = stablehlo.add %a, %a : tensor<1024xf32>
  return %0 : tensor<1024xf32>
}"""

#: argv: plugin name, its library, MiB left under the limit, which program. Prints what the
#: launch under the limit did, and what a launch did once the limit was lifted again.
CHILD = """
import json, resource, sys
import numpy as np
import pjrt
from pjrt._runtime import memory_headroom

name, path, headroom, which = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
program, size = (sys.argv[5], int(sys.argv[6])) if which == "product" else (sys.argv[7], 1024)
pjrt.load_pjrt_plugin_dynamically(name, path)
client = pjrt.make_c_api_client(name, {"cpu_device_count": 1})
executable = client.compile_and_load(program)
shape = (size, size) if which == "product" else (size,)
x = client.buffer_from_pyval(np.ones(shape, np.float32))
want = float(size) if which == "product" else 2.0
arguments = [x, x] if which == "product" else [x]
report = {"limited_before": memory_headroom.address_space_limit() is not None}
limit = memory_headroom.address_space_used() + (headroom << 20)
if len(sys.argv) > 8 and sys.argv[8] == "ctypes":  # set behind Python's resource module
    import ctypes
    class rlimit(ctypes.Structure):
        _fields_ = [("cur", ctypes.c_uint64), ("max", ctypes.c_uint64)]
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.setrlimit(resource.RLIMIT_AS, ctypes.byref(rlimit(limit, 2**64 - 1))) == 0
else:
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
report["limited"] = memory_headroom.address_space_limit() is not None
try:
    (y,) = executable.execute(arguments)
    report["ran"] = bool((np.asarray(y) == want).all())
except MemoryError as error:
    report["refused"] = str(error)
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
report["limited_after"] = memory_headroom.address_space_limit() is not None
(y,) = executable.execute(arguments)
report["ran_after"] = bool((np.asarray(y) == want).all())
print(json.dumps(report), flush=True)
"""


def _run(plugin: str, headroom_mib: int, which: str, setter: str = "resource") -> dict:
    result = run_python(CHILD, plugin, cpu_plugin_path(plugin), headroom_mib, which, PRODUCT, N,
                        SMALL, setter, timeout=300, check=False)
    assert result.returncode == 0, (f"the child ended with {result.returncode}:\n"
                                    f"{result.stdout[-2000:]}{result.stderr[-4000:]}")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["limited"] and not report["limited_after"], report
    assert report["ran_after"], report  # the limit lifted, the same launch runs
    return report


@pytest.mark.parametrize("plugin", sorted(CPU_PLUGINS))
def test_a_launch_that_does_not_fit_under_the_limit_is_refused(plugin):
    # 64 MiB left: the output fits, the product's workspace does not (0.81 crashed here).
    report = _run(plugin, 64, "product")
    assert "refused" in report, report
    message = report["refused"]
    assert "RLIMIT_AS" in message and "64 MiB for its outputs" in message, message
    assert "The plugin was not called" in message, message


@pytest.mark.parametrize("plugin", sorted(CPU_PLUGINS))
def test_a_launch_with_room_under_the_limit_runs(plugin):
    report = _run(plugin, 400, "product")
    assert report.get("ran"), report


@pytest.mark.parametrize("plugin", sorted(CPU_PLUGINS))
def test_a_small_launch_is_not_refused_for_a_reserve_it_does_not_need(plugin):
    report = _run(plugin, 8, "small")
    assert report.get("ran"), report


@pytest.mark.parametrize("plugin", sorted(CPU_PLUGINS))
def test_a_limit_set_behind_pythons_back_is_seen_at_the_next_launch(plugin):
    # setrlimit called through ctypes: nothing in Python says a limit was set.
    report = _run(plugin, 64, "product", setter="ctypes")
    assert "refused" in report, report


def test_without_a_limit_there_is_no_headroom_to_check():
    from pjrt._runtime import memory_headroom

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        pytest.skip("this test process runs under an address-space limit")
    assert memory_headroom.address_space_limit() is None
    assert memory_headroom.headroom() is None


# -- client creation and compiles under a limit ------------------------------------------------

#: argv: plugin library, devices, the limit in MiB. Creates a client, compiles and runs a tiny
#: program under the limit; prints "ran" or the MemoryError's first words.
STARTUP_CHILD = """
import resource, sys
import numpy as np
path, devices, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) << 20
resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
import pjrt
try:
    pjrt.load_pjrt_plugin_dynamically("cpu", path)
    client = pjrt.make_c_api_client("cpu", {"cpu_device_count": devices})
    device = client.devices()[0]
    executable = client.compile_and_load('''func.func public @main(%a: tensor<8xf32>) -> tensor<8xf32> {
      %0 = stablehlo.add %a, %a : tensor<8xf32>
      return %0 : tensor<8xf32>
    }''', [device])
    out = executable.execute([client.buffer_from_pyval(np.ones(8, np.float32), device)])[0]
    assert np.asarray(out).tolist() == [2.0] * 8
    print("ran")
except MemoryError as error:
    print("MemoryError:", str(error)[:60])
"""


@pytest.mark.parametrize("plugin", sorted(CPU_PLUGINS))
@pytest.mark.parametrize("devices", [1, 8])
def test_client_creation_and_the_first_compile_raise_memory_error_instead_of_aborting(plugin,
                                                                                       devices):
    """Under limits from far too small to ample, the first client and compile either run or
    raise MemoryError: the plugin, which aborts when it cannot start a thread, is never
    called without the room it was measured to take."""
    outcomes = {}
    for limit_mib in range(600, 2001, 200):
        result = run_python(STARTUP_CHILD, cpu_plugin_path(plugin), str(devices),
                            str(limit_mib), check=False)
        assert result.returncode == 0, (f"{limit_mib} MiB: exit {result.returncode}\n"
                                        f"{result.stderr[-3000:]}")
        outcomes[limit_mib] = result.stdout.strip().splitlines()[-1]
    assert all(o == "ran" or o.startswith("MemoryError: not enough address space left to")
               for o in outcomes.values()), outcomes
    assert outcomes[600].startswith("MemoryError"), outcomes  # too small for any client
    assert outcomes[2000] == "ran", outcomes


#: Prints the process's address space (MiB) after the default backend ran a tiny program:
#: pjrt's own way (the plugin named by PJRT_NAMES_AND_LIBRARY_PATHS, as an operator would), or
#: jax driving the same plugin library (argv[1]).
ADDRESS_SPACE_CHILD = {
    "pjrt": """
import sys, numpy as np, pjrt
f = pjrt.compile('''func.func public @main(%a: tensor<8xf32>) -> tensor<8xf32> {
  %0 = stablehlo.tanh %a : tensor<8xf32>
  return %0 : tensor<8xf32>
}''', pjrt.devices()[0])
np.asarray(f(np.ones(8, np.float32)))
from pjrt._runtime import memory_headroom
print(memory_headroom.address_space_used() >> 20)
""",
    "jax": """
import sys, numpy as np
import jax, jax.numpy as jnp
from jax._src import xla_bridge
xla_bridge.register_plugin("cpu_plugin", library_path=sys.argv[1], priority=500)
jax.config.update("jax_platforms", "cpu_plugin")
np.asarray(jax.jit(jnp.tanh)(np.ones(8, np.float32)))
with open("/proc/self/statm") as statm:
    print(int(statm.read().split()[0]) * 4096 >> 20)
""",
}


def address_space_after_a_tiny_program(host: str, plugin: str) -> int:
    """MiB of address space ``host`` ("pjrt" or "jax") holds after its first tiny program."""
    from conftest import child_env

    library = cpu_plugin_path(plugin)
    environment = child_env(drop=("PJRT_", "JAX_PLATFORMS"), PJRT_PLATFORMS="testcpu",
                            PJRT_NAMES_AND_LIBRARY_PATHS=f"testcpu:{library}")
    result = run_python(ADDRESS_SPACE_CHILD[host], library, env=environment)
    return int(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("plugin", sorted(CPU_PLUGINS))
def test_address_space_after_the_first_program_is_at_most_jaxs(plugin):
    pytest.importorskip("jax")
    ours = address_space_after_a_tiny_program("pjrt", plugin)
    jaxs = address_space_after_a_tiny_program("jax", plugin)
    assert ours <= jaxs, f"pjrt {ours} MiB, jax {jaxs} MiB on the same plugin"


@pytest.mark.parametrize("plugin", sorted(CPU_PLUGINS))
def test_the_first_compile_runs_under_one_and_a_half_times_jaxs_address_space(plugin):
    pytest.importorskip("jax")
    limit = address_space_after_a_tiny_program("jax", plugin) * 3 // 2
    result = run_python(STARTUP_CHILD, cpu_plugin_path(plugin), "1", str(limit))
    assert result.stdout.strip().splitlines()[-1] == "ran", result.stdout

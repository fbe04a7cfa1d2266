"""The compilation cache's key covers the whole compile, and its entries are checked on read:
a cached executable compiled under other XLA flags, an entry copied under another program's
key, an entry that is a link to ``/dev/zero`` and a truncated entry are never loaded.
"""
from __future__ import annotations

import os
import resource
import shutil

import numpy as np
import pytest

import pjrt
from pjrt import compilation_cache
from pjrt.compilation_cache import set_compilation_cache_dir

from conftest import child_env, run_python

MAXIMUM = """
func.func public @main(%arg0: tensor<4xf32>, %arg1: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.maximum %arg0, %arg1 : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""
ADD = MAXIMUM.replace("maximum", "add")
SUBTRACT = MAXIMUM.replace("maximum", "subtract")

#: Compiles MAXIMUM with the cache in argv[2] and prints maximum(NaN, 1).
_MAXIMUM_CHILD = f"""
import sys
import numpy as np
import pjrt
from conftest import cpu_plugin_path

name, directory = sys.argv[1], sys.argv[2]
pjrt.load_pjrt_plugin_dynamically(name, cpu_plugin_path(name))
client = pjrt.make_c_api_client(name, {{"cpu_device_count": 1}})
pjrt.set_compilation_cache_dir(directory)
program = pjrt.compile('''{MAXIMUM}''', client.devices()[0])
print("RESULT", np.asarray(program(np.full(4, np.nan, np.float32), np.ones(4, np.float32)))[0])
"""

FAST_MATH = "--xla_cpu_enable_fast_math=true --xla_cpu_fast_math_honor_nans=false"


@pytest.fixture
def cache_dir(tmp_path):
    cache = set_compilation_cache_dir(tmp_path / "cache")
    yield cache
    set_compilation_cache_dir(None)
    compilation_cache._explicit = compilation_cache._UNSET


def _result(done) -> str:
    return [line for line in done.stdout.splitlines() if line.startswith("RESULT")][-1]


def test_xla_flags_are_part_of_the_key(cpu_plugin, tmp_path):
    """An executable compiled under fast-math flags is not what a process without them gets."""
    directory = str(tmp_path / "cache")
    fast = run_python(_MAXIMUM_CHILD, cpu_plugin.name, directory,
                      env=child_env(drop=("XLA_FLAGS",), XLA_FLAGS=FAST_MATH))
    assert _result(fast) == "RESULT 1.0"  # the flags do change the compiled code
    plain = run_python(_MAXIMUM_CHILD, cpu_plugin.name, directory,
                       env=child_env(drop=("XLA_FLAGS",)))
    assert _result(plain) == "RESULT nan"
    assert len(os.listdir(directory)) >= 2  # two entries (and the library's digest)


def test_environment_of_the_key():
    environ = {"XLA_FLAGS": "--a", "TF_XLA_FLAGS": "--b", "TF_CPP_MIN_LOG_LEVEL": "3",
               "HOME": "/root", "PJRT_PLATFORMS": "cpu"}
    assert compilation_cache.compile_environment(environ) == (
        ("TF_XLA_FLAGS", "--b"), ("XLA_FLAGS", "--a"))


def test_entry_copied_under_another_key_is_refused(cache_dir, client, caplog):
    device = client.local_devices()[0]
    x, y = np.full(4, 3, np.float32), np.ones(4, np.float32)
    pjrt.compile(ADD, device)
    add_entry = cache_dir.entries()[0][0]
    pjrt.compile(SUBTRACT, device)
    subtract_entry = [p for p, _, _ in cache_dir.entries() if p != add_entry][0]
    shutil.copyfile(subtract_entry, add_entry)
    caplog.set_level("WARNING", logger="pjrt.compilation_cache")
    program = pjrt.compile(ADD, device)
    np.testing.assert_array_equal(np.asarray(program(x, y)), x + y)
    assert any("another key" in r.getMessage() for r in caplog.records)


def test_truncated_entry_is_refused(cache_dir, client, caplog):
    device = client.local_devices()[0]
    pjrt.compile(ADD, device)
    (entry,) = [p for p, _, _ in cache_dir.entries()]
    size = os.path.getsize(entry)
    with open(entry, "r+b") as file:
        file.truncate(size // 2)
    caplog.set_level("WARNING", logger="pjrt.compilation_cache")
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(pjrt.compile(ADD, device)(x, x)), x + x)
    assert any("truncated" in r.getMessage() for r in caplog.records)
    assert os.path.getsize(entry) == size  # compiled again and stored whole


def test_entry_linked_to_dev_zero_is_not_read(cpu_plugin, tmp_path):
    """An entry that is a link to an endless device is refused, not read until memory runs
    out (the child's address space is bounded so that the unfixed read fails fast)."""
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero on this system")
    source = """
    import os, resource, sys
    import numpy as np
    import pjrt
    from conftest import cpu_plugin_path

    name, directory, program = sys.argv[1:]
    pjrt.load_pjrt_plugin_dynamically(name, cpu_plugin_path(name))
    client = pjrt.make_c_api_client(name, {"cpu_device_count": 1})
    cache = pjrt.set_compilation_cache_dir(directory)
    device = client.devices()[0]
    pjrt.compile(program, device)
    (entry,) = [p for p, _, _ in cache.entries()]
    os.remove(entry)
    os.symlink("/dev/zero", entry)
    with open("/proc/self/statm") as statm:
        used = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (used + (1 << 30), resource.RLIM_INFINITY))
    x = np.ones(4, np.float32)
    print("RESULT", np.asarray(pjrt.compile(program, device)(x, x))[0])
    """
    if not os.path.exists("/proc/self/statm"):
        pytest.skip("needs /proc to bound the child's address space")
    done = run_python(source, cpu_plugin.name, str(tmp_path / "cache"), ADD, timeout=120)
    assert _result(done) == "RESULT 2.0"
    assert "not a regular file" in done.stderr

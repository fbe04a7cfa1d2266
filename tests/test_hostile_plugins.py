"""Broken and hostile plugin libraries: each must be a PluginLoadError, never a dead process.

Every file here once killed the process that loaded it: a truncated copy of a real plugin
(SIGBUS inside dlopen), a library calling a function no library defines (exit code 127 at
the first call, with lazy binding), a PJRT_Api claiming more bytes than are mapped (a
segfault reading entries past it), GetPjrtApi exported as data (a jump into data), and a
plugin without the PJRT_Error functions (a NULL call on its first error). Each case runs
in a child process, so that a regression fails one test instead of ending the run, and
through each way a plugin arrives: ``load_pjrt_plugin_dynamically``, the
``PJRT_NAMES_AND_LIBRARY_PATHS`` variable (where start-up stops with the reason, and the
other backends come up once ``PJRT_PLATFORMS`` leaves it out), and,
for tables, ``load_pjrt_plugin_with_c_api``.

The libraries are built by ``tests/fault_plugin/build.py``; the fault plugin's copies are
configured through its control functions in the child before pjrt sees them (see
test_plugin_loading.py for why each configuration needs its own copy).
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import textwrap
import time

import pytest

import pjrt
from pjrt._loading import elf as _elf
from conftest import CPU_PLUGINS, cpu_plugin_path, run_python

HEADER_MAJOR, HEADER_MINOR = pjrt.PJRT_C_API_VERSION

# Every case starts a child process: the set is slow, left out of the quick run.
pytestmark = pytest.mark.slow


_CHILD = textwrap.dedent("""\
    import ctypes, json, os, sys
    path, how, setup = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    address = None
    if setup is not None:  # a copy of the fault plugin, configured before pjrt loads it
        lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
        lib.fault_configure(setup["major"], setup["minor"], ctypes.c_size_t(0), 1)
        for name in setup["unset"]:
            assert lib.fault_unset(name.encode()) == 0, name
        if setup["claim"]:
            lib.fault_claim_struct_size(ctypes.c_size_t(setup["claim"]))
    if how == "c_api":
        if path.isdigit():
            address = int(path)
        else:
            lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
            lib.GetPjrtApi.restype = ctypes.c_void_p
            address = lib.GetPjrtApi()
    import pjrt
    result = {}
    try:
        if how == "dynamic":
            pjrt.load_pjrt_plugin_dynamically("hostile", path)
        elif how == "c_api":
            pjrt.plugin_api.load_pjrt_plugin_with_c_api("hostile", address)
    except pjrt.PluginLoadError as error:
        result["error"] = str(error)
        result["error_path"] = error.path
    if how == "env":
        result["error"] = pjrt.backend_errors().get("hostile")
        try:
            pjrt.backends()
        except RuntimeError as error:  # a library the operator named stops start-up
            result["startup_error"] = str(error)
            pjrt.set_platforms("cpu")  # the way out the error gives
    result["loaded"] = pjrt.xla_client.pjrt_plugin_loaded("hostile")
    # The process is whole: the CPU backend comes up and computes.
    result["backends"] = sorted(pjrt.backends())
    client = pjrt.get_backend("cpu")
    result["round_trip"] = client.buffer_from_pyval(3.5).__array__().item()
    print(json.dumps(result))
""")


def _run_child(path, how: str, setup: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PJRT_PLATFORMS"] = ""  # every backend (an unset one would defer to JAX_PLATFORMS)
    if how == "env":
        env["PJRT_NAMES_AND_LIBRARY_PATHS"] = f"hostile:{path}"
    else:
        env.pop("PJRT_NAMES_AND_LIBRARY_PATHS", None)
    result = run_python(_CHILD, path, how, json.dumps(setup), env=env)
    return json.loads(result.stdout.splitlines()[-1])


def _fault_setup(*, unset=(), claim: int = 0, major: int = HEADER_MAJOR,
                 minor: int = HEADER_MINOR) -> dict:
    return {"unset": list(unset), "claim": claim, "major": major, "minor": minor}


@pytest.fixture(scope="session")
def truncated_real_plugin(tmp_path_factory) -> str:
    """The first third of XLA's real CPU plugin, as a failed download leaves it."""
    source = cpu_plugin_path("xla_cpu_0_81")
    path = tmp_path_factory.mktemp("truncated") / "xla_cpu_pjrt.so"
    with open(source, "rb") as whole, open(path, "wb") as part:
        part.write(whole.read(os.path.getsize(source) // 3))
    return str(path)


def _fault_copy(built, tmp_path, tag: str) -> str:
    path = tmp_path / f"libfault_{tag}.so"
    shutil.copyfile(built.fault_plugin, path)
    return str(path)


#: case -> (how to get the library, the fault plugin's set-up or None, message fragments)
CASES = {
    "truncated_real_plugin": (
        lambda built, tmp, trunc: trunc, None,
        ["could not be loaded as a shared library", "the file is truncated: segment",
         "but the file has", "reinstall the plugin"]),
    "unresolved_symbol": (
        lambda built, tmp, trunc: str(built.unresolved_symbol), None,
        ["pjrt_fault_nowhere_defined", "neither it nor the libraries it depends on define",
         "Reinstall the plugin"]),
    "huge_struct_size": (
        lambda built, tmp, trunc: _fault_copy(built, tmp, "huge"), _fault_setup(claim=1 << 40),
        [f"struct_size of {1 << 40} bytes", "readable memory", "reinstall it"]),
    "tiny_struct_size": (
        lambda built, tmp, trunc: _fault_copy(built, tmp, "tiny"), _fault_setup(claim=16),
        ["struct_size of 16 bytes, too short to hold even the API version"]),
    "table_past_its_memory": (
        lambda built, tmp, trunc: str(built.table_past_its_memory), None,
        ["struct_size of", "bytes from its start", "readable memory"]),
    "data_entry_point": (
        lambda built, tmp, trunc: str(built.data_entry_point), None,
        ["exports GetPjrtApi as a symbol of type OBJECT", "not as a function"]),
    "null_error_functions": (
        lambda built, tmp, trunc: _fault_copy(built, tmp, "noerr"),
        _fault_setup(unset=["PJRT_Error_Destroy", "PJRT_Error_Message", "PJRT_Error_GetCode"]),
        ["does not provide PJRT_Error_Destroy, PJRT_Error_Message, PJRT_Error_GetCode",
         "report its errors"]),
    "implausible_version": (
        lambda built, tmp, trunc: _fault_copy(built, tmp, "badversion"),
        _fault_setup(minor=-5), [f"reports PJRT API version {HEADER_MAJOR}.-5", "corrupt"]),
}


@pytest.mark.parametrize("how", ["dynamic", "env"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_library_is_a_clean_load_error(case, how, built, tmp_path,
                                               truncated_real_plugin):
    make_path, setup, fragments = CASES[case]
    path = make_path(built, tmp_path, truncated_real_plugin)
    result = _run_child(path, how, setup)
    message = result["error"]
    assert message is not None, result
    if how == "env":
        assert message.startswith("PluginLoadError: "), message
        # As in jax, the library named in PJRT_NAMES_AND_LIBRARY_PATHS is not left out
        # quietly: start-up stops with the reason, until PJRT_PLATFORMS leaves it out.
        startup = result["startup_error"]
        assert startup.startswith("Unable to initialize backend 'hostile': "), startup
        assert path in startup and "set PJRT_PLATFORMS=cpu to skip this backend" in startup
    else:
        assert result["error_path"] == path
    assert path in message
    for fragment in fragments:
        assert fragment in message, message
    assert not result["loaded"]
    assert "cpu" in result["backends"] and "hostile" not in result["backends"]
    assert result["round_trip"] == 3.5


@pytest.mark.parametrize("case", ["huge_struct_size", "table_past_its_memory",
                                  "null_error_functions"])
def test_hostile_table_in_memory_is_a_clean_load_error(case, built, tmp_path,
                                                       truncated_real_plugin):
    make_path, setup, fragments = CASES[case]
    result = _run_child(make_path(built, tmp_path, truncated_real_plugin), "c_api", setup)
    message = result["error"]
    assert message is not None and "the given table" in message, result
    for fragment in fragments:
        if "reinstall" not in fragment:  # a table handed over has its own remedy
            assert fragment in message, message
    assert not result["loaded"] and result["round_trip"] == 3.5


def test_unmapped_table_address_is_a_clean_load_error():
    # Page 1 is never mapped (the kernel keeps the lowest pages free).
    result = _run_child("4096", "c_api")
    assert "at 0x1000 is not in readable memory" in result["error"], result
    assert "check that the pointer handed over" in result["error"]
    assert not result["loaded"]


# -- the file check itself ------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CPU_PLUGINS))
def test_elf_check_accepts_the_real_cpu_plugins_quickly(name):
    path = cpu_plugin_path(name)
    _elf.check_plugin_library(path, name)
    timings = []
    for _ in range(30):
        start = time.perf_counter()
        _elf.check_plugin_library(path, name)
        timings.append(time.perf_counter() - start)
    # The plugins are 250+ MB; the check reads a few KB of headers and tables.
    assert statistics.median(timings) < 0.005, timings


def test_plugin_with_only_a_sysv_symbol_hash_loads(built):
    # Old toolchains write only DT_HASH; the check must find GetPjrtApi there too.
    plugin = pjrt.load_pjrt_plugin_dynamically("fault_sysv_hash", built.fault_plugin_sysv_hash)
    assert plugin.api_version == (HEADER_MAJOR, HEADER_MINOR)
    with pjrt.make_c_api_client("fault_sysv_hash") as client:
        assert [d.id for d in client.devices()] == [0, 1]


def _patched(source, tmp_path, offset: int, data: bytes):
    """A copy of ``source`` with ``data`` written at ``offset`` (headers only: never loaded)."""
    path = tmp_path / "patched.so"
    shutil.copyfile(source, path)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
    return str(path)


def _other_machine() -> int:
    return 183 if _elf.host_machine() == 62 else 62


@pytest.mark.parametrize("offset, data, fragments", [
    (4, b"\x01", ["it is a 32-bit library", "install the 64-bit build"]),
    (5, b"\x02" if sys.byteorder == "little" else b"\x01", ["-endian library", "built for this"]),
    (16, struct.pack("<H", 2), ["it is an executable, not a shared library", "check the path"]),
    (16, struct.pack("<H", 1), ["relocatable object", "check the path"]),
    (18, struct.pack("<H", _other_machine()), ["it is built for", "install the plugin built"]),
    (32, struct.pack("<Q", 1 << 40), ["the file is truncated: the table of", "program headers"]),
], ids=["32-bit", "byte-order", "executable", "object-file", "machine", "program-headers"])
def test_elf_check_names_what_is_wrong(built, tmp_path, offset, data, fragments):
    path = _patched(built.fault_plugin, tmp_path, offset, data)
    with pytest.raises(pjrt.PluginLoadError) as excinfo:
        _elf.check_plugin_library(path, "patched")
    message = str(excinfo.value)
    assert message.startswith(f"{path} could not be loaded as a shared library for plugin "
                              f"'patched': ")
    for fragment in fragments:
        assert fragment in message, message
    assert excinfo.value.path == path


def test_library_that_only_imports_GetPjrtApi_is_not_a_plugin(tmp_path):
    source = tmp_path / "imports.c"
    source.write_text("extern const void* GetPjrtApi(void);\n"
                      "const void* call_it(void) { return GetPjrtApi(); }\n")
    library = tmp_path / "libimports.so"
    subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-o", str(library),
                    str(source)], check=True, capture_output=True)
    with pytest.raises(pjrt.PluginLoadError, match="does not export GetPjrtApi"):
        _elf.check_plugin_library(str(library), "imports")

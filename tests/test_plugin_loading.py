"""Loading PJRT plugins, and what happens when a plugin or its library is broken.

Most tests drive ``tests/fault_plugin/fault_plugin.c``, a tiny C plugin that can be told to
report another API version, to publish a shorter function table, to leave entries NULL, or to
fail initialisation or client creation. It counts the objects it hands out and takes back,
so a test can check that pjrt frees every error, buffer and client exactly once, and it
counts host misbehaviour (a call past the table end, a double destroy, a client destroyed
before its buffers).

The plugin keeps its configuration in globals, and dlopen returns the object already loaded
for a path it has seen. So every configuration gets its own copy of the library under a new
file name: the test opens that copy with ctypes (RTLD_LOCAL, as pjrt does), configures it,
and then pjrt's dlopen of the same path finds the same, configured, object. A plugin once
loaded stays for the life of the process, so each copy is also loaded under a new name.
"""
from __future__ import annotations

import ctypes
import gc
import itertools
import os
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest

import pjrt
from pjrt._capi import api as _c
from conftest import fault_build_module, run_python

HERE = Path(__file__).resolve().parent

fault_build = fault_build_module()

# Modes of the fault plugin (FAULT_MODE_* in fault_plugin.c).
NORMAL = 1
CLIENT_CREATE_FAILS = 2
INITIALIZE_FAILS = 3
NULL_API = 4

HEADER_MAJOR, HEADER_MINOR = pjrt.PJRT_C_API_VERSION

_copy_numbers = itertools.count()


class FaultPlugin:
    """One private, configured copy of the fault plugin, not yet loaded by pjrt.

    Attributes:
      lib: the copy opened with ctypes, for the control functions and counters.
      path: where the copy lives (load this path, and only this one).
      name: a plugin name no other test uses.
    """

    _COUNTERS = ("errors_created", "errors_destroyed", "clients_created", "clients_destroyed",
                 "buffers_created", "buffers_destroyed", "events_created", "events_destroyed",
                 "initialize_calls", "client_create_calls", "misuse_count")

    def __init__(self, lib: ctypes.CDLL, path: Path, name: str):
        self.lib = lib
        self.path = path
        self.name = name
        for counter in self._COUNTERS:
            getattr(lib, "fault_" + counter).restype = ctypes.c_long
        for text in ("fault_last_misuse", "fault_last_create_options"):
            getattr(lib, text).restype = ctypes.c_char_p
        lib.GetPjrtApi.restype = ctypes.c_void_p

    def count(self, counter: str) -> int:
        """The current value of the plugin's counter ``fault_<counter>``."""
        return getattr(self.lib, "fault_" + counter)()

    def counts(self) -> dict[str, int]:
        """Every counter, for assertion messages."""
        return {counter: self.count(counter) for counter in self._COUNTERS}

    @property
    def last_create_options(self) -> str:
        """The options the plugin's last ``PJRT_Client_Create`` received, as it saw them."""
        return self.lib.fault_last_create_options().decode()

    def load(self) -> pjrt.Plugin:
        """Load this copy through pjrt under its own name."""
        return pjrt.load_pjrt_plugin_dynamically(self.name, self.path)

    def assert_clean(self) -> None:
        """Every PJRT_Error the plugin made was destroyed exactly once, and pjrt broke no
        rule of the C API (the plugin counts a second destroy as misuse, so equal counts
        mean exactly once)."""
        gc.collect()
        counts = self.counts()
        assert counts["errors_destroyed"] == counts["errors_created"], counts
        assert counts["misuse_count"] == 0, self.lib.fault_last_misuse().decode()


@pytest.fixture
def make_fault(built, tmp_path):
    """A factory of configured fault plugin copies; see :class:`FaultPlugin`."""

    def make(*, major: int = HEADER_MAJOR, minor: int = HEADER_MINOR, table_size: int = 0,
             mode: int = NORMAL, failure: tuple[int, str] | None = None) -> FaultPlugin:
        number = next(_copy_numbers)
        path = tmp_path / f"libfault_{number}.so"
        shutil.copyfile(built.fault_plugin, path)
        lib = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)
        lib.fault_configure(major, minor, ctypes.c_size_t(table_size), mode)
        if failure is not None:
            code, message = failure
            lib.fault_set_failure(int(code), message.encode())
        return FaultPlugin(lib, path, f"fault_{number}")

    return make


@pytest.fixture
def fault_client(make_fault):
    """A client of a normal fault plugin, with the plugin; closed afterwards."""
    fault = make_fault()
    fault.load()
    client = pjrt.make_c_api_client(fault.name)
    yield fault, client
    client.close()


class TableLayout:
    """Where entries sit in the plugin's function table, read from the built library itself
    so that the numbers are the ones the C compiler used."""

    def __init__(self, library: Path):
        # This original is never loaded by pjrt, only read here, so opening it is harmless.
        lib = ctypes.CDLL(str(library), mode=os.RTLD_LOCAL)
        lib.fault_table_offset.restype = ctypes.c_long
        lib.fault_table_offset.argtypes = [ctypes.c_char_p]
        lib.fault_full_table_size.restype = ctypes.c_long
        self._lib = lib
        #: sizeof(PJRT_Api): the table size of a plugin built against our header.
        self.full_size: int = lib.fault_full_table_size()

    def offset(self, entry: str) -> int:
        """Byte offset of ``entry``; a table of this size ends just before it."""
        offset = self._lib.fault_table_offset(entry.encode())
        assert offset > 0, f"fault_plugin.c does not know {entry}"
        return offset


@pytest.fixture(scope="session")
def layout(built) -> TableLayout:
    """The fault plugin's table layout, for cutting tables at a chosen entry."""
    return TableLayout(built.fault_plugin)


# -- libraries that are not plugins ------------------------------------------------------

def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "no_such_plugin.so"
    with pytest.raises(pjrt.PluginLoadError) as excinfo:
        pjrt.load_pjrt_plugin_dynamically("missing_file", path)
    assert str(path) in str(excinfo.value)
    assert excinfo.value.path == str(path)
    assert not pjrt.xla_client.pjrt_plugin_loaded("missing_file")


def test_directory_is_refused(tmp_path):
    with pytest.raises(pjrt.PluginLoadError, match="is a directory") as excinfo:
        pjrt.load_pjrt_plugin_dynamically("a_directory", tmp_path)
    assert str(tmp_path) in str(excinfo.value)


def test_text_file_is_not_a_shared_library(tmp_path):
    path = tmp_path / "plugin.so"
    path.write_text("this is not an ELF file\n")
    with pytest.raises(pjrt.PluginLoadError) as excinfo:
        pjrt.load_pjrt_plugin_dynamically("text_file", path)
    message = str(excinfo.value)
    assert "could not be loaded as a shared library" in message
    assert str(path) in message
    assert excinfo.value.missing_library is None


def test_library_without_GetPjrtApi_is_not_a_plugin(built):
    with pytest.raises(pjrt.PluginLoadError) as excinfo:
        pjrt.load_pjrt_plugin_dynamically("not_a_plugin", built.not_a_plugin)
    message = str(excinfo.value)
    assert "does not export GetPjrtApi" in message
    assert str(built.not_a_plugin) in message


def test_GetPjrtApi_returning_null_is_refused(make_fault):
    fault = make_fault(mode=NULL_API)
    with pytest.raises(pjrt.PluginLoadError, match="returned NULL") as excinfo:
        fault.load()
    assert str(fault.path) in str(excinfo.value)
    assert not pjrt.xla_client.pjrt_plugin_loaded(fault.name)


def test_missing_dependency_is_named(built):
    with pytest.raises(pjrt.PluginLoadError) as excinfo:
        pjrt.load_pjrt_plugin_dynamically("needs_missing_dep", built.needs_missing_dep)
    error = excinfo.value
    assert error.missing_library == built.missing_dep_name == "libpjrt_missing_dep.so"
    assert "libpjrt_missing_dep.so" in str(error)
    assert str(built.needs_missing_dep) in str(error)


def test_failed_load_leaves_the_name_free(tmp_path, make_fault):
    fault = make_fault()
    with pytest.raises(pjrt.PluginLoadError):
        pjrt.load_pjrt_plugin_dynamically(fault.name, tmp_path / "absent.so")
    # The failure was not recorded, so the name can still be given to a good library.
    plugin = fault.load()
    assert pjrt.get_plugin(fault.name) is plugin


# -- API versions -------------------------------------------------------------------------

def test_major_version_1_is_refused(make_fault):
    fault = make_fault(major=1, minor=3)
    with pytest.raises(pjrt.PluginLoadError) as excinfo:
        fault.load()
    message = str(excinfo.value)
    assert "1.3" in message
    assert f"{HEADER_MAJOR}.{HEADER_MINOR}" in message
    assert not pjrt.xla_client.pjrt_plugin_loaded(fault.name)


def test_minor_version_below_minimum_is_refused(make_fault):
    fault = make_fault(minor=30)
    with pytest.raises(pjrt.PluginLoadError) as excinfo:
        fault.load()
    message = str(excinfo.value)
    assert "0.30" in message
    assert f"0.{_c.MIN_SUPPORTED_MINOR}" in message
    assert not pjrt.xla_client.pjrt_plugin_loaded(fault.name)


def test_oldest_supported_minor_version_is_accepted(make_fault):
    fault = make_fault(minor=_c.MIN_SUPPORTED_MINOR)
    assert fault.load().api_version == (0, _c.MIN_SUPPORTED_MINOR)


def test_newer_minor_version_is_accepted(make_fault, layout):
    # A newer plugin also has a longer table, with entries this pjrt has never heard of.
    fault = make_fault(minor=200, table_size=layout.full_size + 8 * ctypes.sizeof(ctypes.c_void_p))
    plugin = fault.load()
    assert plugin.api_version == (0, 200)
    with pjrt.make_c_api_client(fault.name) as client:
        assert client.platform == "fault"
        assert [d.id for d in client.devices()] == [0, 1]
    fault.assert_clean()


# -- short tables and missing entries -----------------------------------------------------

def test_entry_past_a_short_table_is_unsupported(make_fault, layout):
    # An old plugin's table ends right before PJRT_Buffer_CopyToMemory. Everything a client
    # needs is there; the later entries are not, and only struct_size tells pjrt so.
    fault = make_fault(minor=60, table_size=layout.offset("PJRT_Buffer_CopyToMemory"))
    fault.load()
    client = pjrt.make_c_api_client(fault.name)
    device = client.devices()[1]
    array = client.buffer_from_pyval(np.arange(4, dtype=np.float32), device)
    for _ in range(2):  # the same answer again: nothing was left broken by the first
        with pytest.raises(pjrt.UnsupportedFeatureError) as excinfo:
            array.copy_to_memory(device.default_memory())
        error = excinfo.value
        assert error.function == "PJRT_Buffer_CopyToMemory"
        assert error.plugin_version == (0, 60)
        assert error.header_version == (HEADER_MAJOR, HEADER_MINOR)
        message = str(error)
        assert "PJRT_Buffer_CopyToMemory" in message
        assert "0.60" in message and f"{HEADER_MAJOR}.{HEADER_MINOR}" in message
        assert error.code_name == "UNIMPLEMENTED"
    # The array and the process keep working: another client can be made and closed.
    np.testing.assert_array_equal(np.asarray(array), np.arange(4))
    with pjrt.make_c_api_client(fault.name) as second:
        assert [d.id for d in second.devices()] == [0, 1]
    del array
    client.close()
    assert fault.count("clients_created") == fault.count("clients_destroyed") == 2
    assert fault.count("buffers_created") == fault.count("buffers_destroyed")
    fault.assert_clean()


def test_table_too_short_for_buffers_is_refused_at_load(make_fault, layout):
    # A table that stops before PJRT_Client_Compile lacks the buffer and event functions
    # pjrt's C helpers call; that is found when the plugin is loaded, and every missing
    # one is named.
    fault = make_fault(minor=60, table_size=layout.offset("PJRT_Client_Compile"))
    with pytest.raises(pjrt.PluginLoadError) as excinfo:
        fault.load()
    message = str(excinfo.value)
    for function in ("PJRT_Buffer_Destroy", "PJRT_Buffer_ToHostBuffer", "PJRT_Buffer_ReadyEvent"):
        assert function in message
    assert "PJRT_Event_Await" not in message  # present: only the missing ones are named
    assert "0.60" in message and str(fault.path) in message
    assert not pjrt.xla_client.pjrt_plugin_loaded(fault.name)
    assert fault.count("initialize_calls") == fault.count("clients_created") == 0


def test_load_time_list_covers_what_every_client_requires():
    from pjrt import client, plugin

    assert set(client.REQUIRED_FUNCTIONS) <= set(plugin.LOAD_REQUIRED_FUNCTIONS)


def test_compile_without_the_entry_is_unsupported(fault_client):
    fault, client = fault_client
    # The fault plugin leaves PJRT_Client_Compile NULL inside a full-size table.
    with pytest.raises(pjrt.UnsupportedFeatureError) as excinfo:
        client.compile_and_load("module {}")
    assert excinfo.value.function == "PJRT_Client_Compile"
    assert f"{HEADER_MAJOR}.{HEADER_MINOR}" in str(excinfo.value)
    array = client.buffer_from_pyval(np.arange(3, dtype=np.int32))
    np.testing.assert_array_equal(np.asarray(array), [0, 1, 2])
    fault.assert_clean()


_NULL_BUFFER_FROM_HOST_CHILD = textwrap.dedent("""\
    import ctypes, os, sys
    import numpy as np
    import pjrt
    path = sys.argv[1]
    lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
    assert lib.fault_unset(b"PJRT_Client_BufferFromHostBuffer") == 0
    pjrt.load_pjrt_plugin_dynamically("fault", path)
    client = pjrt.make_c_api_client("fault")
    try:
        client.buffer_from_pyval(np.arange(3))
    except pjrt.UnsupportedFeatureError as error:
        print("unsupported", error.function)
    print("still alive", [d.id for d in client.devices()])
    client.close()
""")


def test_buffer_from_pyval_without_the_entry_is_unsupported(built, tmp_path):
    # In a child process: should pjrt call the NULL entry, the result is a segfault, and
    # that must fail this test rather than end the whole run.
    path = tmp_path / "libfault_null_transfer.so"
    shutil.copyfile(built.fault_plugin, path)
    result = run_python(_NULL_BUFFER_FROM_HOST_CHILD, path)
    assert result.stdout.splitlines() == ["unsupported PJRT_Client_BufferFromHostBuffer",
                                          "still alive [0, 1]"]


# -- plugins that fail --------------------------------------------------------------------

def test_client_creation_failure_keeps_code_and_message(make_fault):
    fault = make_fault(mode=CLIENT_CREATE_FAILS,
                       failure=(pjrt.ErrorCode.FAILED_PRECONDITION, "no fault devices"))
    fault.load()
    for attempt in (1, 2):
        with pytest.raises(pjrt.XlaRuntimeError) as excinfo:
            pjrt.make_c_api_client(fault.name)
        error = excinfo.value
        assert type(error) is pjrt.XlaRuntimeError
        assert error.code == pjrt.ErrorCode.FAILED_PRECONDITION
        assert error.code_name == "FAILED_PRECONDITION"
        assert error.plugin_message == "no fault devices"
        assert str(error) == "FAILED_PRECONDITION: no fault devices"
        assert fault.count("errors_created") == attempt
        fault.assert_clean()
    assert fault.count("clients_created") == 0
    assert fault.count("initialize_calls") == 1  # initialised once, not per attempt


def test_initialize_failure_is_raised_and_not_recorded(make_fault):
    fault = make_fault(mode=INITIALIZE_FAILS,
                       failure=(pjrt.ErrorCode.UNAVAILABLE, "fault hardware is asleep"))
    fault.load()
    with pytest.raises(pjrt.XlaRuntimeError) as excinfo:
        pjrt.xla_client.initialize_pjrt_plugin(fault.name)
    assert excinfo.value.code_name == "UNAVAILABLE"
    assert excinfo.value.plugin_message == "fault hardware is asleep"
    assert not pjrt.xla_client.pjrt_plugin_initialized(fault.name)
    fault.assert_clean()
    # Client creation initialises first, so it fails the same way, and tries again
    # (a failed initialisation is not remembered as done).
    with pytest.raises(pjrt.XlaRuntimeError, match="fault hardware is asleep"):
        pjrt.make_c_api_client(fault.name)
    assert fault.count("initialize_calls") == 2
    assert fault.count("client_create_calls") == 0
    assert fault.count("errors_created") == 2
    fault.assert_clean()


# -- lifetimes of buffers and clients -------------------------------------------------------

def test_buffers_round_trip_and_are_freed_when_collected(fault_client):
    fault, client = fault_client
    values = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array(7, dtype=np.int64),
              np.array([True, False]), np.zeros((0, 4), dtype=np.float64)]
    arrays = [client.buffer_from_pyval(value, client.devices()[1]) for value in values]
    for value, array in zip(values, arrays):
        result = np.asarray(array)
        assert result.dtype == value.dtype and result.shape == value.shape
        np.testing.assert_array_equal(result, value)
        assert array.is_ready()
    assert fault.count("buffers_created") == len(values)
    assert fault.count("buffers_destroyed") == 0
    del arrays, array, result  # a read is a view of its buffer: it keeps the array
    gc.collect()
    assert fault.count("buffers_destroyed") == len(values)
    # Every ready event pjrt asked for (is_ready, the empty array's wait) was freed too.
    assert fault.count("events_created") == fault.count("events_destroyed") > 0
    fault.assert_clean()


def test_delete_frees_the_buffer_once(fault_client):
    fault, client = fault_client
    array = client.buffer_from_pyval(np.arange(4))
    array.delete()
    array.delete()
    assert fault.count("buffers_destroyed") == 1
    with pytest.raises(pjrt.DeletedArrayError):
        np.asarray(array)
    del array
    gc.collect()
    assert fault.count("buffers_destroyed") == 1
    fault.assert_clean()


def test_client_is_destroyed_once_when_collected(make_fault):
    fault = make_fault()
    fault.load()
    client = pjrt.make_c_api_client(fault.name)
    array = client.buffer_from_pyval(np.arange(4))
    # The array keeps the client's handle alive: dropping the client alone frees nothing.
    del client
    gc.collect()
    assert fault.count("clients_destroyed") == 0
    np.testing.assert_array_equal(np.asarray(array), np.arange(4))
    del array
    gc.collect()
    assert fault.count("buffers_destroyed") == 1
    assert fault.count("clients_destroyed") == 1
    fault.assert_clean()  # includes: the client did not go before its buffer


def test_close_frees_live_buffers_then_the_client_once(make_fault):
    fault = make_fault()
    fault.load()
    client = pjrt.make_c_api_client(fault.name)
    kept = [client.buffer_from_pyval(np.full(3, i)) for i in range(3)]
    client.close()
    assert fault.count("buffers_destroyed") == 3
    assert fault.count("clients_destroyed") == 1
    assert client.is_closed
    assert all(array.is_deleted() for array in kept)
    client.close()  # a second close does nothing
    del kept, client
    gc.collect()
    assert fault.count("buffers_destroyed") == 3
    assert fault.count("clients_destroyed") == 1
    fault.assert_clean()  # includes: no buffer was destroyed after its client


def test_using_a_closed_client_raises_closed_client_error(make_fault):
    fault = make_fault()
    fault.load()
    client = pjrt.make_c_api_client(fault.name)
    array = client.buffer_from_pyval(np.arange(3))
    client.close()
    with pytest.raises(pjrt.ClosedClientError):
        np.asarray(array)
    with pytest.raises(pjrt.ClosedClientError):
        array.block_until_ready()
    with pytest.raises(pjrt.ClosedClientError):
        client.buffer_from_pyval(np.arange(3))
    with pytest.raises(pjrt.ClosedClientError):
        client.addressable_memories()
    # Nothing reached the plugin after the close.
    assert fault.count("buffers_created") == 1
    fault.assert_clean()


# -- plugin registry ------------------------------------------------------------------------

def test_plugin_attributes_have_python_types(make_fault):
    attributes = make_fault().load().attributes()
    assert attributes == {"fault_name": "fault-injector", "fault_answer": 42,
                          "fault_list": [1, 2, 3], "fault_ratio": 0.5, "fault_enabled": True}
    assert type(attributes["fault_answer"]) is int
    assert type(attributes["fault_ratio"]) is float
    assert type(attributes["fault_enabled"]) is bool
    assert all(type(v) is int for v in attributes["fault_list"])


def test_loaded_and_initialized_flags(make_fault):
    fault = make_fault()
    assert not pjrt.xla_client.pjrt_plugin_loaded(fault.name)
    assert not pjrt.xla_client.pjrt_plugin_initialized(fault.name)
    plugin = fault.load()
    assert pjrt.xla_client.pjrt_plugin_loaded(fault.name)
    assert not pjrt.xla_client.pjrt_plugin_initialized(fault.name)
    assert fault.count("initialize_calls") == 0  # loading alone does not initialise
    pjrt.xla_client.initialize_pjrt_plugin(fault.name)
    pjrt.xla_client.initialize_pjrt_plugin(fault.name)
    assert pjrt.xla_client.pjrt_plugin_initialized(fault.name) and plugin.initialized
    assert fault.count("initialize_calls") == 1
    with pytest.raises(KeyError, match="never_loaded"):
        pjrt.xla_client.initialize_pjrt_plugin("never_loaded")


def test_same_name_from_another_path_is_a_value_error(make_fault):
    first, second = make_fault(), make_fault()
    plugin = first.load()
    assert pjrt.load_pjrt_plugin_dynamically(first.name, first.path) is plugin
    with pytest.raises(ValueError, match="already loaded") as excinfo:
        pjrt.load_pjrt_plugin_dynamically(first.name, second.path)
    assert str(first.path) in str(excinfo.value)
    assert pjrt.get_plugin(first.name) is plugin


def _capsule(address: int):
    """A PyCapsule holding ``address`` with no name, as a C extension would hand it over."""
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(address, None, None)


@pytest.mark.parametrize("form", ["int", "capsule"])
def test_load_with_c_api(make_fault, form):
    fault = make_fault()
    address = fault.lib.GetPjrtApi()
    c_api = address if form == "int" else _capsule(address)
    name = f"{fault.name}_{form}"
    plugin = pjrt.plugin_api.load_pjrt_plugin_with_c_api(name, c_api)
    assert plugin.library_path is None
    assert plugin.api_version == (HEADER_MAJOR, HEADER_MINOR)
    assert pjrt.xla_client.pjrt_plugin_loaded(name)
    with pjrt.make_c_api_client(name) as client:
        assert client.platform == "fault"
    assert fault.count("clients_destroyed") == 1
    with pytest.raises(ValueError, match="already loaded"):
        pjrt.plugin_api.load_pjrt_plugin_with_c_api(name, c_api)
    fault.assert_clean()


def test_a_capsule_is_read_without_touching_ctypes_pythonapi(make_fault):
    """Reading the ``PJRT_Api*`` of a capsule leaves ctypes.pythonapi's shared
    PyCapsule_GetPointer as its other users set it (pjrt reads capsules through a view of its
    own, pjrt._capi.python_api)."""
    fault = make_fault()
    shared = ctypes.pythonapi.PyCapsule_GetPointer
    before = (shared.argtypes, shared.restype)
    shared.argtypes, shared.restype = None, ctypes.c_int  # what some other user set
    try:
        plugin = pjrt.plugin_api.load_pjrt_plugin_with_c_api(
            f"{fault.name}_untouched", _capsule(fault.lib.GetPjrtApi()))
        assert plugin.api_version == (HEADER_MAJOR, HEADER_MINOR)
        assert (shared.argtypes, shared.restype) == (None, ctypes.c_int)
    finally:
        shared.argtypes, shared.restype = before


@pytest.mark.parametrize("wrong", [1.5, "0x1234", None, b"\0" * 8],
                         ids=["float", "str", "None", "bytes"])
def test_load_with_c_api_of_wrong_type_is_a_type_error(wrong):
    with pytest.raises(TypeError, match="PyCapsule"):
        pjrt.plugin_api.load_pjrt_plugin_with_c_api("wrong_c_api_type", wrong)
    assert not pjrt.xla_client.pjrt_plugin_loaded("wrong_c_api_type")


# -- create options -------------------------------------------------------------------------

def test_option_values_reach_the_plugin_with_their_types(make_fault):
    fault = make_fault()
    fault.load()
    options = {"label": "abc", "count": 3, "ids": [4, 5], "ratio": 0.25, "flag": True,
               "np_flag": np.bool_(False), "np_count": np.int32(6), "memory_fraction": 1}
    with pjrt.make_c_api_client(fault.name, options):
        pass
    # bool stays bool (not int), numpy scalars become plain values, and a known float
    # option given as an int is sent as a float.
    assert fault.last_create_options == (
        "label=str:abc;count=int:3;ids=list:4,5;ratio=float:0.25;flag=bool:1;"
        "np_flag=bool:0;np_count=int:6;memory_fraction=float:1")


@pytest.mark.parametrize("key, value", [("fault_table", {"a": 1}), ("fault_scales", [0.5, 1.5]),
                                        ("fault_mixed", [1, "2"]), ("fault_nothing", None)])
def test_unsupported_option_value_is_a_type_error_naming_the_key(make_fault, key, value):
    fault = make_fault()
    fault.load()
    with pytest.raises(TypeError) as excinfo:
        pjrt.make_c_api_client(fault.name, {"label": "ok", key: value})
    assert repr(key) in str(excinfo.value)
    # Refused before the plugin was touched at all.
    assert fault.count("initialize_calls") == 0
    assert fault.count("client_create_calls") == 0


@pytest.mark.parametrize("key, value", [("cpu_device_count", "8"), ("cpu_device_count", 8.0),
                                        ("preallocate", 1), ("memory_fraction", "0.5"),
                                        ("visible_devices", 3)])
def test_known_option_of_wrong_type_is_refused_before_the_plugin(make_fault, key, value):
    fault = make_fault()
    fault.load()
    with pytest.raises(TypeError) as excinfo:
        pjrt.make_c_api_client(fault.name, {key: value})
    assert repr(key) in str(excinfo.value)
    assert fault.count("initialize_calls") == 0
    assert fault.count("client_create_calls") == 0


def test_known_option_of_wrong_type_on_a_real_cpu_plugin(cpu_plugin, client):
    # XLA's CPU plugin aborts the process when cpu_device_count is not an int64 value, so
    # reaching the asserts below at all shows pjrt refused it before calling the plugin.
    with pytest.raises(TypeError, match="'cpu_device_count'"):
        pjrt.make_c_api_client(cpu_plugin.name, {"cpu_device_count": "8"})
    with pytest.raises(TypeError, match="'fault_table'"):
        pjrt.make_c_api_client(cpu_plugin.name, {"fault_table": {"a": 1}})
    # The plugin still works.
    array = client.buffer_from_pyval(np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(np.asarray(array), np.arange(5, dtype=np.float32))


def test_client_and_arrays_collected_together_in_a_cycle(make_fault):
    # The garbage collector may finalise the client's handle before the arrays of the same
    # unreachable cycle; every buffer must still be freed once, and before the client.
    fault = make_fault()
    fault.load()
    client = pjrt.make_c_api_client(fault.name)
    holder = {"client": client, "arrays": [client.buffer_from_pyval(np.arange(3.0))
                                           for _ in range(3)]}
    holder["self"] = holder
    del client, holder
    gc.collect()
    assert fault.count("buffers_created") == fault.count("buffers_destroyed") == 3
    assert fault.count("clients_created") == fault.count("clients_destroyed") == 1
    fault.assert_clean()


def test_a_failed_copy_among_a_calls_host_values_frees_those_made_before(fault_client):
    # The plugin refuses the second of three copies started in one native call: the first is
    # freed, the third never made, and the plugin's error reaches the caller.
    import ml_dtypes

    from pjrt._pjrt_cffi import ffi
    from pjrt._runtime.numpy_arguments import HostCopies

    fault, client = fault_client
    device = client.devices()[0]
    copies = HostCopies(client, 3)
    copies.add(0, np.arange(4, dtype=np.float32), device, donated=False)
    copies.add(1, np.zeros(3, ml_dtypes.float8_e4m3fn), device, donated=False)
    copies.add(2, np.arange(2, dtype=np.int32), device, donated=False)
    slots = ffi.new("PJRT_Buffer*[]", 3)
    with client._handle.calling():
        with pytest.raises(pjrt.XlaRuntimeError, match="not supported"):
            copies.start(slots)
        copies.free()  # what a caller does in any case: nothing is freed twice
    assert fault.count("buffers_created") == 1
    assert fault.count("buffers_destroyed") == 1
    assert all(slots[i] == ffi.NULL for i in range(3))
    fault.assert_clean()

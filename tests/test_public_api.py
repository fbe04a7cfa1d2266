"""The public face: what ``pjrt`` exports, the jaxlib names in ``pjrt.xla_client``, the names
that moved (still reachable, with a DeprecationWarning), and HostBufferSemantics in place of
bare numbers."""
from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest

import pjrt
from pjrt import xla_client
from pjrt._pjrt_cffi import lib

from fixtures import programs

TINY = programs.get("tiny_tanh")
ROOT = pathlib.Path(__file__).resolve().parents[1]

#: What programs call: the whole of pjrt.__all__, and nothing more.
PUBLIC = {
    # plugins and clients
    "Plugin", "get_plugin", "load_pjrt_plugin_dynamically", "make_c_api_client", "Client",
    "PJRT_C_API_VERSION",
    # devices, memories and topologies
    "Device", "Memory", "DeviceList", "DeviceTopology",
    # the backend registry
    "backends", "backend_errors", "backend_pjrt_c_api_version", "backends_are_initialized",
    "clear_backends", "default_backend", "get_backend", "set_platforms", "devices",
    "local_devices", "device_count", "local_device_count", "process_count", "process_index",
    "make_cpu_client", "make_pjrt_topology",
    # arrays and transfers
    "Array", "Shard", "HostBufferSemantics", "device_put", "replicate", "shard_along_axis",
    "block_until_ready", "ready", "from_dlpack", "Layout", "Format",
    # arrays across processes
    "make_array_from_callback", "make_array_from_process_local_data",
    "make_array_from_single_device_arrays",
    # compiling and running
    "compile", "CompiledProgram", "CompileOptions", "LoadedExecutable",
    "deserialize_exported", "set_compilation_cache_dir",
    "register_custom_call_target", "custom_call_targets",
    # shardings
    "Mesh", "P", "PartitionSpec", "Sharding", "NamedSharding", "SingleDeviceSharding",
    "GSPMDSharding", "PmapSharding", "IndivisibleError",
    # errors
    "XlaRuntimeError", "ErrorCode", "PluginLoadError", "UnsupportedFeatureError",
    "ClosedClientError", "DeletedArrayError", "DeviceAssignmentMismatchError",
    "IncompatibleExecutableError",
}

#: Names jaxlib's xla_client has that pjrt implements.
JAXLIB_NAMES = {
    "AutotuneCacheMode", "make_c_api_client", "make_cpu_client", "load_pjrt_plugin_dynamically",
    "load_pjrt_plugin_with_c_api", "pjrt_plugin_loaded", "pjrt_plugin_initialized",
    "initialize_pjrt_plugin", "Client", "Device", "Memory", "DeviceList", "DeviceTopology",
    "CompileOptions", "ExecutableBuildOptions", "DeviceAssignment", "LoadedExecutable",
    "ExecuteResults", "CompiledMemoryStats", "HostBufferSemantics", "batched_device_put",
    "batched_block_until_ready", "batched_copy_array_to_devices_with_sharding",
    "reorder_shards", "Sharding", "NamedSharding", "SingleDeviceSharding", "GSPMDSharding",
    "PmapSharding", "HloSharding", "OpShardingType", "register_custom_call_target",
    "register_custom_type_id", "custom_call_targets", "XlaRuntimeError", "Shape",
    "PrimitiveType", "Layout", "PjRtLayout", "ArrayCopySemantics",
    "check_and_canonicalize_memory_kind", "CustomCallTargetTraits", "ShapeIndex",
    "make_c_api_device_topology", "make_tfrt_tpu_c_api_device_topology",
    "get_topology_for_devices", "register_custom_call_handler",
    "register_custom_call_partitioner", "register_custom_call_as_batch_partitionable",
    "make_gpu_client", "GpuAllocatorConfig", "GpuLibNotLinkedError",
    "get_distributed_runtime_service", "get_distributed_runtime_client",
    "DistributedRuntimeService", "DistributedRuntimeClient",
}

#: Old pjrt names -> the module to import them from now.
MOVED = {
    "initialize_pjrt_plugin": "pjrt.xla_client", "pjrt_plugin_loaded": "pjrt.xla_client",
    "pjrt_plugin_initialized": "pjrt.xla_client", "DeviceAssignment": "pjrt.xla_client",
    "ExecutableBuildOptions": "pjrt.xla_client", "CompiledMemoryStats": "pjrt.xla_client",
    "ExecuteResults": "pjrt.xla_client", "HloSharding": "pjrt.xla_client",
    "OpShardingType": "pjrt.xla_client", "batched_block_until_ready": "pjrt.xla_client",
    "batched_copy_array_to_devices_with_sharding": "pjrt.xla_client",
    "batched_device_put": "pjrt.xla_client", "reorder_shards": "pjrt.xla_client",
    "load_pjrt_plugin_with_c_api": "pjrt.plugin_api", "check_plugin_version": "pjrt.plugin_api",
    "register_backend_factory": "pjrt.plugin_api", "register_plugin": "pjrt.plugin_api",
    "import_from_plugin": "pjrt.plugin_support", "canonicalize_platform": "pjrt.registry",
    "expand_platform_alias": "pjrt.registry", "is_gpu": "pjrt.registry",
    "is_known_platform": "pjrt.registry",
}

#: Internals once exported; they live only in their modules now.
INTERNALS = {"spec_to_hlo_sharding": "pjrt.sharding", "sharding_from_mhlo_text": "pjrt.sharding",
             "parse_program_shardings": "pjrt._sharding.program_text",
             "parse_sdy_sharding": "pjrt._sharding.program_text"}


# -- pjrt.__all__ ---------------------------------------------------------------------------

def test_all_is_what_programs_call():
    assert len(pjrt.__all__) == len(set(pjrt.__all__))
    assert set(pjrt.__all__) == PUBLIC
    assert set(dir(pjrt)) == PUBLIC


def test_every_public_name_resolves_to_its_object_not_a_module():
    for name in pjrt.__all__:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no public name is deprecated
            value = getattr(pjrt, name)
        assert not isinstance(value, types.ModuleType), name
    assert pjrt.compile.__module__ == "pjrt.program"
    assert pjrt.devices.__module__ == "pjrt.registry"
    assert pjrt.HostBufferSemantics.__module__ == "pjrt._capi.handles"


def test_type_checkers_see_every_public_name_where_it_is_defined():
    """Each name in __all__ is imported eagerly or under ``if TYPE_CHECKING:`` in
    pjrt/__init__.py, from the module that defines it, so editors see the real object."""
    tree = ast.parse(pathlib.Path(pjrt.__file__).read_text())
    imported: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for alias in node.names:
                imported[alias.asname or alias.name] = f"pjrt.{node.module}"
    missing = set(pjrt.__all__) - set(imported) - {"PJRT_C_API_VERSION"}
    assert not missing
    for name in pjrt.__all__:
        value = getattr(pjrt, name)
        defined_in = getattr(value, "__module__", None)
        if name != "PJRT_C_API_VERSION" and defined_in is not None:
            # P is PartitionSpec, defined in pjrt.mesh and imported through pjrt.sharding.
            assert importlib.import_module(imported[name]).__dict__[name] is value, name


def test_lazy_names_are_the_names_type_checkers_import():
    """The runtime's table of lazily imported names (``pjrt._LAZY``) and the block that
    imports them for type checkers name the same names from the same modules, each in the
    ``X as X`` form that marks a re-export; ``__all__`` is made from the eager imports and
    the table, and holds each name once."""
    tree = ast.parse(pathlib.Path(pjrt.__file__).read_text())
    blocks = [node for node in tree.body if isinstance(node, ast.If)
              and ast.unparse(node.test) == "TYPE_CHECKING"]
    assert len(blocks) == 1
    imported: dict[str, str] = {}
    for node in blocks[0].body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1, ast.unparse(node)
        for alias in node.names:
            assert alias.asname == alias.name, ast.unparse(node)
            if node.module is not None:  # (``from . import xla_client``: a submodule)
                imported[alias.name] = node.module
    assert imported == pjrt._LAZY_NAMES
    assert len(pjrt.__all__) == len(set(pjrt.__all__))
    assert set(pjrt._LAZY_NAMES) <= set(pjrt.__all__)


def test_the_typing_check_imports_every_public_name():
    """tests/typing/public_names.py (which ``tox -e typing`` checks) imports all of
    ``__all__``, so that a type checker must see each name."""
    tree = ast.parse((ROOT / "tests" / "typing" / "public_names.py").read_text())
    imported = [alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
                and node.module == "pjrt" for alias in node.names]
    assert sorted(imported) == sorted(pjrt.__all__)


def test_internals_are_no_longer_attributes_of_pjrt():
    for name, home in INTERNALS.items():
        assert not hasattr(pjrt, name), name
        assert callable(getattr(importlib.import_module(home), name))


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        pjrt.no_such_name  # noqa: B018


# -- moved names ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(MOVED))
def test_moved_name_warns_and_is_the_same_object(name):
    home = MOVED[name]
    with pytest.warns(DeprecationWarning, match=rf"pjrt\.{name} is deprecated.*use {home}\.{name}"):
        value = getattr(pjrt, name)
    expected = getattr(importlib.import_module(home), name)
    assert value is expected
    assert name not in pjrt.__all__


def test_moved_name_still_works(cpu_plugin):
    with pytest.warns(DeprecationWarning, match="pjrt.xla_client.pjrt_plugin_loaded"):
        loaded = pjrt.pjrt_plugin_loaded(cpu_plugin.name)
    assert loaded is True and xla_client.pjrt_plugin_loaded(cpu_plugin.name) is True


def test_every_use_of_a_moved_name_warns():
    for _ in range(2):
        with pytest.warns(DeprecationWarning):
            pjrt.HloSharding  # noqa: B018


# -- pjrt.xla_client ------------------------------------------------------------------------

def test_xla_client_has_jaxlibs_names():
    assert set(xla_client.__all__) == JAXLIB_NAMES
    for name in xla_client.__all__:
        assert getattr(xla_client, name) is not None, name
    assert xla_client.Client is pjrt.Client
    assert xla_client.HostBufferSemantics is pjrt.HostBufferSemantics
    assert xla_client.HloSharding is importlib.import_module("pjrt.hlo_sharding").HloSharding
    assert pjrt.xla_client is xla_client


def test_xla_client_runs_a_program_end_to_end(cpu_plugin):
    """The jaxlib spelling of load, client, compile, place, run and wait."""
    assert xla_client.pjrt_plugin_loaded(cpu_plugin.name)
    xla_client.initialize_pjrt_plugin(cpu_plugin.name)
    assert xla_client.pjrt_plugin_initialized(cpu_plugin.name)
    client = xla_client.make_c_api_client(cpu_plugin.name, {"cpu_device_count": 2})
    try:
        devices = client.devices()
        executable = client.compile_and_load(TINY.read_text(), devices[:1])
        assert isinstance(executable, xla_client.LoadedExecutable)
        a = np.linspace(-1, 1, 8, dtype=np.float32)
        x = client.buffer_from_pyval(a, devices[0],
                                     host_buffer_semantics=xla_client.HostBufferSemantics.ZERO_COPY)
        (y,) = executable.execute([x, x])
        xla_client.batched_block_until_ready([y])
        np.testing.assert_allclose(np.asarray(y), np.tanh(a * a + 1), rtol=1e-6)
        assert isinstance(executable.get_compiled_memory_stats(), xla_client.CompiledMemoryStats)
    finally:
        client.close()


def test_client_compile_is_compile_and_load():
    """A live client's compile loads what it compiles (an unloaded executable comes from a
    topology's compile-only client): Client.compile is documented as an alias."""
    assert pjrt.Client.compile is pjrt.Client.compile_and_load
    assert "compile_and_load" in inspect.getsource(pjrt.Client)


def test_topology_compiles_to_bytes_under_its_new_name():
    assert "compile_to_bytes" in vars(pjrt.DeviceTopology)
    assert "Deprecated" in pjrt.DeviceTopology.compile.__doc__


@pytest.mark.vendor
def test_topology_compile_is_deprecated_and_still_returns_the_bytes(libtpu_v5e):
    """libtpu describes a v5e slice with no TPU attached; the old name still compiles."""
    from pjrt._runtime import serialization

    _, _, topology = libtpu_v5e
    new = topology.compile_to_bytes(TINY.read_text())
    with pytest.warns(DeprecationWarning, match="compile_to_bytes"):
        old = topology.compile(TINY.read_text())
    assert serialization.read_identity(old) == serialization.read_identity(new)


# -- HostBufferSemantics --------------------------------------------------------------------

def test_host_buffer_semantics_are_pjrts_values():
    semantics = pjrt.HostBufferSemantics
    assert semantics.IMMUTABLE_ONLY_DURING_CALL == lib.PJRT_HostBufferSemantics_kImmutableOnlyDuringCall
    assert (semantics.IMMUTABLE_UNTIL_TRANSFER_COMPLETES
            == lib.PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes)
    assert semantics.ZERO_COPY == lib.PJRT_HostBufferSemantics_kImmutableZeroCopy


@pytest.mark.parametrize("semantics", list(pjrt.HostBufferSemantics))
def test_host_buffer_semantics_as_enum_or_int(client, semantics):
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    by_enum = client.buffer_from_pyval(host, host_buffer_semantics=semantics)
    by_int = client.buffer_from_pyval(host, host_buffer_semantics=int(semantics))
    np.testing.assert_array_equal(np.asarray(by_enum), host)
    np.testing.assert_array_equal(np.asarray(by_int), host)


def test_large_transfers_take_the_staged_path_with_the_enum_or_int(client):
    """Large arrays under the default semantics are copied into staging memory the plugin
    adopts; a bare 0 takes the same path (the block comes back to the pool afterwards)."""
    import gc

    from pjrt._capi import staging

    host = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
    size = staging.staging_size(host.nbytes)
    for semantics in (pjrt.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL, 0):
        staging.release_staging_memory()
        array = client.buffer_from_pyval(host, host_buffer_semantics=semantics)
        np.testing.assert_array_equal(np.asarray(array), host)
        array.delete()
        gc.collect()
        assert staging.staging_pool.available(size) == 1, semantics
    staging.release_staging_memory()


# -- README code for the type checker -------------------------------------------------------

def test_readme_snippets_for_the_type_checker_are_up_to_date():
    result = subprocess.run([sys.executable, str(ROOT / "tests/typing/extract_readme.py"),
                             "--check"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_every_package_ships_py_typed():
    for package in ("core/pjrt", "plugins/cpu/pjrt_cpu", "plugins/cuda/pjrt_cuda",
                    "plugins/rocm/pjrt_rocm", "plugins/tpu/pjrt_tpu"):
        assert (ROOT / package / "py.typed").is_file(), package
        pyproject = (ROOT / package).parent / "pyproject.toml"
        assert '"py.typed"' in pyproject.read_text(), pyproject

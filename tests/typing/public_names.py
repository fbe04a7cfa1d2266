"""Every name of ``pjrt.__all__``, imported as a program imports it; never run.

`tox -e typing` checks that a type checker sees each one where it is defined (most are
imported lazily at run time), and tests/test_public_api.py that this list is ``__all__``.
"""
from pjrt import (
    Array, backend_errors, backend_pjrt_c_api_version, backends, backends_are_initialized,
    block_until_ready, clear_backends, Client, ClosedClientError, compile, CompiledProgram,
    CompileOptions, custom_call_targets, default_backend, DeletedArrayError,
    deserialize_exported, Device, device_count, device_put, DeviceAssignmentMismatchError,
    DeviceList, devices, DeviceTopology, ErrorCode, Format, from_dlpack, get_backend,
    get_plugin, GSPMDSharding, HostBufferSemantics, IncompatibleExecutableError,
    IndivisibleError, Layout, load_pjrt_plugin_dynamically, LoadedExecutable,
    local_device_count, local_devices, make_array_from_callback,
    make_array_from_process_local_data, make_array_from_single_device_arrays,
    make_c_api_client, make_cpu_client, make_pjrt_topology, Memory, Mesh, NamedSharding, P,
    PartitionSpec, PJRT_C_API_VERSION, Plugin, PluginLoadError, PmapSharding, process_count,
    process_index, ready, register_custom_call_target, replicate, set_compilation_cache_dir,
    set_platforms, Shard, shard_along_axis, Sharding, SingleDeviceSharding,
    UnsupportedFeatureError, XlaRuntimeError,
)

"""pjrt: a Python host for PJRT plugins.

Load a PJRT plugin, list its devices, move numpy arrays to them, compile StableHLO and run it::

    import numpy as np, pjrt
    add_one = pjrt.compile(open("add_one.mlir").read())
    print(np.asarray(add_one(np.arange(4, dtype=np.float32))))

Loading a plugin and creating a client import only the modules they need (not numpy); the
rest of the API is imported on first use of its name.
"""
import importlib
from typing import TYPE_CHECKING

from ._c import HEADER_VERSION as PJRT_C_API_VERSION
from .client import Client, HostBufferSemantics, make_c_api_client
from .device import Device, Memory
from .device_list import DeviceList
from .errors import (ClosedClientError, DeletedArrayError, DeviceAssignmentMismatchError,
                     ErrorCode, PluginLoadError, UnsupportedFeatureError, XlaRuntimeError)
from .plugin import (Plugin, get_plugin, initialize_pjrt_plugin, load_pjrt_plugin_dynamically,
                     load_pjrt_plugin_with_c_api, pjrt_plugin_initialized, pjrt_plugin_loaded)

__version__ = "0.1.0"

#: Public names imported on first use, by the module that defines them.
_LAZY = {
    "array": ["Array", "Shard"],
    "compile_options": ["CompileOptions", "DeviceAssignment", "ExecutableBuildOptions"],
    "transfers": ["batched_block_until_ready", "batched_copy_array_to_devices_with_sharding",
                   "batched_device_put", "block_until_ready", "device_put", "reorder_shards",
                   "replicate", "shard_along_axis"],
    "executable": ["CompiledMemoryStats", "ExecuteResults", "LoadedExecutable"],
    "ffi": ["custom_call_targets", "register_custom_call_target"],
    "global_arrays": ["make_array_from_callback", "make_array_from_process_local_data",
                      "make_array_from_single_device_arrays"],
    "hlo_sharding": ["HloSharding", "OpShardingType"],
    "plugin_support": ["check_plugin_version", "import_from_plugin"],
    "program": ["CompiledProgram", "compile"],
    "registry": ["backend_errors", "backend_pjrt_c_api_version", "backends",
                 "backends_are_initialized", "canonicalize_platform", "clear_backends",
                 "default_backend", "device_count", "devices", "expand_platform_alias",
                 "get_backend", "is_gpu", "is_known_platform", "local_device_count",
                 "local_devices", "make_cpu_client", "make_pjrt_topology", "process_count",
                 "process_index", "register_backend_factory", "register_plugin",
                 "set_platforms"],
    "sharding": ["GSPMDSharding", "IndivisibleError", "Mesh", "NamedSharding", "P",
                 "PartitionSpec", "PmapSharding", "Sharding", "SingleDeviceSharding",
                 "sharding_from_mhlo_text", "spec_to_hlo_sharding"],
    "sharding_text": ["parse_program_shardings", "parse_sdy_sharding"],
    "topology": ["DeviceTopology"],
}
_LAZY_NAMES = {name: module for module, names in _LAZY.items() for name in names}

__all__ = sorted(
    ["PJRT_C_API_VERSION", "Client", "HostBufferSemantics", "make_c_api_client", "Device",
     "Memory", "DeviceList", "ClosedClientError", "DeletedArrayError",
     "DeviceAssignmentMismatchError", "ErrorCode", "PluginLoadError", "UnsupportedFeatureError",
     "XlaRuntimeError", "Plugin", "get_plugin", "initialize_pjrt_plugin",
     "load_pjrt_plugin_dynamically", "load_pjrt_plugin_with_c_api", "pjrt_plugin_initialized",
     "pjrt_plugin_loaded", *_LAZY_NAMES])


#: Submodules reachable as attributes (``pjrt.ffi``, ``pjrt.sharding``...) before any import.
_SUBMODULES = frozenset(_LAZY) | {"dtypes", "demo", "cli", "discovery", "options",
                                   "distributed", "kv_store"}


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    module = _LAZY_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'pjrt' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return __all__


if TYPE_CHECKING:  # for type checkers and editors: the same names, imported eagerly
    from .array import Array, Shard  # noqa: F401
    from .compile_options import CompileOptions, DeviceAssignment, ExecutableBuildOptions  # noqa: F401
    from .transfers import device_put, replicate  # noqa: F401
    from .executable import LoadedExecutable  # noqa: F401
    from .program import CompiledProgram, compile  # noqa: F401
    from .registry import backends, devices, get_backend  # noqa: F401
    from .sharding import Mesh, NamedSharding, P, PartitionSpec  # noqa: F401

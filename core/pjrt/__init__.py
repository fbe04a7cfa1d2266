"""pjrt: a Python host for PJRT plugins.

Load a PJRT plugin, list its devices, move numpy arrays to them, compile StableHLO and run it::

    import numpy as np, pjrt
    add_one = pjrt.compile(open("add_one.mlir").read())
    print(np.asarray(add_one(np.arange(4, dtype=np.float32))))

``pjrt`` itself holds what programs call. The names jaxlib users know from
``jaxlib.xla_client`` are in [`pjrt.xla_client`][pjrt.xla_client], and what a plugin package needs is in
[`pjrt.plugin_api`][pjrt.plugin_api].

Loading a plugin and creating a client import only the modules they need (not numpy); the
rest of the API is imported on first use of its name.
"""
import importlib
import warnings
from typing import TYPE_CHECKING, Any

from . import _moved
from ._capi.api import HEADER_VERSION as PJRT_C_API_VERSION
from ._capi.handles import HostBufferSemantics
from ._version import __version__ as __version__
from .client import Client, make_c_api_client
from .device import Device, Memory
from .device_list import DeviceList
from .errors import (ClosedClientError, DeletedArrayError, DeviceAssignmentMismatchError,
                     ErrorCode, IncompatibleExecutableError, PluginLoadError,
                     UnsupportedFeatureError, XlaRuntimeError)
from .plugin import Plugin, get_plugin, load_pjrt_plugin_dynamically

_moved.install()  # old paths of internal modules (pjrt.cli, ...) still import, with a warning

#: Public names imported on first use, by the module that defines them. Type checkers cannot
#: read this table: the ``if TYPE_CHECKING:`` block at the end imports the same names from
#: the same modules for them (tests/test_public_api.py checks that the two agree).
_LAZY = {
    "array": ["Array", "Shard"],
    "compile_options": ["CompileOptions"],
    "transfers": ["block_until_ready", "device_put", "replicate", "shard_along_axis"],
    "executable": ["LoadedExecutable"],
    "ffi": ["custom_call_targets", "register_custom_call_target"],
    "exported": ["deserialize_exported"],
    "dlpack": ["from_dlpack"],
    "layouts": ["Layout", "Format"],
    "compilation_cache": ["set_compilation_cache_dir"],
    "global_arrays": ["make_array_from_callback", "make_array_from_process_local_data",
                      "make_array_from_single_device_arrays"],
    "program": ["CompiledProgram", "compile"],
    "registry": ["backend_errors", "backend_pjrt_c_api_version", "backends",
                 "backends_are_initialized", "clear_backends", "default_backend",
                 "device_count", "devices", "get_backend", "local_device_count",
                 "local_devices", "make_cpu_client", "make_pjrt_topology", "process_count",
                 "process_index", "set_platforms"],
    "sharding": ["GSPMDSharding", "IndivisibleError", "Mesh", "NamedSharding", "P",
                 "PartitionSpec", "PmapSharding", "Sharding", "SingleDeviceSharding"],
    "topology": ["DeviceTopology"],
    "_capi.ready_events": ["ready"],
}
_LAZY_NAMES = {name: module for module, names in _LAZY.items() for name in names}

#: What programs call: the names imported above, and the lazy ones. (Made from the two, so
#: that no name is listed a third time; type checkers read the imports themselves.)
__all__ = [  # pyright: ignore[reportUnsupportedDunderAll]
    "Plugin", "get_plugin", "load_pjrt_plugin_dynamically", "make_c_api_client", "Client",
    "PJRT_C_API_VERSION", "Device", "Memory", "DeviceList", "HostBufferSemantics",
    "XlaRuntimeError", "ErrorCode", "PluginLoadError", "UnsupportedFeatureError",
    "ClosedClientError", "DeletedArrayError", "DeviceAssignmentMismatchError",
    "IncompatibleExecutableError",
    *_LAZY_NAMES,
]

#: Names that were once exported here: name -> (module defining it, where it lives now).
#: They still resolve, with a DeprecationWarning, for one release.
_MOVED = {
    **{name: (module, "pjrt.xla_client") for module, names in {
        "plugin": ["initialize_pjrt_plugin", "pjrt_plugin_initialized", "pjrt_plugin_loaded"],
        "compile_options": ["DeviceAssignment", "ExecutableBuildOptions"],
        "executable": ["CompiledMemoryStats", "ExecuteResults"],
        "hlo_sharding": ["HloSharding", "OpShardingType"],
        "transfers": ["batched_block_until_ready", "batched_copy_array_to_devices_with_sharding",
                      "batched_device_put", "reorder_shards"],
    }.items() for name in names},
    **{name: ("plugin_api", "pjrt.plugin_api") for name in [
        "load_pjrt_plugin_with_c_api", "check_plugin_version", "register_backend_factory",
        "register_plugin"]},
    "import_from_plugin": ("plugin_support", "pjrt.plugin_support"),
    **{name: ("registry", "pjrt.registry") for name in [
        "canonicalize_platform", "expand_platform_alias", "is_gpu", "is_known_platform"]},
}

#: Submodules reachable as attributes (``pjrt.ffi``, ``pjrt.sharding``...) before any import.
#: The last four moved into private subpackages: their old paths import (with a warning) for
#: one more release (see ``_moved``).
_SUBMODULES = frozenset(_LAZY) | {"dtypes", "plugin_api", "xla_client", "distributed",
                                   "kv_store", "exported", "compilation_cache", "dlpack",
                                   "layouts", "shapes", "hosts", "profiler",
                                   "demo", "cli", "discovery", "options"}


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    module = _LAZY_NAMES.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f".{module}", __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    moved = _MOVED.get(name)
    if moved is not None:
        module, home = moved
        # Not cached in globals(), so that every use site is told.
        warnings.warn(f"pjrt.{name} is deprecated and will be removed from the pjrt namespace; "
                      f"use {home}.{name}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(f".{module}", __name__), name)
    raise AttributeError(f"module 'pjrt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # for type checkers and editors: every name of _LAZY, from where it is defined
    from . import xla_client as xla_client, plugin_api as plugin_api  # noqa: F401
    from .array import Array as Array, Shard as Shard  # noqa: F401
    from .compile_options import CompileOptions as CompileOptions  # noqa: F401
    from .executable import LoadedExecutable as LoadedExecutable  # noqa: F401
    from .ffi import (custom_call_targets as custom_call_targets,  # noqa: F401
                      register_custom_call_target as register_custom_call_target)
    from .program import CompiledProgram as CompiledProgram, compile as compile  # noqa: F401
    from .registry import (backend_errors as backend_errors,  # noqa: F401
                           backend_pjrt_c_api_version as backend_pjrt_c_api_version,
                           backends as backends,
                           backends_are_initialized as backends_are_initialized,
                           clear_backends as clear_backends, default_backend as default_backend,
                           device_count as device_count, devices as devices,
                           get_backend as get_backend, local_device_count as local_device_count,
                           local_devices as local_devices, make_cpu_client as make_cpu_client,
                           make_pjrt_topology as make_pjrt_topology,
                           process_count as process_count, process_index as process_index,
                           set_platforms as set_platforms)
    from .sharding import (GSPMDSharding as GSPMDSharding,  # noqa: F401
                           IndivisibleError as IndivisibleError, Mesh as Mesh,
                           NamedSharding as NamedSharding, P as P,
                           PartitionSpec as PartitionSpec, PmapSharding as PmapSharding,
                           Sharding as Sharding, SingleDeviceSharding as SingleDeviceSharding)
    from .topology import DeviceTopology as DeviceTopology  # noqa: F401
    from ._capi.ready_events import ready as ready  # noqa: F401
    from .exported import deserialize_exported as deserialize_exported  # noqa: F401
    from .dlpack import from_dlpack as from_dlpack  # noqa: F401
    from .layouts import Format as Format, Layout as Layout  # noqa: F401
    from .compilation_cache import (  # noqa: F401
        set_compilation_cache_dir as set_compilation_cache_dir)
    from .global_arrays import (  # noqa: F401
        make_array_from_callback as make_array_from_callback,
        make_array_from_process_local_data as make_array_from_process_local_data,
        make_array_from_single_device_arrays as make_array_from_single_device_arrays)
    from .transfers import (block_until_ready as block_until_ready,  # noqa: F401
                            device_put as device_put, replicate as replicate,
                            shard_along_axis as shard_along_axis)

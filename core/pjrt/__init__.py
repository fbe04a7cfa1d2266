"""pjrt: a Python host for PJRT plugins.

Load a PJRT plugin, list its devices, move numpy arrays to them, compile StableHLO and run it::

    import numpy as np, pjrt
    add_one = pjrt.compile(open("add_one.mlir").read())
    print(np.asarray(add_one(np.arange(4, dtype=np.float32))))
"""
from ._c import HEADER_VERSION as PJRT_C_API_VERSION
from .array import Array, Shard
from .device_put import (batched_block_until_ready, batched_copy_array_to_devices_with_sharding,
                         batched_device_put, block_until_ready, device_put, reorder_shards,
                         replicate, shard_along_axis)
from .client import Client, HostBufferSemantics, make_c_api_client
from .compile_options import CompileOptions, DeviceAssignment, ExecutableBuildOptions
from .device import Device, Memory
from .device_list import DeviceList
from .errors import (ClosedClientError, DeletedArrayError, DeviceAssignmentMismatchError,
                     ErrorCode, PluginLoadError, UnsupportedFeatureError, XlaRuntimeError)
from .executable import CompiledMemoryStats, ExecuteResults, LoadedExecutable
from .hlo_sharding import HloSharding, OpShardingType
from . import ffi
from .ffi import custom_call_targets, register_custom_call_target
from .plugin import (Plugin, get_plugin, initialize_pjrt_plugin, load_pjrt_plugin_dynamically,
                     load_pjrt_plugin_with_c_api, pjrt_plugin_initialized, pjrt_plugin_loaded)
from .program import CompiledProgram, compile
from .plugin_support import check_plugin_version, import_from_plugin
from .registry import (backend_errors, backend_pjrt_c_api_version, backends,
                       backends_are_initialized, canonicalize_platform, clear_backends,
                       default_backend, device_count, devices, expand_platform_alias, get_backend,
                       is_gpu, is_known_platform, local_device_count, local_devices,
                       make_cpu_client, make_pjrt_topology, process_count, process_index,
                       register_backend_factory, register_plugin, set_platforms)
from .sharding import (GSPMDSharding, IndivisibleError, Mesh, NamedSharding, P, PartitionSpec,
                       PmapSharding, Sharding, SingleDeviceSharding, sharding_from_mhlo_text,
                       spec_to_hlo_sharding)
from .sharding_text import parse_program_shardings, parse_sdy_sharding
from .topology import DeviceTopology

__version__ = "0.1.0"

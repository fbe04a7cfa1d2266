"""The part of jaxlib's ``xla_client`` surface that pjrt implements, under jaxlib's names.

Code written against ``jaxlib.xla_client`` finds the same names here::

    from pjrt import xla_client

    xla_client.load_pjrt_plugin_dynamically("cpu", library_path)
    client = xla_client.make_c_api_client("cpu", {"cpu_device_count": 2})
    executable = client.compile_and_load(program, client.devices())

Each name is the object defined elsewhere in pjrt (``xla_client.Client is pjrt.Client``);
this module only gathers them. Programs that do not mirror jaxlib use `pjrt` itself.
Differences from jaxlib that matter when porting: ``Client.compile`` is an alias of
``Client.compile_and_load`` (pjrt has no unloaded executable type), and the arrays are
`pjrt.Array`, not jaxlib's ``ArrayImpl``.
"""
from __future__ import annotations

from .client import Client, make_c_api_client
from .compile_options import (AutotuneCacheMode, CompileOptions, DeviceAssignment,
                              ExecutableBuildOptions)
from .device import Device, Memory
from .device_list import DeviceList
from .errors import XlaRuntimeError
from .executable import CompiledMemoryStats, ExecuteResults, LoadedExecutable
from .ffi import custom_call_targets, register_custom_call_target, register_custom_type_id
from ._capi.handles import HostBufferSemantics
from .hlo_sharding import HloSharding, OpShardingType
from .plugin import (initialize_pjrt_plugin, load_pjrt_plugin_dynamically,
                     load_pjrt_plugin_with_c_api, pjrt_plugin_initialized, pjrt_plugin_loaded)
from .registry import make_cpu_client
from ._registry.gpu_client import GpuAllocatorConfig, GpuLibNotLinkedError, make_gpu_client
from .sharding import (GSPMDSharding, NamedSharding, PmapSharding, Sharding,
                       SingleDeviceSharding)
from .topology import (DeviceTopology, get_topology_for_devices,
                       make_c_api_device_topology)
from .ffi import CustomCallTargetTraits
from .ffi import (register_custom_call_as_batch_partitionable, register_custom_call_handler,
                  register_custom_call_partitioner)
from .layouts import Layout, PjRtLayout
from .shapes import PrimitiveType, Shape, ShapeIndex
from .sharding import check_and_canonicalize_memory_kind
from .transfers import ArrayCopySemantics
from .transfers import (batched_block_until_ready, batched_copy_array_to_devices_with_sharding,
                        batched_device_put, reorder_shards)
from ._distributed.coordination_client import (DistributedRuntimeClient,
                                               get_distributed_runtime_client)
from ._distributed.coordination_server import (DistributedRuntimeService,
                                               get_distributed_runtime_service)

__all__ = [
    # plugins and clients
    "load_pjrt_plugin_dynamically", "load_pjrt_plugin_with_c_api", "pjrt_plugin_loaded",
    "pjrt_plugin_initialized", "initialize_pjrt_plugin", "make_c_api_client", "make_cpu_client",
    "make_gpu_client", "GpuAllocatorConfig", "GpuLibNotLinkedError",
    "Client", "Device", "Memory", "DeviceList", "DeviceTopology",
    # compilation and execution
    "CompileOptions", "ExecutableBuildOptions", "DeviceAssignment", "AutotuneCacheMode",
    "LoadedExecutable", "ExecuteResults", "CompiledMemoryStats",
    # arrays and transfers
    "HostBufferSemantics", "batched_device_put", "batched_block_until_ready",
    "batched_copy_array_to_devices_with_sharding", "reorder_shards",
    # shardings
    "Sharding", "NamedSharding", "SingleDeviceSharding", "GSPMDSharding", "PmapSharding",
    "HloSharding", "OpShardingType",
    # shapes, element types and layouts
    "Shape", "ShapeIndex", "PrimitiveType", "Layout", "PjRtLayout", "ArrayCopySemantics",
    "check_and_canonicalize_memory_kind",
    # custom calls and errors
    "register_custom_call_target", "register_custom_type_id", "custom_call_targets",
    "CustomCallTargetTraits", "XlaRuntimeError",
    # topologies
    "make_c_api_device_topology", "make_tfrt_tpu_c_api_device_topology",
    "get_topology_for_devices",
    # custom-call handlers and partitioners
    "register_custom_call_handler", "register_custom_call_partitioner",
    "register_custom_call_as_batch_partitionable",
    # the distributed runtime (XLA's coordination service and its client)
    "get_distributed_runtime_service", "DistributedRuntimeService",
    "get_distributed_runtime_client", "DistributedRuntimeClient",
]


def make_tfrt_tpu_c_api_device_topology(topology_name: str | None = None,
                                        **kwargs) -> DeviceTopology:
    """A TPU topology description (e.g. ``"v5e:2x2"``), made by the plugin registered for
    ``tpu`` (``pjrt-tpu``'s libtpu), with ``kwargs`` as its create options; jaxlib's name.

    Raises:
      RuntimeError: no plugin package is registered for ``tpu`` (install ``pjrt-tpu``).
      XlaRuntimeError: libtpu refused the name (INVALID_ARGUMENT).
    """
    from .registry import make_pjrt_topology

    return make_pjrt_topology("tpu", topology_name or "", **kwargs)

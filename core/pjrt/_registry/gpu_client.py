"""jaxlib's GPU client names over pjrt-cuda and pjrt-rocm: `make_gpu_client`,
`GpuAllocatorConfig` and `GpuLibNotLinkedError` (exported by ``pjrt.xla_client``).

jaxlib builds its GPU client from flags; here it is a client of NVIDIA's or AMD's PJRT plugin
(XLA's GPU plugin), whose create options carry the same settings: ``allocator``,
``memory_fraction``, ``preallocate``, ``collective_memory_size``, ``visible_devices``,
``node_id``, ``num_nodes``, ``enable_mock_nccl`` and ``mock_gpu_topology``.
"""
from __future__ import annotations

import enum
import importlib
import importlib.util
from typing import Any

from ..plugin import load_pjrt_plugin_dynamically

__all__ = ["GpuAllocatorConfig", "GpuLibNotLinkedError", "make_gpu_client"]

#: The GPU platforms, preferred first, and the pjrt package serving each.
_GPU_PACKAGES = (("cuda", "pjrt_cuda"), ("rocm", "pjrt_rocm"))


class GpuLibNotLinkedError(Exception):
    """No GPU plugin package is installed (jaxlib: the GPU library is not linked)."""


class GpuAllocatorConfig:
    """How the GPU plugin allocates device memory (jaxlib's ``GpuAllocatorConfig``).

    Made with no arguments and set attribute by attribute (jaxlib's way), or with them.

    Args:
      kind: which allocator (`Kind`); DEFAULT is the plugin's choice (BFC).
      memory_fraction: the fraction of device memory the BFC allocator may take, in (0, 1].
      preallocate: whether the BFC allocator takes it all when the client is made.
      collective_memory_size: bytes kept for collectives' buffers (0: none).

    Raises:
      TypeError, ValueError: a value the plugin cannot take (the message names it).
    """

    class Kind(enum.IntEnum):
        DEFAULT = 0
        PLATFORM = 1
        BFC = 2
        CUDA_ASYNC = 3

    def __init__(self, kind: "GpuAllocatorConfig.Kind" = Kind.DEFAULT,
                 memory_fraction: float = 0.75, preallocate: bool = True,
                 collective_memory_size: int = 0) -> None:
        self.kind = kind
        self.memory_fraction = memory_fraction
        self.preallocate = preallocate
        self.collective_memory_size = collective_memory_size

    # Read-write attributes, as jaxlib's; each assignment is checked.

    @property
    def kind(self) -> "GpuAllocatorConfig.Kind":
        return self._kind

    @kind.setter
    def kind(self, value) -> None:
        self._kind = GpuAllocatorConfig.Kind(value)

    @property
    def memory_fraction(self) -> float:
        return self._memory_fraction

    @memory_fraction.setter
    def memory_fraction(self, value) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"memory_fraction must be a number, not {value!r}")
        if not 0.0 < float(value) <= 1.0:
            raise ValueError(f"memory_fraction={value!r}: the fraction of GPU memory must be "
                             f"greater than 0 and at most 1")
        self._memory_fraction = float(value)

    @property
    def preallocate(self) -> bool:
        return self._preallocate

    @preallocate.setter
    def preallocate(self, value) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"preallocate must be a bool, not {value!r}")
        self._preallocate = value

    @property
    def collective_memory_size(self) -> int:
        return self._collective_memory_size

    @collective_memory_size.setter
    def collective_memory_size(self, value) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"collective_memory_size={value!r} must be a number of bytes, "
                             f"0 or more")
        self._collective_memory_size = value

    def options(self) -> dict[str, Any]:
        """The GPU plugin's create options for this configuration: ``allocator`` (the kind's
        name in lower case), ``memory_fraction``, ``preallocate``, ``collective_memory_size``."""
        return {"allocator": self.kind.name.lower(), "memory_fraction": self.memory_fraction,
                "preallocate": self.preallocate,
                "collective_memory_size": self.collective_memory_size}

    def __repr__(self) -> str:
        return (f"GpuAllocatorConfig(kind={self.kind.name}, memory_fraction="
                f"{self.memory_fraction}, preallocate={self.preallocate}, "
                f"collective_memory_size={self.collective_memory_size})")


def _gpu_package(platform_name: str | None):
    wanted = [(p, m) for p, m in _GPU_PACKAGES if platform_name in (None, p)]
    if not wanted:
        raise ValueError(f"platform_name={platform_name!r} is not a GPU platform; use 'cuda', "
                         f"'rocm' or None")
    for platform, module in wanted:
        if importlib.util.find_spec(module) is not None:
            return platform, importlib.import_module(module)
    packages = " or ".join(f"pjrt-{p}" for p, _ in wanted)
    raise GpuLibNotLinkedError(
        f"no GPU plugin package is installed ({packages}); install one with pip install "
        f"'pjrt-cuda[cuda13]' (NVIDIA) or pip install 'pjrt-rocm[rocm10]' (AMD)")


def make_gpu_client(distributed_client=None, node_id: int = 0, num_nodes: int = 1,
                    platform_name: str | None = None, allowed_devices=None,
                    mock: bool | None = None, mock_gpu_topology: str | None = None, *,
                    allocator_config: GpuAllocatorConfig | None = None):
    """A new client of the GPU plugin (jaxlib's ``make_gpu_client``): pjrt-cuda's, else
    pjrt-rocm's, or the one ``platform_name`` names.

    Args:
      distributed_client: a key-value store or jax's ``DistributedRuntimeClient`` making a
        client of ``num_nodes`` processes (see [`pjrt.client.create_client`][pjrt.client.create_client]).
      node_id, num_nodes: this process's index and the number of processes.
      platform_name: ``"cuda"``, ``"rocm"`` or None (whichever package is installed, CUDA's
        first).
      allowed_devices: the local device ids the client uses (the ``visible_devices``
        option); None: all.
      mock: make a mock client, whose collectives do nothing (``enable_mock_nccl``).
      mock_gpu_topology: the topology a mock client pretends to have, e.g. ``"2x2x4"``.
      allocator_config: a `GpuAllocatorConfig` (pjrt's addition; jaxlib reads it from
        XLA_PYTHON_CLIENT_ALLOCATOR and friends, as pjrt-cuda does when this is None).

    Raises:
      GpuLibNotLinkedError: no GPU plugin package is installed.
      ValueError: ``platform_name`` is not a GPU platform, or a setting is out of range.
      XlaRuntimeError: the plugin refused, e.g. FAILED_PRECONDITION "No visible GPU devices."
    """
    platform, package = _gpu_package(platform_name)
    options: dict[str, Any] = dict(package.client_options()) if hasattr(
        package, "client_options") else {}
    options["platform_name"] = platform
    if allocator_config is not None:
        if not isinstance(allocator_config, GpuAllocatorConfig):
            raise TypeError(f"allocator_config must be a GpuAllocatorConfig, not "
                            f"{type(allocator_config).__name__}")
        options.update(allocator_config.options())
    if allowed_devices is not None:
        devices = sorted(allowed_devices)
        if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in devices):
            raise ValueError(f"allowed_devices={allowed_devices!r} must hold device ids, "
                             f"0 or more")
        options["visible_devices"] = devices
    if not 0 <= node_id < max(num_nodes, 1):
        raise ValueError(f"node_id={node_id} must be in [0, num_nodes={num_nodes})")
    if num_nodes != 1 or node_id != 0:
        options["node_id"], options["num_nodes"] = int(node_id), int(num_nodes)
    if mock is not None:
        options["enable_mock_nccl"] = bool(mock)
    if mock_gpu_topology is not None:
        options["mock_gpu_topology"] = str(mock_gpu_topology)
    plugin = load_pjrt_plugin_dynamically(platform, package.library_path())
    return package.make_client(plugin, options, distributed_client=distributed_client)

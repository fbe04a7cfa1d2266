"""Topology descriptions (``PJRT_TopologyDescription``): a platform's devices without a client.

A plugin that can describe its hardware without reaching it (TPU, for example) lets programs be
compiled ahead of time for a topology such as ``"v5e:2x2"``.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING, Mapping

from ._capi.api import to_str
from ._pjrt_cffi import ffi
from .errors import check
from ._capi.handles import TopologyHandle, native_method
from ._capi.options import NamedValues, named_values_to_dict
from .plugin import Plugin
from ._capi.waits import call_off_thread, run_on_compile_thread

if TYPE_CHECKING:
    from .compile_options import CompileOptions


@dataclasses.dataclass(frozen=True)
class DeviceDescription:
    """A device as a topology describes it."""

    id: int
    process_index: int
    device_kind: str


class DeviceTopology:
    """Owns a ``PJRT_TopologyDescription``: ``platform``, ``platform_version``,
    `device_descriptions`, `serialize`, `attributes`."""

    def __init__(self, plugin: Plugin, pointer):
        self._plugin = plugin
        self._handle = TopologyHandle(plugin.api, pointer)
        api = plugin.api
        name = api.call_new("PJRT_TopologyDescription_PlatformName", topology=pointer)
        self.platform = to_str(name.platform_name, name.platform_name_size)
        version = api.call_new("PJRT_TopologyDescription_PlatformVersion", topology=pointer)
        self.platform_version = to_str(version.platform_version, version.platform_version_size)

    def _live(self):
        """The topology's pointer, inside a native call (see `pjrt._capi.handles`)."""
        return self._handle.pointer

    @native_method
    def device_descriptions(self) -> list[DeviceDescription]:
        api = self._plugin.api
        args = api.call_new("PJRT_TopologyDescription_GetDeviceDescriptions", topology=self._live())
        result = []
        for i in range(args.num_descriptions):
            description = args.descriptions[i]
            kind = api.call_new("PJRT_DeviceDescription_Kind", device_description=description)
            result.append(DeviceDescription(
                int(api.call_new("PJRT_DeviceDescription_Id", device_description=description).id),
                int(api.call_new("PJRT_DeviceDescription_ProcessIndex",
                                 device_description=description).process_index),
                to_str(kind.device_kind, kind.device_kind_size)))
        return result

    @native_method
    def attributes(self) -> dict:
        args = self._plugin.api.call_new("PJRT_TopologyDescription_Attributes", topology=self._live())
        return named_values_to_dict(args.attributes, args.num_attributes)

    @native_method
    def serialize(self) -> bytes:
        args = self._plugin.api.call_new("PJRT_TopologyDescription_Serialize", topology=self._live())
        try:
            return ffi.unpack(args.serialized_bytes, args.serialized_bytes_size)
        finally:
            if args.serialized_topology_deleter != ffi.NULL:
                args.serialized_topology_deleter(args.serialized_topology)

    @native_method
    def compile_to_bytes(self, program: str | bytes,
                         compile_options: CompileOptions | None = None) -> bytes:
        """Compile a StableHLO program for this topology, ahead of time, without its devices.

        Args:
          program: StableHLO text or bytecode.
          compile_options: a [`CompileOptions`][pjrt.compile_options.CompileOptions] (one replica and
            one partition when None).

        Returns:
          The serialised executable, naming this topology's plugin build as its maker: load
          it with ``Client.deserialize_executable`` on a machine that has the hardware, with
          the same plugin build.

        Raises:
          UnsupportedFeatureError: the plugin cannot compile without a client.
          XlaRuntimeError: compilation failed (the plugin's message is kept).
        """
        from ._runtime import serialization  # hashing and JSON: only when compiling
        from .compile_options import CompileOptions
        from ._compile.pipeline import program_argument
        from ._compile.program_facts import read_program

        pointer = self._live()
        api = self._plugin.api
        program_struct, keepalive = program_argument(read_program(program))
        options = (compile_options or CompileOptions()).SerializeAsString()
        options_buffer = ffi.new("char[]", options)
        args = api.new_args("PJRT_Compile_Args")
        args.topology = pointer
        args.program = program_struct
        args.compile_options = options_buffer
        args.compile_options_size = len(options)

        def compile_on_worker(held=(keepalive, options_buffer)):  # kept until the plugin ends
            api.call("PJRT_Compile", args)
            return args.executable

        # On a worker, so that Ctrl-C reaches the caller; the ticket keeps the topology
        # alive for the compile until it ends, even when the caller has given up.
        handle = self._handle
        ticket = handle.begin()
        run_on_compile_thread(handle, ticket, compile_on_worker,
                              lambda executable: _destroy_executable(api, executable))
        handle.end(ticket)
        del keepalive
        try:
            payload = serialization.executable_bytes(api, args.executable)
        finally:
            _destroy_executable(api, args.executable)
        return serialization.pack(payload, serialization.plugin_identity(
            self._plugin, self.platform, self.platform_version))

    def compile(self, program: str | bytes,
                compile_options: CompileOptions | None = None) -> bytes:
        """Deprecated name of `compile_to_bytes` (it returns bytes, not an executable)."""
        warnings.warn("DeviceTopology.compile is deprecated: use DeviceTopology.compile_to_bytes "
                      "(it returns the serialised executable)", DeprecationWarning, stacklevel=2)
        return self.compile_to_bytes(program, compile_options)

    def close(self) -> None:
        """Free the topology description (once no call on it is running). Idempotent."""
        self._handle.close("this topology description has been closed")

    def __repr__(self) -> str:
        return f"DeviceTopology(platform={self.platform!r}, version={self.platform_version!r})"


def make_topology(plugin: Plugin, topology_name: str = "",
                  options: Mapping | None = None) -> DeviceTopology:
    """Ask ``plugin`` to describe ``topology_name`` (e.g. ``"v5e:2x2"``; "" for its own).

    Raises:
      UnsupportedFeatureError: the plugin cannot describe topologies.
      XlaRuntimeError: the plugin refused (its message is kept).
    """
    api = plugin.api
    named = NamedValues(options)
    encoded = topology_name.encode()
    name = ffi.new("char[]", encoded)
    args = api.new_args("PJRT_TopologyDescription_Create_Args")
    args.topology_name = name
    args.topology_name_size = len(encoded)
    args.create_options = named.array
    args.num_options = named.count

    def create():
        plugin.initialize()
        api.call("PJRT_TopologyDescription_Create", args)
        return args.topology

    # On a worker, so that Ctrl-C reaches the caller; a description that arrives after the
    # caller gave up is freed there.
    def close_late(late) -> None:
        if late is not None:
            TopologyHandle(api, late).close()

    return DeviceTopology(plugin, call_off_thread(create, close_late))


def _destroy_executable(api, executable) -> None:
    destroy = api.new_args("PJRT_Executable_Destroy_Args")
    destroy.executable = executable
    check(api, api.table.PJRT_Executable_Destroy(destroy))

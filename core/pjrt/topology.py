"""Topology descriptions (``PJRT_TopologyDescription``): a platform's devices without a client.

A plugin that can describe its hardware without reaching it (TPU, for example) lets programs be
compiled ahead of time for a topology such as ``"v5e:2x2"``.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING, Mapping, Sequence

from ._capi.api import to_str
from ._pjrt_cffi import ffi
from .errors import ClosedClientError, check
from ._capi.handles import TopologyHandle
from ._capi.options import NamedValues, named_values_to_dict
from .plugin import Plugin, plugin_of_c_api
from ._capi.waits import call_off_thread, run_on_compile_thread

if TYPE_CHECKING:
    from .compile_options import CompileOptions


@dataclasses.dataclass(frozen=True, eq=False)
class CompileOnlyDevice:
    """A device of a topology, for compiling ahead of time: it has no client and holds no
    memory (jaxlib's ``CompileOnlyDevice``). Made by
    `DeviceTopology._make_compile_only_devices`."""

    id: int
    process_index: int
    platform: str
    device_kind: str
    topology: "DeviceTopology" = dataclasses.field(repr=False)

    #: A compile-only device belongs to no client (jaxlib's attribute).
    client = None

    def __str__(self) -> str:
        return f"{self.platform.upper()}_{self.id}(compile-only)"


@dataclasses.dataclass(frozen=True)
class DeviceDescription:
    """A device as a topology describes it."""

    id: int
    process_index: int
    device_kind: str


class DeviceTopology:
    """A ``PJRT_TopologyDescription``: ``platform``, ``platform_version``,
    `device_descriptions`, `serialize`, `attributes`.

    Made by [`make_topology`][pjrt.topology.make_topology] (the topology owns the description)
    or by [`get_topology_for_devices`][pjrt.topology.get_topology_for_devices] (the client
    owns it: calls then hold the client open, and fail once it is closed).
    """

    def __init__(self, plugin: Plugin, pointer, *, client=None):
        self._plugin = plugin
        #: The client that owns the description, or None when this object owns it.
        self._client = client
        if client is None:
            self._handle = TopologyHandle(plugin.api, pointer)
            self._borrowed = None
        else:
            # Native calls take the client's tickets, so the client stays open during each.
            self._handle = client.raw_handle
            self._borrowed = pointer
        self._closed = False
        api = plugin.api
        name = api.call_new("PJRT_TopologyDescription_PlatformName", topology=pointer)
        self.platform = to_str(name.platform_name, name.platform_name_size)
        version = api.call_new("PJRT_TopologyDescription_PlatformVersion", topology=pointer)
        self.platform_version = to_str(version.platform_version, version.platform_version_size)

    def _live(self):
        """The topology's pointer, inside a native call (see `pjrt._capi.handles`)."""
        if self._borrowed is None:
            return self._handle.pointer
        if self._closed:
            raise ClosedClientError("this topology description has been closed")
        return self._borrowed

    def device_descriptions(self) -> list[DeviceDescription]:
        with self._handle.calling():
            api = self._plugin.api
            args = api.call_new("PJRT_TopologyDescription_GetDeviceDescriptions",
                                topology=self._live())
            result = []
            for i in range(args.num_descriptions):
                description = args.descriptions[i]
                kind = api.call_new("PJRT_DeviceDescription_Kind", device_description=description)
                result.append(DeviceDescription(
                    int(api.call_new("PJRT_DeviceDescription_Id",
                                     device_description=description).id),
                    int(api.call_new("PJRT_DeviceDescription_ProcessIndex",
                                     device_description=description).process_index),
                    to_str(kind.device_kind, kind.device_kind_size)))
            return result

    def attributes(self) -> dict:
        with self._handle.calling():
            args = self._plugin.api.call_new("PJRT_TopologyDescription_Attributes",
                                             topology=self._live())
            return named_values_to_dict(args.attributes, args.num_attributes)

    def serialize(self) -> bytes:
        with self._handle.calling():
            args = self._plugin.api.call_new("PJRT_TopologyDescription_Serialize",
                                             topology=self._live())
            try:
                return ffi.unpack(args.serialized_bytes, args.serialized_bytes_size)
            finally:
                if args.serialized_topology_deleter != ffi.NULL:
                    args.serialized_topology_deleter(args.serialized_topology)

    def compile_to_bytes(self, program: str | bytes,
                         compile_options: CompileOptions | None = None, *,
                         devices: Sequence[CompileOnlyDevice] | None = None) -> bytes:
        """Compile a StableHLO program for this topology, ahead of time, without its devices.

        Args:
          program: StableHLO text or bytecode.
          compile_options: a [`CompileOptions`][pjrt.compile_options.CompileOptions] (one replica and
            one partition when None).
          devices: compile-only devices of this topology (`_make_compile_only_devices`) to
            compile for, as jaxlib's ``compile(..., executable_devices)`` takes them: one
            partition per device (a device assignment of one replica) unless
            ``compile_options`` sets its own device assignment.

        Returns:
          The serialised executable, naming this topology's plugin build as its maker: load
          it with ``Client.deserialize_executable`` on a machine that has the hardware, with
          the same plugin build.

        Raises:
          UnsupportedFeatureError: the plugin cannot compile without a client.
          ValueError: a static tensor type of a text program has extents that overflow
            int64 when multiplied in order (which XLA aborts on).
          XlaRuntimeError: compilation failed (the plugin's message is kept).
        """
        with self._handle.calling():
            from ._runtime import serialization  # hashing and JSON: only when compiling
            from .compile_options import CompileOptions
            from ._compile.pipeline import check_static_extents, program_argument
            from ._compile.program_facts import read_program

            pointer = self._live()
            api = self._plugin.api
            compile_options = compile_options or CompileOptions()
            if devices is not None:
                compile_options = self._options_for_devices(compile_options, devices)
            facts = read_program(program)
            # A tensor type whose extents XLA cannot multiply out ends its compile (see
            # pjrt._wire.shape_extents), as for a client's compile.
            check_static_extents(facts.code)
            program_struct, keepalive = program_argument(facts)
            options = compile_options.SerializeAsString()
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

    def _options_for_devices(self, compile_options: CompileOptions,
                             devices: Sequence[CompileOnlyDevice]) -> CompileOptions:
        """``compile_options`` with one replica and a partition per device in ``devices``
        (unless it has a device assignment of its own)."""
        from .compile_options import DeviceAssignment

        from .compile_options import CompileOptions

        devices = list(devices)
        if not devices:
            raise ValueError("devices is empty: pass at least one compile-only device")
        for device in devices:
            if not isinstance(device, CompileOnlyDevice) or device.topology is not self:
                raise ValueError(
                    f"{device!r} is not a compile-only device of this topology; pass devices "
                    f"from this topology's _make_compile_only_devices()")
        # A copy: the caller's options are left as they were.
        compile_options = CompileOptions.ParseFromString(compile_options.SerializeAsString())
        build = compile_options.executable_build_options
        if build.device_assignment is None:
            build.num_replicas = 1
            build.num_partitions = len(devices)
            if len(devices) > 1:
                build.use_spmd_partitioning = True
            build.device_assignment = DeviceAssignment.create(
                [[device.id for device in devices]])
        return compile_options

    def compile(self, program: str | bytes,
                compile_options: CompileOptions | None = None, *,
                devices: Sequence[CompileOnlyDevice] | None = None) -> bytes:
        """Deprecated name of `compile_to_bytes` (it returns bytes, not an executable)."""
        warnings.warn("DeviceTopology.compile is deprecated: use DeviceTopology.compile_to_bytes "
                      "(it returns the serialised executable)", DeprecationWarning, stacklevel=2)
        return self.compile_to_bytes(program, compile_options, devices=devices)

    def _make_compile_only_devices(self) -> list[CompileOnlyDevice]:
        """This topology's devices as compile-only devices (jaxlib's name, used by its
        ahead-of-time path): each has ``id``, ``process_index``, ``platform``,
        ``device_kind`` and this topology, and no client. Pass them to `compile_to_bytes`
        as ``devices`` to compile for them."""
        return [CompileOnlyDevice(description.id, description.process_index, self.platform,
                                  description.device_kind, self)
                for description in self.device_descriptions()]

    def close(self) -> None:
        """Free the topology description (once no call on it is running). Idempotent.

        A description a client owns is freed with the client; closing this object only
        stops its own calls.
        """
        if self._borrowed is not None:
            self._closed = True
            return
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


def make_c_api_device_topology(c_api, topology_name: str = "", **kwargs) -> DeviceTopology:
    """jaxlib's name for [`make_topology`][pjrt.topology.make_topology]: ask the plugin
    ``c_api`` to describe ``topology_name``, with ``kwargs`` as the plugin's create options.

    Args:
      c_api: the loaded plugin: the `Plugin` that ``load_pjrt_plugin_dynamically`` returns,
        or its ``PJRT_Api*`` as a PyCapsule, int address or cffi pointer (what jaxlib
        passes).
      topology_name: the topology to describe, e.g. ``"v5e:2x2"``; "" for the plugin's own.

    Raises:
      TypeError: ``c_api`` is none of these.
      UnsupportedFeatureError: the plugin has no ``PJRT_TopologyDescription_Create``.
      XlaRuntimeError: the plugin refused (its message is kept; XLA's CPU builds answer
        UNIMPLEMENTED: they describe only a client's topology, see
        `get_topology_for_devices`).
    """
    return make_topology(plugin_of_c_api(c_api), topology_name, kwargs)


def get_topology_for_devices(devices) -> DeviceTopology:
    """The topology of the client that ``devices`` belong to (``PJRT_Client_TopologyDescription``;
    jaxlib's function of the same name).

    The description is the client's: it lives as long as the client, and its calls fail with
    `ClosedClientError` once the client is closed.

    Raises:
      ValueError: ``devices`` is empty, or its devices belong to more than one client.
      UnsupportedFeatureError: the plugin does not describe its clients' topologies.
      XlaRuntimeError: the plugin refused (its message is kept).
    """
    devices = list(devices)
    if not devices:
        raise ValueError("get_topology_for_devices needs at least one device")
    client = devices[0].client
    for device in devices[1:]:
        if device.client is not client:
            raise ValueError(f"devices belong to more than one client ({devices[0]} and "
                             f"{device}); a topology describes one client's devices")
    api = client.plugin.api
    with client.raw_handle.calling() as handle:
        args = api.call_new("PJRT_Client_TopologyDescription", client=handle.pointer)
        return DeviceTopology(client.plugin, args.topology, client=client)


def _destroy_executable(api, executable) -> None:
    destroy = api.new_args("PJRT_Executable_Destroy_Args")
    destroy.executable = executable
    check(api, api.table.PJRT_Executable_Destroy(destroy))

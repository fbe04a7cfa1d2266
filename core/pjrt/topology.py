"""Topology descriptions (``PJRT_TopologyDescription``): a platform's devices without a client.

A plugin that can describe its hardware without reaching it (TPU, for example) lets programs be
compiled ahead of time for a topology such as ``"v5e:2x2"``.

Ahead-of-time compiles take jaxlib's form: a topology's compile-only devices
(`DeviceTopology._make_compile_only_devices`) belong to a [`CompileOnlyClient`][pjrt.topology.CompileOnlyClient],
whose ``compile`` returns an [`Executable`][pjrt.topology.Executable]: a compiled program to
inspect (optimised HLO, memory stats, shardings, layouts) and serialise, which a client of
the same plugin build loads and runs.
"""
from __future__ import annotations

import dataclasses
import warnings
import weakref
from typing import TYPE_CHECKING, Mapping, Sequence

from ._capi.api import to_str
from ._pjrt_cffi import ffi
from .errors import ClosedClientError, check
from ._capi.handles import ClientHandle, TopologyHandle
from .hlo_sharding import HloSharding
from ._capi.options import NamedValues, named_values_to_dict
from .plugin import Plugin, plugin_of_c_api
from ._capi.off_thread import call_off_thread, run_on_compile_thread

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

    #: It runs nothing, so this process cannot address it (jaxlib's attribute).
    is_addressable = False
    #: A compile-only device (a `DeviceList` may hold them).
    is_compile_only = True

    @property
    def client(self) -> "CompileOnlyClient":
        """The topology's [`CompileOnlyClient`][pjrt.topology.CompileOnlyClient] (jaxlib's
        attribute), which compiles for these devices."""
        return self.topology._compile_only_client()

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
        self._compile_only: CompileOnlyClient | None = None
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
        """Compile a StableHLO program for this topology, ahead of time, and serialise it:
        ``self._make_compile_only_devices()[0].client.compile(...).serialize()`` (see
        [`CompileOnlyClient.compile`][pjrt.topology.CompileOnlyClient.compile]).

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
        executable = self._compile_only_client().compile(program, devices, compile_options)
        try:
            return executable.serialize()
        finally:
            executable.delete()

    def _compile_executable(self, program: str | bytes, compile_options: CompileOptions):
        """``PJRT_Compile`` on this topology: the ``PJRT_Executable*``, the caller's to free."""
        with self._handle.calling():
            from ._compile.pipeline import (check_static_extents, program_argument,
                                            serialize_with_jax_defaults)
            from ._compile.program_facts import read_program

            pointer = self._live()
            api = self._plugin.api
            facts = read_program(program)
            # A tensor type whose extents XLA cannot multiply out ends its compile (see
            # pjrt._wire.shape_extents), as for a client's compile.
            check_static_extents(facts.code)
            program_struct, keepalive = program_argument(facts)
            options = serialize_with_jax_defaults(self.platform, compile_options,
                                                  self._plugin.api_version[1])
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
            return args.executable

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
        ``device_kind``, this topology and its ``client``, the topology's
        [`CompileOnlyClient`][pjrt.topology.CompileOnlyClient]: ``devices[0].client.compile(
        program, devices)`` compiles for them."""
        return [CompileOnlyDevice(description.id, description.process_index, self.platform,
                                  description.device_kind, self)
                for description in self.device_descriptions()]

    def _compile_only_client(self) -> "CompileOnlyClient":
        """The client of this topology's compile-only devices (one per topology)."""
        client = self._compile_only
        if client is None:
            client = self._compile_only = CompileOnlyClient(self, self._client)
        return client

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


class CompileOnlyClient:
    """The client of a topology's compile-only devices (jaxlib's ``CompileOnlyPyClient``):
    it compiles for them, ahead of time, and runs nothing.

    ``compile`` returns an [`Executable`][pjrt.topology.Executable]. A topology the plugin made
    (`make_topology`) compiles through ``PJRT_Compile`` on the topology; one of a client
    (`get_topology_for_devices`) compiles through that client, as jax's ahead-of-time path
    prefers a live client of the platform (XLA's CPU builds have no compiler for a topology
    at all: ``PJRT_Compile`` answers NOT_FOUND there).
    """

    #: jaxlib's name for a client that only compiles.
    runtime_type = "compile_only_runtime"

    def __init__(self, topology: DeviceTopology, client=None):
        self.topology = topology
        #: The live client that compiles for a client's topology (None: the plugin does).
        self._client = client
        self.platform = topology.platform
        self.platform_version = topology.platform_version

    @property
    def _raw_platform(self) -> str:
        return self.platform

    def devices(self) -> list[CompileOnlyDevice]:
        """The topology's compile-only devices."""
        return self.topology._make_compile_only_devices()

    def device_count(self) -> int:
        return len(self.topology.device_descriptions())

    def local_devices(self) -> list:
        """None: no device of a compile-only client is addressable (as in jaxlib)."""
        return []

    def local_device_count(self) -> int:
        return 0

    def process_index(self) -> int:
        return 0 if self._client is None else self._client.process_index()

    def compile(self, computation: str | bytes,
                executable_devices: Sequence[CompileOnlyDevice] | None = None,
                compile_options: CompileOptions | None = None,
                host_callbacks: Sequence = ()) -> "Executable":
        """Compile a StableHLO program for compile-only devices (jaxlib's signature).

        Args:
          computation: StableHLO text or bytecode.
          executable_devices: compile-only devices of this client's topology: one partition
            per device (a device assignment of one replica) unless ``compile_options`` sets
            its own device assignment; None: as ``compile_options`` says (one device by
            default).
          compile_options: a [`CompileOptions`][pjrt.compile_options.CompileOptions]; the
            caller's object is left unchanged.
          host_callbacks: jaxlib's host callbacks; a compile-only program can carry none.

        Returns:
          An [`Executable`][pjrt.topology.Executable]: inspect it, ``serialize()`` it, and
          load the bytes with ``Client.deserialize_executable`` on a client of the same
          plugin build to run it.

        Raises:
          ValueError: a device is not a compile-only device of this topology, or host
            callbacks were given.
          ClosedClientError: the topology's client is closed.
          XlaRuntimeError: compilation failed (the plugin's message is kept).
        """
        from .compile_options import CompileOptions

        if host_callbacks:
            raise ValueError("a program compiled for compile-only devices cannot carry host "
                             "callbacks (they would run in this process); compile it on a "
                             "client of the platform instead")
        options = compile_options or CompileOptions()
        if executable_devices is not None:
            options = self.topology._options_for_devices(options, executable_devices)
        devices = list(executable_devices) if executable_devices is not None else None
        if self._client is not None:
            live = {device.id: device for device in self._client.devices()}
            loaded = self._client.compile_and_load(
                computation, [live[d.id] for d in devices] if devices else None,
                compile_options=options)
            return Executable(self.topology, loaded.metadata, devices, loaded=loaded)
        pointer = self.topology._compile_executable(computation, options)
        return Executable(self.topology, _TopologyProgram(self.topology, pointer), devices)

    def compile_and_load(self, *args, **kwargs):
        """Refused: a compile-only client loads nothing (jaxlib refuses it too)."""
        raise _cannot_run("compile_and_load on a compile-only client",
                          "compile it with compile(...) and load executable.serialize() with "
                          "Client.deserialize_executable, or compile on a live client")

    def deserialize_executable(self, *args, **kwargs):
        """Refused: a compile-only client loads nothing."""
        raise _cannot_run("deserialize_executable on a compile-only client",
                          "load the bytes with Client.deserialize_executable on a live client "
                          "of the same plugin build")

    def __repr__(self) -> str:
        return (f"CompileOnlyClient(platform={self.platform!r}, "
                f"devices={self.device_count()})")


def _cannot_run(what: str, instead: str) -> RuntimeError:
    return RuntimeError(f"{what}: it was compiled for compile-only devices, which cannot run "
                        f"programs; {instead}")


class Executable:
    """A program compiled for compile-only devices and not loaded (jaxlib's ``Executable``,
    what a compile-only client's ``compile`` returns): ``hlo_modules``,
    ``get_compiled_memory_stats``, ``cost_analysis``, ``get_parameter_shardings``,
    ``get_output_shardings``, ``get_parameter_layouts``, ``get_output_layouts``,
    ``get_output_memory_kinds`` and ``serialize``, under jaxlib's names.

    It cannot run: ``execute`` and its relatives raise, saying to load
    ``serialize()``'s bytes with ``Client.deserialize_executable`` on a client of the same
    plugin build. `delete` frees it at once; otherwise it goes with its last reference (or
    its topology's client).
    """

    def __init__(self, topology: DeviceTopology, program, devices, *, loaded=None):
        self.topology = topology
        #: What answers the questions: the loaded program's description, or the topology's
        #: PJRT_Executable.
        self._program = program
        #: A client's topology compiles on that client: the loaded executable it made.
        self._loaded = loaded
        self._devices = devices

    def hlo_modules(self) -> list:
        """The optimised program as jaxlib's ``HloModule`` objects (one)."""
        return self._program.hlo_modules()

    def hlo_text(self) -> str:
        """The optimised program as readable HLO text."""
        return self._program.hlo_text()

    as_text = hlo_text

    def get_compiled_memory_stats(self):
        """What the compiled program needs on its device, in bytes."""
        return self._program.get_compiled_memory_stats()

    def cost_analysis(self) -> dict:
        """The plugin's cost estimates; {} if none."""
        return self._program.cost_analysis()

    def get_parameter_layouts(self) -> list:
        return self._program.get_parameter_layouts()

    def get_output_layouts(self) -> list:
        return self._program.get_output_layouts()

    def get_output_memory_kinds(self) -> list[list[str]]:
        """The memory kind of each output, in jaxlib's form (one list per program)."""
        return self._program.get_output_memory_kinds()

    def get_parameter_shardings(self) -> list | None:
        """Each parameter's [`HloSharding`][pjrt.hlo_sharding.HloSharding] as the SPMD
        partitioner chose it; None for a program that was not partitioned (as in jaxlib,
        whose are ``OpSharding`` protos)."""
        raw = self._signature().parameter_shardings
        return None if raw is None else [HloSharding.from_proto(entry) for entry in raw]

    def get_output_shardings(self) -> list | None:
        """Each output's [`HloSharding`][pjrt.hlo_sharding.HloSharding]; None for a program
        that was not partitioned."""
        raw = self._signature().output_sharding
        if raw is None:
            return None
        sharding = HloSharding.from_proto(raw)
        return list(sharding.tuple_elements()) if sharding.is_tuple() else [sharding]

    def _signature(self):
        from ._wire import hlo_module

        return hlo_module.module_signature(self._program.optimized_module_proto())

    def name(self) -> str:
        return self._program.name()

    @property
    def fingerprint(self) -> bytes | None:
        """A fingerprint of the compiled program, or None if the plugin has none (a property,
        as a loaded executable's)."""
        return self._program.fingerprint

    def serialize(self) -> bytes:
        """The compiled program as bytes for ``Client.deserialize_executable`` on a client of
        the same plugin build (the bytes name it, as a loaded executable's do)."""
        return self._program.serialize()

    def delete(self) -> None:
        """Free the compiled program now; later questions raise."""
        if self._loaded is not None:
            self._loaded.delete()
        else:
            self._program.close()

    def execute(self, *args, **kwargs):
        """Refused: see the class."""
        raise _cannot_run("this executable cannot execute", _LOAD_IT)

    execute_sharded = execute_with_token = execute_global = __call__ = execute

    def __repr__(self) -> str:
        where = (", ".join(str(d) for d in self._devices) if self._devices
                 else self.topology.platform)
        return f"Executable(compile-only, {where})"


_LOAD_IT = ("load executable.serialize() with Client.deserialize_executable on a client of "
            "the same plugin build, then run what it returns")


class _TopologyProgram:
    """A ``PJRT_Executable`` that ``PJRT_Compile`` made on a topology: it answers the questions
    a loaded program's [`ExecutableMetadata`][pjrt.executable.ExecutableMetadata] does about
    its ``PJRT_Executable``, with the same code, and owns the pointer (freed by `close`, or
    when the object goes, once no call on it is running)."""

    from ._runtime.executable_metadata import ExecutableMetadata as _Questions

    name, num_replicas, num_partitions = (_Questions.name, _Questions.num_replicas,
                                          _Questions.num_partitions)
    fingerprint = _Questions.fingerprint
    size_of_generated_code_in_bytes = _Questions.size_of_generated_code_in_bytes
    get_compiled_memory_stats = _Questions.get_compiled_memory_stats
    cost_analysis, output_memory_kinds = _Questions.cost_analysis, _Questions.output_memory_kinds
    get_parameter_layouts = _Questions.get_parameter_layouts
    get_output_layouts = _Questions.get_output_layouts
    optimized_module_proto = _Questions.optimized_module_proto
    hlo_text, hlo_modules = _Questions.hlo_text, _Questions.hlo_modules
    del _Questions

    def __init__(self, topology: DeviceTopology, pointer):
        self._topology = topology
        self._handle = _ExecutableHandle(topology._plugin.api, pointer)
        weakref.finalize(self, self._handle.close).atexit = False

    @property
    def _executable(self):
        return self._handle.pointer

    def _live_pointer(self):
        if self._handle.closed or self._handle.pointer == ffi.NULL:
            raise RuntimeError("this executable has been deleted")
        return self._handle.pointer

    _executable_ptr = _live_pointer

    def _optimized_module_bytes(self) -> bytes | None:
        from ._runtime.executable_metadata import optimized_module_bytes

        return optimized_module_bytes(self._handle.api, self._live_pointer())

    def _layouts(self, which: str) -> list:
        from ._runtime.executable_metadata import executable_layouts

        return executable_layouts(self._handle.api, self._live_pointer(), which)

    def get_output_memory_kinds(self) -> list[list[str]]:
        return [self.output_memory_kinds()]

    def serialize(self) -> bytes:
        from ._runtime import serialization

        topology = self._topology
        with self._handle.calling():
            api = self._handle.api
            payload = serialization.executable_bytes(api, self._executable_ptr())
            return serialization.pack(payload, serialization.plugin_identity(
                topology._plugin, topology.platform, topology.platform_version))

    def close(self) -> None:
        self._handle.close("this executable has been deleted")


class _ExecutableHandle(ClientHandle):
    """Owns a ``PJRT_Executable*`` under the client handles' rules: calls take tickets, and
    ``close()`` frees it once no call is running (never after a fork)."""

    __slots__ = ()

    def _destroy_pointer(self, pointer) -> None:
        _destroy_executable(self.api, pointer)

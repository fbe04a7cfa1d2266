"""What a compiled program says about itself: its devices, the shapes, dtypes, shardings and
layouts of its parameters and outputs, the plugin's memory and cost estimates, its optimised
HLO and its serialized form.

`ExecutableMetadata` is the description a [`LoadedExecutable`][pjrt.executable.LoadedExecutable]
holds (its ``metadata``): everything a call needs is read once, when the executable is loaded;
the rest is asked of the plugin when wanted. Launching is `pjrt._runtime.launcher`'s.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Sequence

from .. import dtypes, layouts
from . import serialization
from .._wire import hlo_module as _hlo
from .._wire import protowire
from .._capi.api import HEADER_VERSION, to_str
from .._capi.options import named_values_to_dict
from .._pjrt_cffi import ffi
from ..errors import ClosedClientError, ErrorCode, UnsupportedFeatureError, XlaRuntimeError
from ..hlo_sharding import HloSharding
from ..sharding import (GSPMDSharding, PmapSharding, SingleDeviceSharding,
                        global_shape_of_shards)

if TYPE_CHECKING:
    from ..device import ClientView, Device

_NULL = ffi.NULL


@dataclasses.dataclass(frozen=True)
class CompiledMemoryStats:
    """Memory an executable needs on its device, in bytes (``PJRT_Executable_GetCompiledMemoryStats``)."""

    generated_code_size_in_bytes: int
    argument_size_in_bytes: int
    output_size_in_bytes: int
    alias_size_in_bytes: int
    temp_size_in_bytes: int
    host_generated_code_size_in_bytes: int = 0
    host_argument_size_in_bytes: int = 0
    host_output_size_in_bytes: int = 0
    host_alias_size_in_bytes: int = 0
    host_temp_size_in_bytes: int = 0
    peak_memory_in_bytes: int = 0


class HloModule:
    """One optimised HLO module of a compiled program (jaxlib's ``HloModule``), as
    ``LoadedExecutable.hlo_modules()`` hands it out: a serialised ``xla.HloModuleProto`` and
    what is read from it.

    `to_string` is pjrt's rendering of the proto in XLA's textual style (names, shapes,
    opcodes, operands, called computations, common attributes), written for reading: XLA's
    own printer is C++ inside the plugin, so the text is not XLA's byte for byte and is not
    meant to be parsed back. The proto itself is the plugin's, unchanged.
    """

    __slots__ = ("_serialized", "_name")

    def __init__(self, serialized: bytes):
        data = bytes(serialized)
        try:
            fields = protowire.group_fields(data)
        except (TypeError, ValueError) as error:
            raise ValueError(f"these {len(data)} bytes are not a serialised HloModuleProto: "
                             f"{error}") from None
        if not fields.get(3):
            raise ValueError(f"these {len(data)} bytes are not a serialised HloModuleProto: "
                             f"it has no computations (field 3)")
        names = fields.get(1, [])
        if names and not isinstance(names[-1], bytes):
            raise ValueError("these bytes are not a serialised HloModuleProto: its name "
                             "(field 1) is not a string")
        self._serialized = data
        self._name = names[-1].decode("utf-8", "replace") if names else ""

    @classmethod
    def from_serialized_hlo_module_proto(cls, serialized: bytes) -> "HloModule":
        """The module a serialised ``HloModuleProto`` holds (what
        `as_serialized_hlo_module_proto` gives).

        Raises:
          ValueError: the bytes are not a serialised ``HloModuleProto``.
        """
        return cls(serialized)

    @property
    def name(self) -> str:
        """The module's name (the StableHLO module's, e.g. ``module @jit_f`` gives ``jit_f``)."""
        return self._name

    def to_string(self) -> str:
        """The module as readable HLO text, starting ``HloModule <name>``."""
        return _hlo.module_text(self._serialized)

    def as_serialized_hlo_module_proto(self) -> bytes:
        """The module as a serialised ``xla.HloModuleProto``, as the plugin gave it."""
        return self._serialized

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HloModule):
            return NotImplemented
        return self._serialized == other._serialized

    def __hash__(self) -> int:
        return hash(self._serialized)

    def __str__(self) -> str:
        return self.to_string()

    def __repr__(self) -> str:
        return f"HloModule(name={self._name!r}, {len(self._serialized)} bytes)"


class ExecutableMetadata:
    """What a loaded program says about itself: read once, when it is loaded, and asked of the
    plugin when wanted. A [`LoadedExecutable`][pjrt.executable.LoadedExecutable] holds one (its
    ``metadata``) and answers the questions below through it; its launches read the facts a
    call needs from the public attributes here."""

    def __init__(self, client: "ClientView", loaded, executable, *,
                 global_devices: Sequence["Device"] | None = None,
                 declared_output_shapes: tuple | None = None):
        """Read what a call needs of the program ``executable`` (the ``PJRT_Executable`` of
        the ``PJRT_LoadedExecutable`` ``loaded``) of ``client``."""
        self._client = client
        self._handle = client.raw_handle
        #: The ``PJRT_Executable``; NULL once the executable is unloaded (`forget`).
        self._executable = executable
        api = self._handle.api
        found = api.call_new("PJRT_LoadedExecutable_AddressableDevices", executable=loaded)
        #: The devices it runs on here, in execution order.
        self.devices: tuple = tuple(client.device_from_pointer(found.addressable_devices[i])
                                    for i in range(found.num_addressable_devices))
        # A program spanning processes: its shardings name every process's devices (in
        # device-assignment order), while it runs here on the addressable ones.
        self._global_devices = (tuple(global_devices) if global_devices is not None and any(
            not d.is_addressable for d in global_devices) else None)
        #: The program's output count; its outputs' per-device shapes and dtypes (None when
        #: the plugin does not say).
        self.num_outputs = int(api.call_new("PJRT_Executable_NumOutputs",
                                            executable=executable).num_outputs)
        self.output_shapes, self.output_dtypes = self._read_output_types()
        #: What the optimised module says of its parameters and outputs (None: it says nothing).
        self.signature = self._read_signature()
        #: Per parameter ``(shape, dtype)`` (None where unknown), or None.
        self.parameter_specs = (tuple((p.shape, p.dtype) if p is not None else None
                                      for p in self.signature.parameters)
                                if self.signature is not None else None)
        #: The donated parameters' indices, in order.
        self.donated = tuple(sorted(self.donated_parameters))
        self.replicas = int(api.call_new("PJRT_Executable_NumReplicas",
                                         executable=executable).num_replicas)
        self._input_shardings = self._output_shardings = None
        self._output_global_shapes = None
        #: The outputs' global shapes the compiler was asked for (checked against its own).
        self.declared_output_shapes = declared_output_shapes
        #: index -> layout of parameters compiled (``argument_layouts``) to take a non-row-major
        #: one (see [`pjrt.layouts.layouts_arguments_must_have`][pjrt.layouts.layouts_arguments_must_have]).
        self.layout_checks = self._read_layout_checks()
        #: Per output ``(shape, dtype)``, or None where the plugin does not say.
        self.output_specs = (tuple(zip(self.output_shapes, self.output_dtypes or ()))
                             if self.output_shapes is not None else None)
        #: Per output, its dimensions from major to minor when the program lays it out other
        #: than row-major (an output layout compiled in), else None. Reads honour it (see
        #: `pjrt._runtime.host_reads`); such programs leave the per-call path.
        self.output_orders = self._read_output_orders()
        #: Outputs whose size each call decides (see `pjrt._runtime.launches.unpadded`).
        self.dynamic_outputs = (self.signature.dynamic_outputs
                                if self.signature is not None else frozenset())

    def forget(self) -> None:
        """The executable was unloaded: later questions to the plugin raise."""
        self._executable = _NULL

    @property
    def spans_processes(self) -> bool:
        """Whether the program runs on devices of other processes too."""
        return self._global_devices is not None

    # -- metadata read once ----------------------------------------------------------------

    def _read_layout_checks(self) -> dict:
        try:
            found = self._layouts("parameters")
        except (UnsupportedFeatureError, XlaRuntimeError, ValueError):
            return {}
        return layouts.layouts_arguments_must_have(found)

    def _read_output_orders(self) -> tuple:
        count = self.num_outputs
        try:
            found = self.get_output_layouts()
        except Exception:  # noqa: BLE001 - a plugin that does not say: its default, row-major
            return (None,) * count
        orders = tuple(layouts.stored_order(layout) for layout in found)
        return orders if len(orders) == count else (None,) * count

    def _read_output_types(self):
        api = self._handle.api
        count = self.num_outputs
        try:
            types = api.call_new("PJRT_Executable_OutputElementTypes", executable=self._executable)
            dims = api.call_new("PJRT_Executable_OutputDimensions", executable=self._executable)
        except XlaRuntimeError:
            return None, None  # read from each result buffer instead
        output_dtypes = []
        for i in range(count):
            try:
                output_dtypes.append(dtypes.from_pjrt_type(types.output_types[i]))
            except TypeError:
                raise TypeError(f"output {i} of the program has PJRT buffer type "
                                f"{types.output_types[i]} (a token or another value that is not "
                                f"an array), which pjrt cannot return; return arrays only") from None
        output_dtypes = tuple(output_dtypes)
        shapes = []
        offset = 0
        for i in range(count):
            rank = int(dims.dim_sizes[i])
            shapes.append(tuple(int(dims.dims[offset + j]) for j in range(rank)))
            offset += rank
        return tuple(shapes), output_dtypes

    def _read_signature(self) -> _hlo.ModuleSignature | None:
        serialized = self._optimized_module_bytes()
        if serialized is None:
            return None
        try:
            return _hlo.module_signature(serialized)
        except ValueError:
            return None

    def _optimized_module_bytes(self) -> bytes | None:
        return optimized_module_bytes(self._handle.api, self._executable)

    def _live_pointer(self):
        pointer = self._executable
        if pointer == _NULL:
            raise RuntimeError("this executable has been deleted")
        if self._handle.closed:
            raise ClosedClientError(f"this executable's client is closed: "
                                    f"{self._handle.closed_reason}")
        return pointer

    # -- global shapes (execute_global) ----------------------------------------------------

    def output_global_shape(self, index: int) -> tuple:
        """Output ``index``'s global shape, from its shards (`check_output_layouts`)."""
        shapes = self._output_global_shapes
        if shapes is None:
            shapes = self._output_global_shapes = self.check_output_layouts()
        return shapes[index]

    def check_output_layouts(self) -> tuple:
        """Each output's global shape, from its shards; ValueError when the program declares
        another one (XLA pads uneven shards, which an Array cannot represent, as in jax)."""
        if self._output_global_shapes is not None:
            return self._output_global_shapes
        shard_shapes = [shape for shape, _ in self.output_specs or ()]
        shapes = tuple(global_shape_of_shards(sharding, shard_shape)
                       for sharding, shard_shape in zip(self.output_shardings, shard_shapes))
        # A replicated program declares per-replica shapes; only partitioned ones are compared.
        declared = (self.declared_output_shapes or ()) if self.replicas == 1 else ()
        for i, (shape, wanted) in enumerate(zip(shapes, declared)):
            if wanted is not None and tuple(wanted) != shape:
                sharding = self.output_shardings[i].to_hlo_sharding(len(wanted))
                raise ValueError(
                    f"output {i} has shape {tuple(wanted)}, which {sharding} splits unevenly "
                    f"(XLA pads its shards to {shard_shapes[i]}); pjrt, like jax, holds only "
                    f"evenly sharded arrays: shard that output along dimensions it divides")
        self._output_global_shapes = shapes
        return shapes

    # -- queries ---------------------------------------------------------------------------

    @property
    def client(self) -> "ClientView":
        return self._client

    def local_devices(self) -> list["Device"]:
        """The devices the executable runs on, in execution order."""
        return list(self.devices)

    addressable_devices = local_devices

    def global_devices(self) -> list["Device"]:
        """Every device the program runs on, other processes' included (the local devices
        for a program of this process alone)."""
        return list(self._global_devices or self.devices)

    @property
    def input_shapes(self) -> tuple | None:
        """Per-device ``(shape, dtype)`` of each parameter, from the optimised module."""
        if self.signature is None:
            return None
        return tuple((p.shape, p.dtype) if p is not None else None
                     for p in self.signature.parameters)

    @property
    def donated_parameters(self) -> frozenset:
        """Indices of parameters whose buffers the program takes over (donation)."""
        return self.signature.donated_parameters if self.signature else frozenset()

    @property
    def input_shardings(self) -> tuple:
        """How each parameter is laid out over the executable's devices (a Sharding each):
        the partitioner's choice for an SPMD program, one slice per device for a replicated
        one, the single device otherwise."""
        if self._input_shardings is None:
            count = len(self.signature.parameters) if self.signature is not None else 0
            self._input_shardings = self._shardings(
                self.signature.parameter_shardings if self.signature else None, count)
        return self._input_shardings

    @property
    def output_shardings(self) -> tuple:
        """How each output is laid out over the executable's devices (a Sharding each)."""
        if self._output_shardings is None:
            raw = self.signature.output_sharding if self.signature is not None else None
            per_output = None
            if raw is not None:
                parsed = HloSharding.from_proto(raw)
                per_output = ([e for e in parsed.tuple_elements()] if parsed.is_tuple()
                              else [parsed])
                if len(per_output) != self.num_outputs:
                    per_output = None
            self._output_shardings = self._shardings(per_output, self.num_outputs)
        return self._output_shardings

    def _shardings(self, raw: Sequence | None, count: int) -> tuple:
        devices = self._global_devices or self.devices
        if not devices:
            raise ValueError("this executable is portable (compiled with CompileOptions."
                             "compile_portable_executable): it has no devices, so no "
                             "shardings; run it with execute(arguments, device=...)")
        if len(devices) == 1:
            return tuple(SingleDeviceSharding(devices[0]) for _ in range(count))
        if self.replicas > 1:
            return tuple(PmapSharding(devices) for _ in range(count))
        result = []
        for i in range(count):
            entry = raw[i] if raw is not None and i < len(raw) else None
            if entry is None:
                result.append(GSPMDSharding.get_replicated(devices))
            else:
                hlo = entry if isinstance(entry, HloSharding) else HloSharding.from_proto(entry)
                result.append(GSPMDSharding(devices, hlo))
        return tuple(result)

    def name(self) -> str:
        with self._handle.calling():
            args = self._handle.api.call_new("PJRT_Executable_Name",
                                             executable=self._executable_ptr())
            return to_str(args.executable_name, args.executable_name_size)

    def _executable_ptr(self):
        self._live_pointer()
        return self._executable

    def num_replicas(self) -> int:
        with self._handle.calling():
            return int(self._handle.api.call_new("PJRT_Executable_NumReplicas",
                                                 executable=self._executable_ptr()).num_replicas)

    def num_partitions(self) -> int:
        with self._handle.calling():
            return int(self._handle.api.call_new("PJRT_Executable_NumPartitions",
                                                 executable=self._executable_ptr()).num_partitions)

    @property
    def fingerprint(self) -> bytes | None:
        """A fingerprint of the compiled program, or None if the plugin has none (a property,
        as in jaxlib)."""
        with self._handle.calling():
            api = self._handle.api
            if not api.has("PJRT_Executable_Fingerprint"):
                return None
            try:
                args = api.call_new("PJRT_Executable_Fingerprint",
                                    executable=self._executable_ptr())
            except XlaRuntimeError:
                return None
            if args.executable_fingerprint == _NULL:
                return None
            return ffi.unpack(args.executable_fingerprint, args.executable_fingerprint_size)

    def size_of_generated_code_in_bytes(self) -> int:
        with self._handle.calling():
            return int(self._handle.api.call_new("PJRT_Executable_SizeOfGeneratedCodeInBytes",
                                                 executable=self._executable_ptr()).size_in_bytes)

    def get_compiled_memory_stats(self) -> CompiledMemoryStats:
        """What the compiled program needs on its device, in bytes."""
        with self._handle.calling():
            args = self._handle.api.call_new("PJRT_Executable_GetCompiledMemoryStats",
                                             executable=self._executable_ptr())
            values = {}
            for field in dataclasses.fields(CompiledMemoryStats):
                values[field.name] = int(getattr(args, field.name, 0))
            return CompiledMemoryStats(**values)

    def cost_analysis(self) -> dict:
        """The plugin's cost estimates (e.g. ``flops``, ``bytes accessed``); {} if none."""
        with self._handle.calling():
            api = self._handle.api
            try:
                args = api.call_new("PJRT_Executable_GetCostAnalysis",
                                    executable=self._executable_ptr())
            except (XlaRuntimeError, UnsupportedFeatureError):
                return {}
            return named_values_to_dict(args.properties, args.num_properties)

    def output_memory_kinds(self) -> list[str]:
        """The memory kind of each output (e.g. ``"device"``)."""
        with self._handle.calling():
            args = self._handle.api.call_new("PJRT_Executable_OutputMemoryKinds",
                                             executable=self._executable_ptr())
            return [to_str(args.memory_kinds[i], args.memory_kind_sizes[i])
                    for i in range(args.num_outputs)]

    def get_output_memory_kinds(self) -> list[list[str]]:
        """jaxlib's form of `output_memory_kinds`: one list per program (one here); the
        devices' default memory for plugins that cannot say (XLA's CPU plugin at 0.81)."""
        try:
            return [self.output_memory_kinds()]
        except XlaRuntimeError as error:
            if error.code != ErrorCode.UNIMPLEMENTED:
                raise
            return [[self.devices[0].default_memory().kind] * self.num_outputs]

    def get_parameter_layouts(self) -> list[layouts.PjRtLayout]:
        """The memory layout the program expects of each parameter (the plugin's layouts
        extension, else the optimised module's program shape)."""
        with self._handle.calling():
            return self._layouts("parameters")

    def get_output_layouts(self) -> list[layouts.PjRtLayout]:
        """The memory layout of each output (as `get_parameter_layouts`)."""
        with self._handle.calling():
            return self._layouts("outputs")

    def _layouts(self, which: str) -> list[layouts.PjRtLayout]:
        return executable_layouts(self._handle.api, self._executable_ptr(), which)

    input_layouts = property(get_parameter_layouts, doc="The parameters' layouts.")
    output_layouts = property(get_output_layouts, doc="The outputs' layouts.")

    def optimized_module_proto(self) -> bytes:
        """The optimised program as a serialised ``xla.HloModuleProto``."""
        with self._handle.calling():
            self._live_pointer()
            serialized = self._optimized_module_bytes()
            if serialized is None:
                api = self._handle.api
                raise UnsupportedFeatureError("PJRT_Executable_OptimizedProgram", api.plugin_name,
                                              api.version, HEADER_VERSION,
                                              why="the plugin cannot return the optimised program")
            return serialized

    def hlo_text(self) -> str:
        """The optimised program as readable HLO text (names, shapes, opcodes, operands)."""
        return _hlo.module_text(self.optimized_module_proto())

    as_text = hlo_text

    def hlo_modules(self) -> list[HloModule]:
        """The optimised program as jaxlib's ``HloModule`` objects: one, since a PJRT
        executable is one module (jaxlib's list form kept for code written against it).

        Raises:
          UnsupportedFeatureError: the plugin cannot return the optimised program.
        """
        return [HloModule(self.optimized_module_proto())]

    def serialize(self) -> bytes:
        """The compiled executable as bytes, for `Client.deserialize_executable`.

        The bytes name the plugin build that made them (a [`PluginIdentity`][pjrt.compilation_cache.PluginIdentity]), and
        only that build will load them.
        """
        with self._handle.calling():
            payload = serialization.executable_bytes(self._handle.api, self._executable_ptr())
            client = self._client
            return serialization.pack(payload, serialization.plugin_identity(
                client.plugin, client.platform, client.platform_version))


def optimized_module_bytes(api, executable) -> bytes | None:
    """The optimised program of the ``PJRT_Executable`` ``executable`` as a serialised
    ``xla.HloModuleProto``; None when the plugin cannot say."""
    if not api.has("PJRT_Executable_OptimizedProgram"):
        return None
    program = ffi.new("PJRT_Program *")
    program.struct_size = ffi.sizeof("PJRT_Program")
    args = api.new_args("PJRT_Executable_OptimizedProgram_Args")
    args.executable = executable
    args.program = program
    try:
        api.call("PJRT_Executable_OptimizedProgram", args)  # asks for the size
        buffer = ffi.new("char[]", max(program.code_size, 1))
        program.code = buffer
        api.call("PJRT_Executable_OptimizedProgram", args)
    except XlaRuntimeError:
        return None
    serialized = ffi.unpack(buffer, program.code_size)
    if to_str(program.format, program.format_size) == "hlo_with_config":
        serialized = _hlo.module_from_module_with_config(serialized)
    return serialized


def executable_layouts(api, executable, which: str) -> list[layouts.PjRtLayout]:
    """The layouts of the ``PJRT_Executable``'s ``"parameters"`` or ``"outputs"``: the
    plugin's layouts extension, else the optimised module's program shape."""
    try:
        return layouts.executable_layouts(api, executable, which)
    except UnsupportedFeatureError:
        module = optimized_module_bytes(api, executable)
        if module is None:
            raise
        return list(layouts.module_layouts(module)[which == "outputs"])

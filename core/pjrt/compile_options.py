"""XLA compile options, serialised as ``xla.CompileOptionsProto``.

``PJRT_Client_Compile`` takes its options as a serialised
``CompileOptionsProto`` (``xla/pjrt/proto/compile_options.proto``). This
module builds that message in pure Python with the tiny wire-format writer in
`pjrt._wire.protowire`, so the core package needs no ``protobuf`` runtime and
no generated code: the part of the schema we speak is small, and protobuf
field numbers never change once assigned, so hand-written numbers stay valid
across XLA versions (fields a newer XLA adds are simply not written, and an
older XLA skips fields it does not know).

Each message is one table of fields (name, proto number, type, default,
docstring; see `pjrt._wire.proto_message`), which gives the validated
attributes, the serialisation and the parser alike.

Class and attribute names follow jaxlib's ``xla_client`` (``CompileOptions``,
``ExecutableBuildOptions``, ``DeviceAssignment``, ``SerializeAsString``,
``ParseFromString``), so
code written against jaxlib reads the same here.

Where the field numbers come from (openxla/xla):

* ``CompileOptionsProto``, ``ExecutableBuildOptionsProto``,
  ``OptionOverrideProto``: ``xla/pjrt/proto/compile_options.proto``.
* ``DeviceAssignmentProto``: ``xla/xla_data.proto``.
* ``DebugOptions``: ``xla/xla.proto``, every field of the message at one openxla/xla
  commit, as a table generated from that file (``pjrt._wire.debug_options_fields``,
  written by ``scripts/generate-debug-options.py``, whose header names the commit).
  Field names, unlike numbers, do change between XLA versions, and overrides go by
  name: a field the plugin's XLA has renamed or dropped since the table's commit is
  refused by the plugin at compile time ("No such compile option"), and a field newer
  than the table is passed through ``CompileOptions.env_option_overrides``.

Presence rules that differ from plain proto3 "skip the defaults" (all read
from ``ExecutableBuildOptionsFromProto`` in
``xla/client/executable_build_options.cc``, which copies every scalar
straight out of the proto):

* ``device_ordinal`` is always written: XLA's "unset" is -1, while an absent
  field reads as 0, which would pin the build to device 0.
* ``num_replicas`` and ``num_partitions`` are always written: absent they read
  as 0, not 1.
* ``process_count`` is always written, for the same reason (XLA's C++ default
  is 1).
* The two ``allow_spmd_sharding_propagation_to_*`` lists default to
  ``[False]``, as XLA's C++ ``ExecutableBuildOptions`` does, and are written
  as such (jaxlib writes them too).
* ``debug_options`` is **not** written as the ``DebugOptions`` sub-message.
  XLA replaces its whole default ``DebugOptions`` with that sub-message, so
  a message carrying only the fields a user set would silently zero every
  other option (``xla_backend_optimization_level`` would drop from 3 to 0,
  and so on). Instead each option the user set goes into
  ``env_option_overrides``, which XLA's ``CompileOptions::ApplyOption``
  applies field by field on top of its defaults; jax sends its per-jit
  ``compiler_options`` the same way.

Parsing ([`CompileOptions.from_serialized`][pjrt.compile_options.CompileOptions.from_serialized]) reads what jaxlib writes: the
complete ``DebugOptions`` message jaxlib always sends is accepted, the fields
of it that the table has are read into ``debug_options`` (and so travel on as
overrides; a jaxlib of another XLA version may name some of them differently,
see above), and its other fields are ignored, as the plugin's own defaults
then apply. Other fields this module does not model are refused by default
(``strict=True``) and skipped with ``strict=False``.
"""

from __future__ import annotations

import enum
import math
import numbers
from typing import Any, Dict, List, Optional, Tuple

from ._wire import protowire as pw
from ._wire.debug_options_fields import AutotuneCacheMode
from ._wire.debug_options import DebugOptions, OptionOverrideValue, check_override
from ._wire.device_assignment import DeviceAssignment
from ._wire.proto_message import (BOOL, BYTES, FLOAT, INT32, INT32_MAX, INT64, PACKED_BOOL,
                                  PACKED_INT64, STRING, Field, Kind, Message, check_int,
                                  check_str, float32, is_bool, is_int, message_kind, slots)
from .shapes import Shape

__all__ = [
    "CompileOptions",
    "ExecutableBuildOptions",
    "DebugOptions",
    "AutotuneCacheMode",
    "DeviceAssignment",
    "EffortLevel",
    "OptionOverrideValue",
]

class EffortLevel(enum.IntEnum):
    """``xla.ExecutionOptions.EffortLevel`` (xla/xla.proto).

    Used by ``ExecutableBuildOptions.optimization_level`` and
    ``memory_fitting_level``. The values are spaced so that higher means more
    effort; ``EFFORT_UNKNOWN`` (0) leaves the choice to the backend.
    """

    EFFORT_UNKNOWN = 0
    EFFORT_O0 = 9
    EFFORT_O1 = 19
    EFFORT_O2 = 29
    EFFORT_O3 = 39


def _check_device_assignment(name: str, value: Any) -> Optional[DeviceAssignment]:
    if value is not None and not isinstance(value, DeviceAssignment):
        raise TypeError(
            f"{name} must be a DeviceAssignment (see DeviceAssignment.create) or None, "
            f"got {type(value).__name__}"
        )
    return value


# --------------------------------------------------------------------------
# ExecutableBuildOptions
# --------------------------------------------------------------------------


def _positive(name: str, value: Any) -> int:
    value = check_int(name, value)
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def _check_effort(name: str, value: Any) -> float:
    if is_bool(value) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    value = float(value)
    # compile_options.proto documents the domain as [-1.0, +1.0].
    if math.isnan(value) or not -1.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [-1.0, 1.0], got {value}")
    # The proto field is single precision; storing the rounded value keeps
    # what the attribute says equal to what XLA receives (and round-trips).
    return float32(value)


def _check_effort_level(name: str, value: Any) -> EffortLevel:
    if not is_int(value):
        raise TypeError(f"{name} must be an EffortLevel or int, got {type(value).__name__}")
    try:
        return EffortLevel(int(value))
    except ValueError:
        allowed = ", ".join(f"{e.name}={e.value}" for e in EffortLevel)
        raise ValueError(f"{name} must be one of {allowed}; got {int(value)}") from None


_DEVICE_ASSIGNMENT = message_kind(DeviceAssignment)
# Read (its modelled fields) when parsing, never written: see the module docstring.
_DEBUG_OPTIONS = message_kind(DebugOptions)


class ExecutableBuildOptions(Message):
    """``xla.ExecutableBuildOptionsProto``: how to build one executable.

    Defaults are XLA's C++ ``ExecutableBuildOptions`` defaults. Field numbers
    are those of xla/pjrt/proto/compile_options.proto.

    Raises (on assignment):
        TypeError: a value of the wrong type, naming the attribute.
        ValueError: a value out of range, naming the attribute.
    """

    PROTO_NAME = "ExecutableBuildOptionsProto"
    UNMODELLED_FIELDS = {2: "result_layout", 13: "comp_envs", 15: "device_memory_size",
                         26: "slice_size"}

    # "always": XLA's defaults are not proto3's zero for these (module docstring).
    # (XLA holds it in an int and aborts on a negative one: a value past int32 wraps to one.)
    device_ordinal = Field(1, INT64, -1, 'int; device to build for, -1 (default) for "any".',
                           check=lambda n, v: check_int(n, v, -1, INT32_MAX), presence="always")
    debug_options = Field(3, _DEBUG_OPTIONS, DebugOptions,
                          "[`DebugOptions`][pjrt.compile_options.DebugOptions] (sent as option overrides).",
                          presence="never", absent=DebugOptions)
    num_replicas = Field(4, INT64, 1, "int >= 1 (default 1).", check=_positive,
                         presence="always")
    num_partitions = Field(5, INT64, 1, "int >= 1 (default 1).", check=_positive,
                           presence="always")
    use_spmd_partitioning = Field(6, BOOL, False, "bool; SPMD (True) or MPMD partitioning "
                                  "when ``num_partitions > 1``.")
    use_auto_spmd_partitioning = Field(7, BOOL, False, "bool; let XLA choose shardings.")
    deduplicate_hlo = Field(8, BOOL, False, "bool; deduplicate HLO into calls (TPU only).")
    device_assignment = Field(9, _DEVICE_ASSIGNMENT, None,
                              "`DeviceAssignment` or None for a portable build; must "
                              "be ``num_replicas x num_partitions``.",
                              check=_check_device_assignment)
    alias_passthrough_params = Field(10, BOOL, False, "bool; alias parameters passed "
                                     "straight through to outputs.")
    run_backend_only = Field(11, BOOL, False, "bool; skip HLO passes (input is already "
                             "optimised).")
    # XLA's C++ default for both propagation lists is {false}; jaxlib writes it too.
    allow_spmd_sharding_propagation_to_output = Field(
        12, PACKED_BOOL, lambda: [False], "list[bool]; default ``[False]``; one value "
        "applies to all outputs.")
    fdo_profile = Field(14, BYTES, b"", "bytes; opaque feedback-directed-optimisation "
                        "profile.")
    auto_spmd_partitioning_mesh_shape = Field(16, PACKED_INT64, list,
                                              "list[int]; mesh for auto sharding.")
    auto_spmd_partitioning_mesh_ids = Field(17, PACKED_INT64, list,
                                            "list[int]; device ids of that mesh.")
    allow_spmd_sharding_propagation_to_parameters = Field(
        18, PACKED_BOOL, lambda: [False], "list[bool]; default ``[False]``; one value "
        "applies to all parameters.")
    use_shardy_partitioner = Field(19, BOOL, False, "bool; use Shardy instead of GSPMD.")
    exec_time_optimization_effort = Field(20, FLOAT, 0.0, "float in [-1, 1] (stored as "
                                          "float32).", check=_check_effort)
    memory_fitting_effort = Field(21, FLOAT, 0.0, "float in [-1, 1] (stored as float32).",
                                  check=_check_effort)
    process_index = Field(22, INT64, 0, "int >= 0; this process's index in a multi-process "
                          "job. PJRT clients usually fill this in themselves.",
                          check=lambda n, v: check_int(n, v, 0))
    # process_count is newer than the message; writers that predate it mean a
    # single process, XLA's C++ default, hence absent=1.
    process_count = Field(23, INT64, 1, "int >= 1 (default 1); number of processes.",
                          check=_positive, presence="always", absent=1)
    optimization_level = Field(24, INT32, EffortLevel.EFFORT_UNKNOWN, "[`EffortLevel`][pjrt.compile_options.EffortLevel].",
                               check=_check_effort_level)
    memory_fitting_level = Field(25, INT32, EffortLevel.EFFORT_UNKNOWN,
                                 "[`EffortLevel`][pjrt.compile_options.EffortLevel].", check=_check_effort_level)
    __slots__ = slots(locals())

    def _check_consistency(self) -> None:
        self._revalidate()
        da = self.device_assignment
        if da is not None and (
            da.replica_count() != self.num_replicas
            or da.computation_count() != self.num_partitions
        ):
            raise ValueError(
                f"device_assignment is {da.replica_count()}x{da.computation_count()} "
                f"(replicas x computations) but num_replicas={self.num_replicas} and "
                f"num_partitions={self.num_partitions}; they must agree"
            )
        if self.process_index >= self.process_count:
            raise ValueError(
                f"process_index={self.process_index} must be < process_count={self.process_count}"
            )

    def serialize(self) -> bytes:
        """Serialise as ``xla.ExecutableBuildOptionsProto``.

        ``debug_options`` is not part of this message (see the module
        docstring); [`CompileOptions`][pjrt.compile_options.CompileOptions] sends it as overrides.

        Raises:
            TypeError: an attribute mutated in place holds a wrong type.
            ValueError: a value is out of range, or ``device_assignment``
                disagrees with ``num_replicas`` x ``num_partitions``.
        """
        self._check_consistency()
        return self._serialize_fields()

    @classmethod
    def from_serialized(cls, data: bytes) -> "ExecutableBuildOptions":
        """Parse an ``xla.ExecutableBuildOptionsProto``; fields not modelled are skipped.

        Absent fields read as proto3's zero, as XLA reads them (so a missing
        ``num_replicas`` is reported, not hidden).

        Raises:
            TypeError, ValueError: malformed data, or values XLA would reject.
        """
        return cls._from_wire(data)


# --------------------------------------------------------------------------
# CompileOptions
# --------------------------------------------------------------------------


class _OO:
    """``OptionOverrideProto`` (oneof value); map entries are ``{key = 1; value = 2}``."""
    STRING_FIELD = 1   # string
    BOOL_FIELD = 2     # bool
    INT_FIELD = 3      # int64
    DOUBLE_FIELD = 4   # double


def _normalise_override_value(name: str, value: Any) -> OptionOverrideValue:
    # Order matters: bool before int (bool subclasses int), int before float.
    if is_bool(value):
        return bool(value)
    if isinstance(value, str):
        return value
    if is_int(value):
        return check_int(name, value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(
        f"{name} must be a str, bool, int or float, got {type(value).__name__}"
    )


def _check_overrides(name: str, value: Any) -> List[Tuple[str, OptionOverrideValue]]:
    if isinstance(value, dict):
        value = list(value.items())
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a list of (str, value) pairs, got {type(value).__name__}")
    out = []
    seen = set()
    for i, pair in enumerate(value):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise TypeError(f"{name}[{i}] must be a (str, value) pair, got {pair!r}")
        key, val = pair
        key = check_str(f"{name}[{i}] key", key)
        # The proto field is a map: a repeated key would silently keep only
        # one of the values.
        if key in seen:
            raise ValueError(f"{name} has the key {key!r} more than once")
        seen.add(key)
        val = _normalise_override_value(f"{name}[{key!r}]", val)
        check_override(key, val)  # a DebugOptions value XLA ends the compile on
        out.append((key, val))
    return out


def _encode_override(value: OptionOverrideValue) -> bytes:
    # A oneof member is written even when it holds 0/false/"": its presence
    # is what says which alternative is set.
    if isinstance(value, bool):
        return pw.bool_field(_OO.BOOL_FIELD, value)
    if isinstance(value, str):
        return pw.string_field(_OO.STRING_FIELD, value)
    if isinstance(value, int):
        return pw.int_field(_OO.INT_FIELD, value)
    return pw.double_field(_OO.DOUBLE_FIELD, value)


def _encode_overrides(number: int, pairs: List[Tuple[str, OptionOverrideValue]]) -> bytes:
    return b"".join(
        pw.message_field(number, pw.string_field(1, key)
                         + pw.message_field(2, _encode_override(value)))
        for key, value in pairs)


_OVERRIDE_KINDS = {_OO.STRING_FIELD: STRING, _OO.BOOL_FIELD: BOOL, _OO.INT_FIELD: INT64}


def _decode_override_entry(wire_type: int, entry: bytes, what: str
                           ) -> List[Tuple[str, OptionOverrideValue]]:
    key = ""
    value: Optional[OptionOverrideValue] = None
    for field, wt, raw in pw.iter_fields(entry):
        if field == 1:
            key = STRING.decode(wt, raw, f"{what} key")
        elif field == 2:
            pw.expect_wire_type(wt, pw.LEN, f"{what} value")
            for f2, wt2, v2 in pw.iter_fields(raw):
                q = f"{what}[{key!r}]"
                # Last oneof member on the wire wins, as in protobuf.
                if f2 in _OVERRIDE_KINDS:
                    value = _OVERRIDE_KINDS[f2].decode(wt2, v2, q)
                elif f2 == _OO.DOUBLE_FIELD:
                    pw.expect_wire_type(wt2, pw.I64, q)
                    value = pw.to_double(v2)
    if value is None:
        # XLA's LoadEnvOptionOverrides rejects this too ("value not set").
        raise ValueError(f"env_option_overrides[{key!r}] has no value set")
    return [(key, value)]


_OVERRIDE_MAP = Kind("map<string, OptionOverrideProto>", pw.LEN, _check_overrides, list,
                     _encode_overrides, _decode_override_entry, repeated=True)


def _check_argument_layouts(name: str, value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(isinstance(s, Shape) for s in value):
        raise TypeError(f"{name} must be None or a list of pjrt.shapes.Shape (one per "
                        f"argument, each with its layout), not {value!r}")
    return list(value)


#: ``repeated xla.ShapeProto``; None (XLA picks default layouts) reads and writes as empty.
_SHAPE_LIST = Kind("repeated ShapeProto", pw.LEN, _check_argument_layouts, None,
                   lambda number, shapes: b"".join(pw.message_field(number, s.to_proto())
                                                   for s in shapes or ()),
                   lambda wt, raw, what: [Shape.from_proto(raw)], repeated=True,
                   is_zero=lambda value: not value)


_BUILD_OPTIONS = message_kind(ExecutableBuildOptions, with_unmodelled=True)


class CompileOptions(Message):
    """``xla.CompileOptionsProto``: everything ``PJRT_Client_Compile`` takes.

    ``num_replicas``, ``num_partitions`` and ``device_assignment`` are also
    attributes (and keywords) here: shortcuts for the same attributes of
    ``executable_build_options``, as in jaxlib.

    Example::

        opts = CompileOptions(num_replicas=2)
        opts.executable_build_options.debug_options.xla_dump_to = "/tmp/d"
        payload = opts.SerializeAsString()

    Raises (on assignment):
        TypeError: a value of the wrong type, naming the attribute.
        ValueError: a value out of range, or a repeated override key.
    """

    PROTO_NAME = "CompileOptionsProto"
    UNMODELLED_FIELDS = {6: "serialized_multi_slice_config", 8: "target_config",
                         9: "allow_in_place_mlir_modification",
                         10: "matrix_unit_operand_precision", 11: "compiler_variant"}

    argument_layouts = Field(1, _SHAPE_LIST, None, "None (XLA picks default layouts) or a "
                             "list of [`Shape`][pjrt.shapes.Shape], one per argument, whose "
                             "layouts the program must take.")
    parameter_is_tupled_arguments = Field(2, BOOL, False, "bool; the program takes one tuple "
                                          "parameter holding all arguments.")
    # Always present: an absent build-options message would read as
    # num_replicas = num_partitions = 0 and device_ordinal = 0.
    executable_build_options = Field(3, _BUILD_OPTIONS, ExecutableBuildOptions,
                                     "[`ExecutableBuildOptions`][pjrt.compile_options.ExecutableBuildOptions].", presence="always",
                                     absent=Field.PARSE_EMPTY)
    compile_portable_executable = Field(4, BOOL, False, "bool; build an executable that can "
                                        "run on any device (requires no device assignment, "
                                        "one replica and one partition, per XLA).")
    profile_version = Field(5, INT64, 0, "int; profile version for FDO, 0 for none.")
    env_option_overrides = Field(7, _OVERRIDE_MAP, list, "list of ``(name, value)`` with value "
                                 "a str, bool, int or float; XLA applies each to the "
                                 "``DebugOptions`` field of that name. A dict is accepted and "
                                 "turned into a list.")
    __slots__ = slots(locals())

    @classmethod
    def _settable(cls) -> Tuple[str, ...]:
        return cls._FIELDS + ("num_replicas", "num_partitions", "device_assignment")

    # Forwarding properties, as jaxlib's CompileOptions has them.
    @property
    def num_replicas(self) -> int:
        """Forwards to ``executable_build_options.num_replicas``."""
        return self.executable_build_options.num_replicas

    @num_replicas.setter
    def num_replicas(self, value: int) -> None:
        self.executable_build_options.num_replicas = value

    @property
    def num_partitions(self) -> int:
        """Forwards to ``executable_build_options.num_partitions``."""
        return self.executable_build_options.num_partitions

    @num_partitions.setter
    def num_partitions(self, value: int) -> None:
        self.executable_build_options.num_partitions = value

    @property
    def device_assignment(self) -> Optional[DeviceAssignment]:
        """Forwards to ``executable_build_options.device_assignment``."""
        return self.executable_build_options.device_assignment

    @device_assignment.setter
    def device_assignment(self, value: Optional[DeviceAssignment]) -> None:
        self.executable_build_options.device_assignment = value

    def _all_overrides(self) -> List[Tuple[str, OptionOverrideValue]]:
        self._revalidate()
        debug = self.executable_build_options.debug_options.to_option_overrides()
        user_keys = {k for k, _ in self.env_option_overrides}
        for key, _ in debug:
            if key in user_keys:
                raise ValueError(
                    f"{key!r} is set both in executable_build_options.debug_options and "
                    f"in env_option_overrides; set it in one place"
                )
        return debug + list(self.env_option_overrides)

    def _key(self) -> tuple:
        # env_option_overrides is a proto map: order carries no meaning (the base class
        # compares messages by this key).
        return super()._key()[:-1] + (dict(self.env_option_overrides),)

    __hash__ = None

    def SerializeAsString(self) -> bytes:
        """Serialise as ``xla.CompileOptionsProto`` (jaxlib's method name).

        Returns:
            The bytes ``PJRT_Client_Compile`` expects in
            ``compile_options``/``compile_options_size``.

        Raises:
            TypeError: an attribute mutated in place holds a wrong type.
            ValueError: a value is out of range; ``device_assignment``
                disagrees with ``num_replicas`` x ``num_partitions``; or an
                option is set both in ``debug_options`` and in
                ``env_option_overrides``.
        """
        return self._serialize_fields(env_option_overrides=self._all_overrides())

    def serialize(self) -> bytes:
        """Alias of `SerializeAsString`."""
        return self.SerializeAsString()

    @classmethod
    def from_serialized(cls, data: bytes, *, strict: bool = True) -> "CompileOptions":
        """Parse an ``xla.CompileOptionsProto``: one this class wrote, or one jaxlib wrote.

        Overrides naming a [`DebugOptions`][pjrt.compile_options.DebugOptions] attribute, with the value
        type that attribute would send, are put back into
        ``executable_build_options.debug_options``; all others stay in
        ``env_option_overrides``. Either way they serialise to the same map
        entry. The ``DebugOptions`` message jaxlib always writes is accepted
        in both modes: its modelled fields are read into ``debug_options``
        and the rest of it is ignored (see the module docstring).

        Args:
            data: the serialised message.
            strict: if True (default), other fields this module does not
                model (e.g. ``argument_layouts``) raise ``ValueError`` rather
                than being dropped. With False they are skipped.

        Raises:
            TypeError: ``data`` is not bytes.
            ValueError: the message is malformed, carries values XLA would
                reject (e.g. ``num_replicas`` 0 or absent), or (strict)
                carries fields this module does not model.
        """
        unmodelled: List[str] = []
        values = cls._read_fields(data, unmodelled)
        if unmodelled and strict:
            raise ValueError(
                "CompileOptions.from_serialized(strict=True): the message has fields "
                f"this module does not model ({', '.join(unmodelled)}); pass strict=False "
                "to skip them"
            )
        # Proto maps keep the last value of a repeated key.
        merged: Dict[str, OptionOverrideValue] = {}
        for key, value in values.pop("env_option_overrides"):
            merged.pop(key, None)
            merged[key] = value
        self = cls()
        for name, value in values.items():
            setattr(self, name, value)
        debug = self.executable_build_options.debug_options
        kept = []
        for key, value in merged.items():
            if not debug._absorb_override(key, value):
                if debug._models(key):
                    # XLA applies the override on top of a DebugOptions
                    # message: the message's value for it no longer counts.
                    setattr(debug, key, None)
                kept.append((key, value))
        self.env_option_overrides = kept
        return self

    @classmethod
    def ParseFromString(cls, data: bytes) -> "CompileOptions":
        """jaxlib's name for `from_serialized` (with its default, strict=True)."""
        return cls.from_serialized(data)

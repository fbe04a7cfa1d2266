"""XLA compile options, serialised as ``xla.CompileOptionsProto``.

``PJRT_Client_Compile`` takes its options as a serialised
``CompileOptionsProto`` (``xla/pjrt/proto/compile_options.proto``). This
module builds that message in pure Python with the tiny wire-format writer in
:mod:`pjrt._protowire`, so the core package needs no ``protobuf`` runtime and
no generated code: the part of the schema we speak is small, and protobuf
field numbers never change once assigned, so hand-written numbers stay valid
across XLA versions (fields a newer XLA adds are simply not written, and an
older XLA skips fields it does not know).

Class and attribute names follow jaxlib's ``xla_client`` (``CompileOptions``,
``ExecutableBuildOptions``, ``DeviceAssignment``, ``SerializeAsString``), so
code written against jaxlib reads the same here.

Where the field numbers come from (openxla/xla):

* ``CompileOptionsProto``, ``ExecutableBuildOptionsProto``,
  ``OptionOverrideProto``: ``xla/pjrt/proto/compile_options.proto``.
* ``DeviceAssignmentProto``: ``xla/xla_data.proto``.
* ``DebugOptions``: ``xla/xla.proto``.

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
"""

from __future__ import annotations

import enum
import math
import numbers
import struct
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np

from . import _protowire as pw

__all__ = [
    "CompileOptions",
    "ExecutableBuildOptions",
    "DebugOptions",
    "DeviceAssignment",
    "EffortLevel",
    "OptionOverrideValue",
]

OptionOverrideValue = Union[str, bool, int, float]

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


# --------------------------------------------------------------------------
# Field numbers. Never change these: they are XLA's wire contract.
# --------------------------------------------------------------------------

class _CO:
    """``CompileOptionsProto`` (xla/pjrt/proto/compile_options.proto)."""
    ARGUMENT_LAYOUTS = 1                # repeated ShapeProto (not modelled)
    PARAMETER_IS_TUPLED_ARGUMENTS = 2   # bool
    EXECUTABLE_BUILD_OPTIONS = 3        # ExecutableBuildOptionsProto
    COMPILE_PORTABLE_EXECUTABLE = 4     # bool
    PROFILE_VERSION = 5                 # int64
    ENV_OPTION_OVERRIDES = 7            # map<string, OptionOverrideProto>


# Fields of these messages that exist but are not modelled here; named only
# so from_serialized(strict=True) can say what it refused.
_CO_UNMODELLED = {
    1: "argument_layouts",
    6: "serialized_multi_slice_config",
    8: "target_config",
    9: "allow_in_place_mlir_modification",
    10: "matrix_unit_operand_precision",
    11: "compiler_variant",
}
_EBO_UNMODELLED = {
    2: "result_layout",
    3: "debug_options",
    13: "comp_envs",
    15: "device_memory_size",
    26: "slice_size",
}


def _unknown_name(message: str, field: int, names: Dict[int, str]) -> str:
    return f"{message}.{names[field]} ({field})" if field in names else f"{message} field {field}"


class _MapEntry:
    """Protobuf map entries are messages ``{key = 1; value = 2}``."""
    KEY = 1
    VALUE = 2


class _OO:
    """``OptionOverrideProto`` (oneof value)."""
    STRING_FIELD = 1   # string
    BOOL_FIELD = 2     # bool
    INT_FIELD = 3      # int64
    DOUBLE_FIELD = 4   # double


class _EBO:
    """``ExecutableBuildOptionsProto``."""
    DEVICE_ORDINAL = 1                                  # int64
    RESULT_LAYOUT = 2                                   # ShapeProto (not modelled)
    DEBUG_OPTIONS = 3                                   # DebugOptions (never written)
    NUM_REPLICAS = 4                                    # int64
    NUM_PARTITIONS = 5                                  # int64
    USE_SPMD_PARTITIONING = 6                           # bool
    USE_AUTO_SPMD_PARTITIONING = 7                      # bool
    DEDUPLICATE_HLO = 8                                 # bool
    DEVICE_ASSIGNMENT = 9                               # DeviceAssignmentProto
    ALIAS_PASSTHROUGH_PARAMS = 10                       # bool
    RUN_BACKEND_ONLY = 11                               # bool
    ALLOW_SPMD_SHARDING_PROPAGATION_TO_OUTPUT = 12      # repeated bool
    COMP_ENVS = 13                                      # (not modelled)
    FDO_PROFILE = 14                                    # bytes
    DEVICE_MEMORY_SIZE = 15                             # int64 (not modelled)
    AUTO_SPMD_PARTITIONING_MESH_SHAPE = 16              # repeated int64
    AUTO_SPMD_PARTITIONING_MESH_IDS = 17                # repeated int64
    ALLOW_SPMD_SHARDING_PROPAGATION_TO_PARAMETERS = 18  # repeated bool
    USE_SHARDY_PARTITIONER = 19                         # bool
    EXEC_TIME_OPTIMIZATION_EFFORT = 20                  # float
    MEMORY_FITTING_EFFORT = 21                          # float
    PROCESS_INDEX = 22                                  # int64
    PROCESS_COUNT = 23                                  # int64
    OPTIMIZATION_LEVEL = 24                             # ExecutionOptions.EffortLevel
    MEMORY_FITTING_LEVEL = 25                           # ExecutionOptions.EffortLevel


class _DA:
    """``DeviceAssignmentProto`` (xla/xla_data.proto)."""
    REPLICA_COUNT = 1          # int32
    COMPUTATION_COUNT = 2      # int32
    COMPUTATION_DEVICES = 3    # repeated ComputationDevice
    # ComputationDevice:
    REPLICA_DEVICE_IDS = 1     # repeated int64


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


# --------------------------------------------------------------------------
# Validation helpers. Each returns the normalised value or raises with the
# qualified attribute name, so errors point at the line the user wrote.
# --------------------------------------------------------------------------


def _is_bool(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_))


def _is_int(value: Any) -> bool:
    # bool is an int subclass; a stray True for a count is almost surely a bug.
    return isinstance(value, numbers.Integral) and not _is_bool(value)


def _check_bool(name: str, value: Any) -> bool:
    if not _is_bool(value):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def _check_int(name: str, value: Any, lo: int = _INT64_MIN, hi: int = _INT64_MAX) -> int:
    if not _is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    value = int(value)
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")
    return value


def _check_str(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    return value


def _check_list(name: str, value: Any, item: Callable[[str, Any], Any]) -> list:
    # A bare str/bytes is a sequence too, but never what the user meant.
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, np.ndarray)):
        raise TypeError(f"{name} must be a list, got {type(value).__name__}")
    return [item(f"{name}[{i}]", v) for i, v in enumerate(value)]


def _float32(value: float) -> float:
    # The proto fields are single precision; storing the rounded value keeps
    # what the attribute says equal to what XLA receives (and round-trips).
    return struct.unpack("<f", struct.pack("<f", value))[0]


def _check_effort(name: str, value: Any) -> float:
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    value = float(value)
    # compile_options.proto documents the domain as [-1.0, +1.0].
    if math.isnan(value) or not -1.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [-1.0, 1.0], got {value}")
    return _float32(value)


def _check_effort_level(name: str, value: Any) -> EffortLevel:
    if not _is_int(value):
        raise TypeError(f"{name} must be an EffortLevel or int, got {type(value).__name__}")
    try:
        return EffortLevel(int(value))
    except ValueError:
        allowed = ", ".join(f"{e.name}={e.value}" for e in EffortLevel)
        raise ValueError(f"{name} must be one of {allowed}; got {int(value)}") from None


def _normalise_override_value(name: str, value: Any) -> OptionOverrideValue:
    # Order matters: bool before int (bool subclasses int), int before float.
    if _is_bool(value):
        return bool(value)
    if isinstance(value, str):
        return value
    if _is_int(value):
        return _check_int(name, value)
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
        key = _check_str(f"{name}[{i}] key", key)
        # The proto field is a map: a repeated key would silently keep only
        # one of the values.
        if key in seen:
            raise ValueError(f"{name} has the key {key!r} more than once")
        seen.add(key)
        out.append((key, _normalise_override_value(f"{name}[{key!r}]", val)))
    return out


class _Attr:
    """A validated attribute: the validator runs on every assignment.

    Values live in a ``__slots__`` slot named ``_<name>``; the slots also make
    a misspelt attribute (``opts.num_replica = 2``) an ``AttributeError``
    instead of a silently ignored setting.
    """

    def __init__(self, check: Callable[[str, Any], Any], default: Callable[[], Any]):
        self.check = check
        self.default = default

    def __set_name__(self, owner, name):
        self.name = name
        self.qualname = f"{owner.__name__}.{name}"
        self.slot = "_" + name

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return getattr(obj, self.slot)

    def __set__(self, obj, value):
        setattr(obj, self.slot, self.check(self.qualname, value))


class _Options:
    """Shared plumbing: keyword construction, validation, equality, repr."""

    __slots__ = ()
    _FIELDS: Tuple[str, ...] = ()

    def __init__(self, **kwargs: Any):
        cls = type(self)
        for field in cls._FIELDS:
            attr = cls.__dict__[field]
            setattr(self, attr.slot, attr.default())
        # Own fields first, so a forwarding shortcut such as
        # CompileOptions(num_replicas=2, executable_build_options=b) lands in
        # the build options that are kept, whatever the keyword order.
        for key, value in sorted(kwargs.items(), key=lambda kv: kv[0] not in cls._FIELDS):
            if key not in self._settable():
                raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {key!r}")
            setattr(self, key, value)

    @classmethod
    def _settable(cls) -> Tuple[str, ...]:
        return cls._FIELDS

    def _revalidate(self) -> None:
        # Lists are stored as plain lists, so they can be mutated in place
        # after assignment; check everything again before writing bytes.
        cls = type(self)
        for field in cls._FIELDS:
            attr = cls.__dict__[field]
            setattr(self, attr.slot, attr.check(attr.qualname, getattr(self, field)))

    def _key(self) -> tuple:
        return tuple(getattr(self, f) for f in self._FIELDS)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._key() == other._key()

    __hash__ = None  # mutable

    def __repr__(self) -> str:
        cls = type(self)
        parts = []
        for field in cls._FIELDS:
            value = getattr(self, field)
            if value != cls.__dict__[field].default():
                parts.append(f"{field}={value!r}")
        return f"{cls.__name__}({', '.join(parts)})"


def _slots(*fields: str) -> Tuple[str, ...]:
    return tuple("_" + f for f in fields)


# --------------------------------------------------------------------------
# DeviceAssignment
# --------------------------------------------------------------------------


class DeviceAssignment:
    """Which device runs each (replica, computation) of a program.

    Mirrors jaxlib's ``xla_client.DeviceAssignment``: an immutable 2-D array of
    device ids shaped ``[replica_count, computation_count]``; with SPMD
    partitioning the computations are the partitions. Build one with
    :meth:`create`.
    """

    __slots__ = ("_ids",)

    def __init__(self, *args, **kwargs):
        raise TypeError("use DeviceAssignment.create(array) to build a DeviceAssignment")

    @classmethod
    def create(cls, array: Any) -> "DeviceAssignment":
        """Build an assignment from a 2-D integer array of device ids.

        Args:
            array: array-like of ints shaped ``[replica_count,
                computation_count]``; ``array[r, c]`` is the id of the device
                that runs replica ``r`` of computation ``c``.

        Returns:
            A new :class:`DeviceAssignment` (it keeps its own copy).

        Raises:
            TypeError: the array is not of an integer dtype.
            ValueError: the array is not 2-D, is empty, or holds a negative id.
        """
        arr = np.asarray(array)
        if arr.ndim != 2:
            raise ValueError(
                "DeviceAssignment.create() needs a 2-D array shaped "
                f"[replica_count, computation_count], got shape {arr.shape}"
            )
        if arr.dtype.kind not in "iu":
            raise TypeError(
                f"DeviceAssignment.create() needs integer device ids, got dtype {arr.dtype}"
            )
        if arr.size == 0:
            raise ValueError(
                f"DeviceAssignment.create() needs at least one replica and one "
                f"computation, got shape {arr.shape}"
            )
        if arr.dtype.kind == "u" and arr.max() > _INT64_MAX:
            raise ValueError("DeviceAssignment device ids must fit in int64")
        arr = arr.astype(np.int64)
        if (arr < 0).any():
            raise ValueError(f"DeviceAssignment device ids must be >= 0, got {arr.min()}")
        return cls._from_checked(arr)

    @classmethod
    def _from_checked(cls, arr: np.ndarray) -> "DeviceAssignment":
        self = object.__new__(cls)
        arr = np.array(arr, dtype=np.int64, copy=True)
        arr.setflags(write=False)
        self._ids = arr
        return self

    def replica_count(self) -> int:
        """Number of replicas (rows)."""
        return int(self._ids.shape[0])

    def computation_count(self) -> int:
        """Number of computations, i.e. partitions (columns)."""
        return int(self._ids.shape[1])

    @property
    def device_ids(self) -> np.ndarray:
        """A writable copy of the ``[replica_count, computation_count]`` ids."""
        return self._ids.copy()

    def serialize(self) -> bytes:
        """Serialise as ``xla.DeviceAssignmentProto``.

        The proto stores the array column by column: one ``ComputationDevice``
        per computation, each listing the device of every replica.
        """
        out = [
            pw.int_field(_DA.REPLICA_COUNT, self.replica_count()),
            pw.int_field(_DA.COMPUTATION_COUNT, self.computation_count()),
        ]
        for c in range(self.computation_count()):
            column = pw.packed_varint_field(
                _DA.REPLICA_DEVICE_IDS, (int(v) for v in self._ids[:, c])
            )
            # Always emit the ComputationDevice, even if it were empty, so the
            # count of computation_devices matches computation_count.
            out.append(pw.message_field(_DA.COMPUTATION_DEVICES, column))
        return b"".join(out)

    @classmethod
    def from_serialized(cls, data: bytes) -> "DeviceAssignment":
        """Parse an ``xla.DeviceAssignmentProto``.

        Raises:
            ValueError: the message is malformed or its counts disagree with
                its device lists (XLA's ``DeviceAssignment::Deserialize``
                rejects the same messages).
        """
        replica_count = computation_count = 0
        columns: List[List[int]] = []
        for field, wt, value in pw.decode(data):
            if field == _DA.REPLICA_COUNT:
                replica_count = pw.to_int32(_expect(wt, pw.VARINT, "DeviceAssignmentProto.replica_count", value))
            elif field == _DA.COMPUTATION_COUNT:
                computation_count = pw.to_int32(_expect(wt, pw.VARINT, "DeviceAssignmentProto.computation_count", value))
            elif field == _DA.COMPUTATION_DEVICES:
                sub = _expect(wt, pw.LEN, "DeviceAssignmentProto.computation_devices", value)
                ids: List[int] = []
                for f2, wt2, v2 in pw.decode(sub):
                    if f2 == _DA.REPLICA_DEVICE_IDS:
                        ids.extend(_read_repeated_ints(wt2, v2, "ComputationDevice.replica_device_ids"))
                columns.append(ids)
        if replica_count <= 0 or computation_count <= 0:
            raise ValueError(
                f"DeviceAssignmentProto has replica_count={replica_count}, "
                f"computation_count={computation_count}; both must be > 0"
            )
        if len(columns) != computation_count or any(len(c) != replica_count for c in columns):
            raise ValueError(
                "DeviceAssignmentProto device lists do not match "
                f"replica_count={replica_count} x computation_count={computation_count}"
            )
        return cls.create(np.array(columns, dtype=np.int64).T)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DeviceAssignment):
            return NotImplemented
        return self._ids.shape == other._ids.shape and bool((self._ids == other._ids).all())

    def __hash__(self) -> int:
        return hash((self._ids.shape, self._ids.tobytes()))

    def __repr__(self) -> str:
        # Same layout as jaxlib's repr, for familiarity.
        comps = " ".join(
            f"Computation{c}{{{' '.join(str(int(v)) for v in self._ids[:, c])}}}"
            for c in range(self.computation_count())
        )
        return (
            f"DeviceAssignment{{replica_count={self.replica_count()}, "
            f"computation_count={self.computation_count()}, {comps}}}"
        )


def _check_device_assignment(name: str, value: Any) -> Optional[DeviceAssignment]:
    if value is not None and not isinstance(value, DeviceAssignment):
        raise TypeError(
            f"{name} must be a DeviceAssignment (see DeviceAssignment.create) or None, "
            f"got {type(value).__name__}"
        )
    return value


# --------------------------------------------------------------------------
# DebugOptions
# --------------------------------------------------------------------------

# name -> (field number in xla.DebugOptions, kind). Field numbers from
# xla/xla.proto. Kinds: "bool", "int32", "str", "str_list".
_DEBUG_FIELDS: Dict[str, Tuple[int, str]] = {
    "xla_backend_optimization_level": (31, "int32"),
    "xla_cpu_enable_fast_math": (99, "bool"),
    "xla_llvm_disable_expensive_passes": (73, "bool"),
    "xla_disable_hlo_passes": (30, "str_list"),
    "xla_dump_to": (109, "str"),
    "xla_dump_hlo_module_re": (110, "str"),
    "xla_dump_hlo_pass_re": (111, "str"),
    "xla_dump_hlo_as_text": (112, "bool"),
    "xla_dump_hlo_as_proto": (113, "bool"),
}


def _check_pass_name(name: str, value: Any) -> str:
    value = _check_str(name, value)
    # The override travels as one comma-separated string (XLA splits it in
    # ApplyOptionFromString), so a name cannot itself contain a comma.
    if "," in value or not value:
        raise ValueError(f"{name} must be a non-empty pass name without commas, got {value!r}")
    return value


def _debug_checker(kind: str) -> Callable[[str, Any], Any]:
    def check(name: str, value: Any) -> Any:
        if value is None:  # None: leave XLA's default alone.
            return None
        if kind == "bool":
            return _check_bool(name, value)
        if kind == "int32":
            return _check_int(name, value, _INT32_MIN, _INT32_MAX)
        if kind == "str":
            return _check_str(name, value)
        return _check_list(name, value, _check_pass_name)
    return check


class DebugOptions(_Options):
    """A small, typed subset of ``xla.DebugOptions``.

    Every attribute defaults to ``None``, meaning "keep XLA's default (its
    ``XLA_FLAGS``-derived value)". Only attributes set to something else are
    sent, as ``env_option_overrides`` entries named after the field (see the
    module docstring for why not as a ``DebugOptions`` message). Options not
    modelled here can still be passed by name through
    ``CompileOptions.env_option_overrides``.

    Attributes:
        xla_backend_optimization_level: int (int32); backend optimisation
            level, XLA's default is 3.
        xla_cpu_enable_fast_math: bool; allow unsafe floating-point
            rewrites on the CPU backend.
        xla_llvm_disable_expensive_passes: bool; skip costly LLVM passes.
        xla_disable_hlo_passes: list[str]; HLO pass names to skip.
        xla_dump_to: str; directory to dump HLO into.
        xla_dump_hlo_module_re: str; dump only modules matching this regex.
        xla_dump_hlo_pass_re: str; also dump around passes matching this.
        xla_dump_hlo_as_text: bool; dump HLO as text.
        xla_dump_hlo_as_proto: bool; dump HLO as binary protos.

    Raises (on assignment):
        TypeError: a value of the wrong type, naming the attribute.
        ValueError: an int out of int32 range, or a pass name that is empty
            or contains a comma.
    """

    _FIELDS = tuple(_DEBUG_FIELDS)
    __slots__ = _slots(*_FIELDS)

    xla_backend_optimization_level = _Attr(_debug_checker("int32"), lambda: None)
    xla_cpu_enable_fast_math = _Attr(_debug_checker("bool"), lambda: None)
    xla_llvm_disable_expensive_passes = _Attr(_debug_checker("bool"), lambda: None)
    xla_disable_hlo_passes = _Attr(_debug_checker("str_list"), lambda: None)
    xla_dump_to = _Attr(_debug_checker("str"), lambda: None)
    xla_dump_hlo_module_re = _Attr(_debug_checker("str"), lambda: None)
    xla_dump_hlo_pass_re = _Attr(_debug_checker("str"), lambda: None)
    xla_dump_hlo_as_text = _Attr(_debug_checker("bool"), lambda: None)
    xla_dump_hlo_as_proto = _Attr(_debug_checker("bool"), lambda: None)

    def to_option_overrides(self) -> List[Tuple[str, OptionOverrideValue]]:
        """The ``(name, value)`` overrides XLA should apply, for set fields.

        A list of pass names becomes one comma-separated string, the form
        XLA's ``ApplyOptionFromString`` parses for repeated fields (it clears
        the field first, so ``[]`` means "no passes disabled").

        Raises:
            TypeError, ValueError: a value mutated in place is invalid.
        """
        self._revalidate()
        out: List[Tuple[str, OptionOverrideValue]] = []
        for name in self._FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            if _DEBUG_FIELDS[name][1] == "str_list":
                value = ",".join(value)
            out.append((name, value))
        return out

    def _absorb_override(self, key: str, value: OptionOverrideValue) -> bool:
        """Take back an override this class would have written; else False."""
        if key not in _DEBUG_FIELDS:
            return False
        kind = _DEBUG_FIELDS[key][1]
        if kind == "bool" and isinstance(value, bool):
            setattr(self, key, value)
        elif kind == "int32" and _is_int(value) and _INT32_MIN <= value <= _INT32_MAX:
            setattr(self, key, value)
        elif kind == "str" and isinstance(value, str):
            setattr(self, key, value)
        elif kind == "str_list" and isinstance(value, str):
            parts = value.split(",") if value else []
            if not all(parts):
                return False
            setattr(self, key, parts)
        else:
            return False
        return True

    def serialize(self) -> bytes:
        """Serialise the set fields as a (sparse) ``xla.DebugOptions`` message.

        This is **not** what :meth:`CompileOptions.SerializeAsString` sends:
        XLA takes a ``DebugOptions`` message as the complete set of debug
        options, so every field missing here would reach the compiler as
        0/false/empty rather than as XLA's default. It exists for tools and
        tests that need the message form itself.

        Raises:
            TypeError, ValueError: a value mutated in place is invalid.
        """
        self._revalidate()
        out = []
        # Field-number order, as protobuf's own serialisers write.
        for name in sorted(self._FIELDS, key=lambda n: _DEBUG_FIELDS[n][0]):
            value = getattr(self, name)
            if value is None:
                continue
            number, kind = _DEBUG_FIELDS[name]
            # DebugOptions' scalars are declared `optional` (explicit
            # presence), so a set field is written even when it is 0/false/"".
            if kind == "bool":
                out.append(pw.bool_field(number, value))
            elif kind == "int32":
                out.append(pw.int_field(number, value))
            elif kind == "str":
                out.append(pw.string_field(number, value))
            else:
                out.extend(pw.string_field(number, v) for v in value)
        return b"".join(out)

    @classmethod
    def from_serialized(cls, data: bytes) -> "DebugOptions":
        """Read the modelled fields out of an ``xla.DebugOptions`` message.

        Fields this class does not model are skipped: a full ``DebugOptions``
        has hundreds, and most belong to a specific backend.

        Raises:
            ValueError: the message is malformed.
        """
        self = cls()
        by_number = {num: (name, kind) for name, (num, kind) in _DEBUG_FIELDS.items()}
        passes: List[str] = []
        saw_passes = False
        for field, wt, value in pw.decode(data):
            if field not in by_number:
                continue
            name, kind = by_number[field]
            qual = f"DebugOptions.{name}"
            if kind == "bool":
                setattr(self, name, bool(_expect(wt, pw.VARINT, qual, value)))
            elif kind == "int32":
                setattr(self, name, pw.to_int32(_expect(wt, pw.VARINT, qual, value)))
            elif kind == "str":
                setattr(self, name, _utf8(_expect(wt, pw.LEN, qual, value), qual))
            else:
                saw_passes = True
                passes.append(_utf8(_expect(wt, pw.LEN, qual, value), qual))
        if saw_passes:
            self.xla_disable_hlo_passes = passes
        return self


def _check_debug_options(name: str, value: Any) -> DebugOptions:
    if not isinstance(value, DebugOptions):
        raise TypeError(f"{name} must be a DebugOptions, got {type(value).__name__}")
    return value


# --------------------------------------------------------------------------
# ExecutableBuildOptions
# --------------------------------------------------------------------------


def _bool_list(name: str, value: Any) -> List[bool]:
    return _check_list(name, value, _check_bool)


def _int_list(name: str, value: Any) -> List[int]:
    return _check_list(name, value, _check_int)


def _positive(name: str, value: Any) -> int:
    value = _check_int(name, value)
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def _check_bytes(name: str, value: Any) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"{name} must be bytes, got {type(value).__name__}")
    return bytes(value)


class ExecutableBuildOptions(_Options):
    """``xla.ExecutableBuildOptionsProto``: how to build one executable.

    Defaults are XLA's C++ ``ExecutableBuildOptions`` defaults.

    Attributes:
        device_ordinal: int; device to build for, -1 (default) for "any".
        num_replicas: int >= 1 (default 1).
        num_partitions: int >= 1 (default 1).
        use_spmd_partitioning: bool; SPMD (True) or MPMD partitioning when
            ``num_partitions > 1``.
        use_auto_spmd_partitioning: bool; let XLA choose shardings.
        auto_spmd_partitioning_mesh_shape: list[int]; mesh for auto sharding.
        auto_spmd_partitioning_mesh_ids: list[int]; device ids of that mesh.
        deduplicate_hlo: bool; deduplicate HLO into calls (TPU only).
        device_assignment: :class:`DeviceAssignment` or None for a portable
            build; must be ``num_replicas x num_partitions``.
        alias_passthrough_params: bool; alias parameters passed straight
            through to outputs.
        run_backend_only: bool; skip HLO passes (input is already optimised).
        allow_spmd_sharding_propagation_to_parameters: list[bool]; default
            ``[False]``; one value applies to all parameters.
        allow_spmd_sharding_propagation_to_output: list[bool]; default
            ``[False]``; one value applies to all outputs.
        use_shardy_partitioner: bool; use Shardy instead of GSPMD.
        exec_time_optimization_effort: float in [-1, 1] (stored as float32).
        memory_fitting_effort: float in [-1, 1] (stored as float32).
        optimization_level: :class:`EffortLevel`.
        memory_fitting_level: :class:`EffortLevel`.
        fdo_profile: bytes; opaque feedback-directed-optimisation profile.
        process_index: int >= 0; this process's index in a multi-process
            job. PJRT clients usually fill this in themselves.
        process_count: int >= 1 (default 1); number of processes.
        debug_options: :class:`DebugOptions` (sent as option overrides).

    Raises (on assignment):
        TypeError: a value of the wrong type, naming the attribute.
        ValueError: a value out of range, naming the attribute.
    """

    _FIELDS = (
        "device_ordinal",
        "num_replicas",
        "num_partitions",
        "use_spmd_partitioning",
        "use_auto_spmd_partitioning",
        "auto_spmd_partitioning_mesh_shape",
        "auto_spmd_partitioning_mesh_ids",
        "deduplicate_hlo",
        "device_assignment",
        "alias_passthrough_params",
        "run_backend_only",
        "allow_spmd_sharding_propagation_to_parameters",
        "allow_spmd_sharding_propagation_to_output",
        "use_shardy_partitioner",
        "exec_time_optimization_effort",
        "memory_fitting_effort",
        "optimization_level",
        "memory_fitting_level",
        "fdo_profile",
        "process_index",
        "process_count",
        "debug_options",
    )
    __slots__ = _slots(*_FIELDS)

    device_ordinal = _Attr(lambda n, v: _check_int(n, v, -1), lambda: -1)
    num_replicas = _Attr(_positive, lambda: 1)
    num_partitions = _Attr(_positive, lambda: 1)
    use_spmd_partitioning = _Attr(_check_bool, lambda: False)
    use_auto_spmd_partitioning = _Attr(_check_bool, lambda: False)
    auto_spmd_partitioning_mesh_shape = _Attr(_int_list, list)
    auto_spmd_partitioning_mesh_ids = _Attr(_int_list, list)
    deduplicate_hlo = _Attr(_check_bool, lambda: False)
    device_assignment = _Attr(_check_device_assignment, lambda: None)
    alias_passthrough_params = _Attr(_check_bool, lambda: False)
    run_backend_only = _Attr(_check_bool, lambda: False)
    # XLA's C++ default for both lists is {false}.
    allow_spmd_sharding_propagation_to_parameters = _Attr(_bool_list, lambda: [False])
    allow_spmd_sharding_propagation_to_output = _Attr(_bool_list, lambda: [False])
    use_shardy_partitioner = _Attr(_check_bool, lambda: False)
    exec_time_optimization_effort = _Attr(_check_effort, lambda: 0.0)
    memory_fitting_effort = _Attr(_check_effort, lambda: 0.0)
    optimization_level = _Attr(_check_effort_level, lambda: EffortLevel.EFFORT_UNKNOWN)
    memory_fitting_level = _Attr(_check_effort_level, lambda: EffortLevel.EFFORT_UNKNOWN)
    fdo_profile = _Attr(_check_bytes, lambda: b"")
    process_index = _Attr(lambda n, v: _check_int(n, v, 0), lambda: 0)
    process_count = _Attr(_positive, lambda: 1)
    debug_options = _Attr(_check_debug_options, DebugOptions)

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
        docstring); :class:`CompileOptions` sends it as overrides.

        Raises:
            TypeError: an attribute mutated in place holds a wrong type.
            ValueError: a value is out of range, or ``device_assignment``
                disagrees with ``num_replicas`` x ``num_partitions``.
        """
        self._check_consistency()
        E = _EBO
        out = [
            # Always written: see the module docstring (XLA's defaults are
            # not proto3's zero for these).
            pw.int_field(E.DEVICE_ORDINAL, self.device_ordinal),
            pw.int_field(E.NUM_REPLICAS, self.num_replicas),
            pw.int_field(E.NUM_PARTITIONS, self.num_partitions),
        ]
        if self.use_spmd_partitioning:
            out.append(pw.bool_field(E.USE_SPMD_PARTITIONING, True))
        if self.use_auto_spmd_partitioning:
            out.append(pw.bool_field(E.USE_AUTO_SPMD_PARTITIONING, True))
        if self.deduplicate_hlo:
            out.append(pw.bool_field(E.DEDUPLICATE_HLO, True))
        if self.device_assignment is not None:
            out.append(pw.message_field(E.DEVICE_ASSIGNMENT, self.device_assignment.serialize()))
        if self.alias_passthrough_params:
            out.append(pw.bool_field(E.ALIAS_PASSTHROUGH_PARAMS, True))
        if self.run_backend_only:
            out.append(pw.bool_field(E.RUN_BACKEND_ONLY, True))
        out.append(pw.packed_bool_field(
            E.ALLOW_SPMD_SHARDING_PROPAGATION_TO_OUTPUT,
            self.allow_spmd_sharding_propagation_to_output))
        if self.fdo_profile:
            out.append(pw.bytes_field(E.FDO_PROFILE, self.fdo_profile))
        out.append(pw.packed_varint_field(
            E.AUTO_SPMD_PARTITIONING_MESH_SHAPE, self.auto_spmd_partitioning_mesh_shape))
        out.append(pw.packed_varint_field(
            E.AUTO_SPMD_PARTITIONING_MESH_IDS, self.auto_spmd_partitioning_mesh_ids))
        out.append(pw.packed_bool_field(
            E.ALLOW_SPMD_SHARDING_PROPAGATION_TO_PARAMETERS,
            self.allow_spmd_sharding_propagation_to_parameters))
        if self.use_shardy_partitioner:
            out.append(pw.bool_field(E.USE_SHARDY_PARTITIONER, True))
        # proto3 writes a float when its bits are non-zero (so -0.0 is sent).
        for number, value in (
            (E.EXEC_TIME_OPTIMIZATION_EFFORT, self.exec_time_optimization_effort),
            (E.MEMORY_FITTING_EFFORT, self.memory_fitting_effort),
        ):
            if struct.pack("<f", value) != b"\0\0\0\0":
                out.append(pw.float_field(number, value))
        if self.process_index:
            out.append(pw.int_field(E.PROCESS_INDEX, self.process_index))
        out.append(pw.int_field(E.PROCESS_COUNT, self.process_count))
        if self.optimization_level:
            out.append(pw.int_field(E.OPTIMIZATION_LEVEL, int(self.optimization_level)))
        if self.memory_fitting_level:
            out.append(pw.int_field(E.MEMORY_FITTING_LEVEL, int(self.memory_fitting_level)))
        return b"".join(out)

    @classmethod
    def _parse(cls, data: bytes, strict: bool, unknown: List[str]) -> "ExecutableBuildOptions":
        # Start from proto3 zero values, not from our defaults: an absent
        # field means 0 to XLA too, and from_serialized should show what XLA
        # would see (so e.g. a missing num_replicas is reported, not hidden).
        self = cls()
        E = _EBO
        name = "ExecutableBuildOptionsProto"
        scalars: Dict[str, Any] = {
            "device_ordinal": 0, "num_replicas": 0, "num_partitions": 0,
            "process_index": 0,
            # process_count (field 23) is newer than the message; writers
            # that predate it mean a single process, XLA's C++ default.
            "process_count": 1,
        }
        lists: Dict[str, list] = {
            "allow_spmd_sharding_propagation_to_parameters": [],
            "allow_spmd_sharding_propagation_to_output": [],
            "auto_spmd_partitioning_mesh_shape": [],
            "auto_spmd_partitioning_mesh_ids": [],
        }
        int_fields = {
            E.DEVICE_ORDINAL: "device_ordinal", E.NUM_REPLICAS: "num_replicas",
            E.NUM_PARTITIONS: "num_partitions", E.PROCESS_INDEX: "process_index",
            E.PROCESS_COUNT: "process_count",
        }
        bool_fields = {
            E.USE_SPMD_PARTITIONING: "use_spmd_partitioning",
            E.USE_AUTO_SPMD_PARTITIONING: "use_auto_spmd_partitioning",
            E.DEDUPLICATE_HLO: "deduplicate_hlo",
            E.ALIAS_PASSTHROUGH_PARAMS: "alias_passthrough_params",
            E.RUN_BACKEND_ONLY: "run_backend_only",
            E.USE_SHARDY_PARTITIONER: "use_shardy_partitioner",
        }
        bool_lists = {
            E.ALLOW_SPMD_SHARDING_PROPAGATION_TO_PARAMETERS: "allow_spmd_sharding_propagation_to_parameters",
            E.ALLOW_SPMD_SHARDING_PROPAGATION_TO_OUTPUT: "allow_spmd_sharding_propagation_to_output",
        }
        int_lists = {
            E.AUTO_SPMD_PARTITIONING_MESH_SHAPE: "auto_spmd_partitioning_mesh_shape",
            E.AUTO_SPMD_PARTITIONING_MESH_IDS: "auto_spmd_partitioning_mesh_ids",
        }
        float_fields = {
            E.EXEC_TIME_OPTIMIZATION_EFFORT: "exec_time_optimization_effort",
            E.MEMORY_FITTING_EFFORT: "memory_fitting_effort",
        }
        level_fields = {
            E.OPTIMIZATION_LEVEL: "optimization_level",
            E.MEMORY_FITTING_LEVEL: "memory_fitting_level",
        }
        debug_blob = None
        for field, wt, value in pw.decode(data):
            if field in int_fields:
                attr = int_fields[field]
                scalars[attr] = pw.to_int64(_expect(wt, pw.VARINT, f"{name}.{attr}", value))
            elif field in bool_fields:
                attr = bool_fields[field]
                setattr(self, attr, bool(_expect(wt, pw.VARINT, f"{name}.{attr}", value)))
            elif field in bool_lists:
                attr = bool_lists[field]
                lists[attr].extend(bool(v) for v in _read_repeated_ints(wt, value, f"{name}.{attr}", signed=False))
            elif field in int_lists:
                attr = int_lists[field]
                lists[attr].extend(_read_repeated_ints(wt, value, f"{name}.{attr}"))
            elif field in float_fields:
                attr = float_fields[field]
                setattr(self, attr, pw.to_float(_expect(wt, pw.I32, f"{name}.{attr}", value)))
            elif field in level_fields:
                attr = level_fields[field]
                setattr(self, attr, pw.to_int32(_expect(wt, pw.VARINT, f"{name}.{attr}", value)))
            elif field == E.DEVICE_ASSIGNMENT:
                self.device_assignment = DeviceAssignment.from_serialized(
                    _expect(wt, pw.LEN, f"{name}.device_assignment", value))
            elif field == E.FDO_PROFILE:
                self.fdo_profile = _expect(wt, pw.LEN, f"{name}.fdo_profile", value)
            elif field == E.DEBUG_OPTIONS and not strict:
                debug_blob = _expect(wt, pw.LEN, f"{name}.debug_options", value)
            else:
                unknown.append(_unknown_name(name, field, _EBO_UNMODELLED))
        for attr, value in scalars.items():
            setattr(self, attr, value)
        for attr, value in lists.items():
            setattr(self, attr, value)
        if debug_blob is not None:
            self.debug_options = DebugOptions.from_serialized(debug_blob)
        return self


def _check_build_options(name: str, value: Any) -> ExecutableBuildOptions:
    if not isinstance(value, ExecutableBuildOptions):
        raise TypeError(f"{name} must be an ExecutableBuildOptions, got {type(value).__name__}")
    return value


def _check_argument_layouts(name: str, value: Any) -> None:
    if value is not None:
        raise NotImplementedError(
            f"{name} is not supported yet (ShapeProto layouts are not modelled); leave it None"
        )
    return None


# --------------------------------------------------------------------------
# CompileOptions
# --------------------------------------------------------------------------


class CompileOptions(_Options):
    """``xla.CompileOptionsProto``: everything ``PJRT_Client_Compile`` takes.

    Attributes:
        argument_layouts: must stay None (argument layouts are not modelled;
            XLA then picks default layouts).
        parameter_is_tupled_arguments: bool; the program takes one tuple
            parameter holding all arguments.
        executable_build_options: :class:`ExecutableBuildOptions`.
        compile_portable_executable: bool; build an executable that can run
            on any device (requires no device assignment, one replica and
            one partition, per XLA).
        profile_version: int; profile version for FDO, 0 for none.
        env_option_overrides: list of ``(name, value)`` with value a str,
            bool, int or float; XLA applies each to the ``DebugOptions``
            field of that name. A dict is accepted and turned into a list.
        num_replicas, num_partitions, device_assignment: shortcuts for the
            same attributes of ``executable_build_options``.

    Example::

        opts = CompileOptions(num_replicas=2)
        opts.executable_build_options.debug_options.xla_dump_to = "/tmp/d"
        payload = opts.SerializeAsString()

    Raises (on assignment):
        TypeError: a value of the wrong type, naming the attribute.
        ValueError: a value out of range, or a repeated override key.
        NotImplementedError: ``argument_layouts`` set to anything but None.
    """

    _FIELDS = (
        "argument_layouts",
        "parameter_is_tupled_arguments",
        "executable_build_options",
        "compile_portable_executable",
        "profile_version",
        "env_option_overrides",
    )
    __slots__ = _slots(*_FIELDS)

    argument_layouts = _Attr(_check_argument_layouts, lambda: None)
    parameter_is_tupled_arguments = _Attr(_check_bool, lambda: False)
    executable_build_options = _Attr(_check_build_options, ExecutableBuildOptions)
    compile_portable_executable = _Attr(_check_bool, lambda: False)
    profile_version = _Attr(_check_int, lambda: 0)
    env_option_overrides = _Attr(_check_overrides, list)

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

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        # env_option_overrides is a proto map: order carries no meaning.
        mine = self._key()[:-1] + (dict(self.env_option_overrides),)
        theirs = other._key()[:-1] + (dict(other.env_option_overrides),)
        return mine == theirs

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
        overrides = self._all_overrides()
        out = []
        if self.parameter_is_tupled_arguments:
            out.append(pw.bool_field(_CO.PARAMETER_IS_TUPLED_ARGUMENTS, True))
        # Always present: an absent build-options message would read as
        # num_replicas = num_partitions = 0 and device_ordinal = 0.
        out.append(pw.message_field(
            _CO.EXECUTABLE_BUILD_OPTIONS, self.executable_build_options.serialize()))
        if self.compile_portable_executable:
            out.append(pw.bool_field(_CO.COMPILE_PORTABLE_EXECUTABLE, True))
        if self.profile_version:
            out.append(pw.int_field(_CO.PROFILE_VERSION, self.profile_version))
        for key, value in overrides:
            entry = pw.string_field(_MapEntry.KEY, key) + pw.message_field(
                _MapEntry.VALUE, _encode_override(value))
            out.append(pw.message_field(_CO.ENV_OPTION_OVERRIDES, entry))
        return b"".join(out)

    def serialize(self) -> bytes:
        """Alias of :meth:`SerializeAsString`."""
        return self.SerializeAsString()

    @classmethod
    def from_serialized(cls, data: bytes, *, strict: bool = True) -> "CompileOptions":
        """Parse an ``xla.CompileOptionsProto``, e.g. one this class wrote.

        Overrides naming a :class:`DebugOptions` attribute, with the value
        type that attribute would send, are put back into
        ``executable_build_options.debug_options``; all others stay in
        ``env_option_overrides``. Either way they serialise to the same map
        entry.

        Args:
            data: the serialised message.
            strict: if True (default), fields this module does not model
                (e.g. ``argument_layouts``, or the ``DebugOptions`` message
                jaxlib always writes) raise ``ValueError`` rather than being
                dropped. With False they are skipped, except that the
                modelled fields of a ``DebugOptions`` message are read.

        Raises:
            TypeError: ``data`` is not bytes.
            ValueError: the message is malformed, carries values XLA would
                reject (e.g. ``num_replicas`` 0 or absent), or (strict)
                carries fields this module does not model.
        """
        self = cls()
        unknown: List[str] = []
        overrides: List[Tuple[str, OptionOverrideValue]] = []
        build = None
        name = "CompileOptionsProto"
        for field, wt, value in pw.decode(data):
            if field == _CO.PARAMETER_IS_TUPLED_ARGUMENTS:
                self.parameter_is_tupled_arguments = bool(
                    _expect(wt, pw.VARINT, f"{name}.parameter_is_tupled_arguments", value))
            elif field == _CO.EXECUTABLE_BUILD_OPTIONS:
                # A repeated singular message merges; the last value per
                # field wins, which concatenating the payloads reproduces.
                blob = _expect(wt, pw.LEN, f"{name}.executable_build_options", value)
                build = blob if build is None else build + blob
            elif field == _CO.COMPILE_PORTABLE_EXECUTABLE:
                self.compile_portable_executable = bool(
                    _expect(wt, pw.VARINT, f"{name}.compile_portable_executable", value))
            elif field == _CO.PROFILE_VERSION:
                self.profile_version = pw.to_int64(
                    _expect(wt, pw.VARINT, f"{name}.profile_version", value))
            elif field == _CO.ENV_OPTION_OVERRIDES:
                overrides.append(_decode_override_entry(
                    _expect(wt, pw.LEN, f"{name}.env_option_overrides", value)))
            else:
                unknown.append(_unknown_name(name, field, _CO_UNMODELLED))
        self.executable_build_options = ExecutableBuildOptions._parse(
            build or b"", strict, unknown)
        if unknown and strict:
            raise ValueError(
                "CompileOptions.from_serialized(strict=True): the message has fields "
                f"this module does not model ({', '.join(unknown)}); pass strict=False "
                "to skip them"
            )
        # Proto maps keep the last value of a repeated key.
        merged: Dict[str, OptionOverrideValue] = {}
        for key, value in overrides:
            merged.pop(key, None)
            merged[key] = value
        debug = self.executable_build_options.debug_options
        self.env_option_overrides = [
            (k, v) for k, v in merged.items() if not debug._absorb_override(k, v)
        ]
        return self


# --------------------------------------------------------------------------
# Wire helpers
# --------------------------------------------------------------------------


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


def _decode_override_entry(entry: bytes) -> Tuple[str, OptionOverrideValue]:
    key = ""
    value: Optional[OptionOverrideValue] = None
    for field, wt, raw in pw.decode(entry):
        if field == _MapEntry.KEY:
            key = _utf8(_expect(wt, pw.LEN, "env_option_overrides key", raw), "env_option_overrides key")
        elif field == _MapEntry.VALUE:
            for f2, wt2, v2 in pw.decode(_expect(wt, pw.LEN, "env_option_overrides value", raw)):
                q = f"env_option_overrides[{key!r}]"
                # Last oneof member on the wire wins, as in protobuf.
                if f2 == _OO.STRING_FIELD:
                    value = _utf8(_expect(wt2, pw.LEN, q, v2), q)
                elif f2 == _OO.BOOL_FIELD:
                    value = bool(_expect(wt2, pw.VARINT, q, v2))
                elif f2 == _OO.INT_FIELD:
                    value = pw.to_int64(_expect(wt2, pw.VARINT, q, v2))
                elif f2 == _OO.DOUBLE_FIELD:
                    value = pw.to_double(_expect(wt2, pw.I64, q, v2))
    if value is None:
        # XLA's LoadEnvOptionOverrides rejects this too ("value not set").
        raise ValueError(f"env_option_overrides[{key!r}] has no value set")
    return key, value


def _expect(wire_type: int, expected: int, what: str, value: Any) -> Any:
    if wire_type != expected:
        raise ValueError(f"{what}: wire type {wire_type}, expected {expected}")
    return value


def _read_repeated_ints(wire_type: int, value: Any, what: str, signed: bool = True) -> List[int]:
    # Parsers must accept both packed (LEN) and unpacked (one VARINT per
    # element) encodings of a repeated scalar.
    if wire_type == pw.LEN:
        raw = pw.unpack_varints(value)
    elif wire_type == pw.VARINT:
        raw = [value]
    else:
        raise ValueError(f"{what}: wire type {wire_type}, expected a varint list")
    return [pw.to_int64(v) for v in raw] if signed else raw


def _utf8(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what}: not valid UTF-8 ({e})") from None

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

import difflib
import enum
import math
import numbers
from typing import Any, Callable, Dict, List, Optional, Tuple, Type, Union, overload

from ._wire import debug_options_fields
from ._wire import protowire as pw
from ._wire.debug_options_fields import AutotuneCacheMode
from ._wire.device_assignment import DeviceAssignment
from ._wire.proto_message import (BOOL, BYTES, FLOAT, INT32, INT32_MAX, INT32_MIN, INT64,
                             PACKED_BOOL, PACKED_INT64, REPEATED_STRING, STRING,
                             Field, Kind, Message, check_bool, check_bytes, check_int,
                             check_list, check_str, float32, is_bool, is_int, message_kind,
                             slots)
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

OptionOverrideValue = Union[str, bool, int, float]


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
# DebugOptions: every field of XLA's message, built from the generated table
# --------------------------------------------------------------------------

_DOUBLE = Kind("double", pw.I64, None, 0.0, pw.double_field,
               lambda wt, raw, what: pw.to_double(raw))
_PACKED_INT32 = Kind(
    "repeated int32", pw.VARINT, None, list, pw.packed_varint_field,
    lambda wt, raw, what: [pw.to_int32(v) for v in pw.read_varints(wt, raw, what)],
    repeated=True)
# A sub-message the table does not describe travels as its serialised bytes; occurrences
# merge by concatenation, as protobuf merges a singular sub-message.
_MESSAGE_BYTES = Kind("message", pw.LEN, None, None, pw.message_field,
                      lambda wt, raw, what: bytes(raw),
                      parse=lambda payload, unmodelled: bytes(payload))


def _decode_string_map_entry(wire_type: int, entry: bytes, what: str) -> List[Tuple[str, str]]:
    key = value = ""
    for field, wt, raw in pw.iter_fields(entry):
        if field == 1:
            key = STRING.decode(wt, raw, f"{what} key")
        elif field == 2:
            value = STRING.decode(wt, raw, f"{what}[{key!r}]")
    return [(key, value)]


_STRING_MAP = Kind(
    "map<string, string>", pw.LEN, None, dict,
    lambda number, mapping: b"".join(
        pw.message_field(number, pw.string_field(1, k) + pw.string_field(2, v))
        for k, v in mapping.items()),
    _decode_string_map_entry, repeated=True)

#: How each (type, repeated) of the table is written and read as a DebugOptions message.
_DEBUG_KINDS: Dict[Tuple[str, bool], Kind] = {
    ("bool", False): BOOL, ("int32", False): INT32, ("int64", False): INT64,
    ("enum", False): INT32, ("float", False): FLOAT, ("double", False): _DOUBLE,
    ("string", False): STRING, ("message", False): _MESSAGE_BYTES,
    ("map<string, string>", False): _STRING_MAP,
    ("bool", True): PACKED_BOOL, ("int32", True): _PACKED_INT32,
    ("int64", True): PACKED_INT64, ("enum", True): _PACKED_INT32,
    ("string", True): REPEATED_STRING,
}

_FLOAT32_MAX = 3.4028234663852886e38


def _check_real(name: str, value: Any) -> float:
    if is_bool(value) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    return float(value)


def _check_float32(name: str, value: Any) -> float:
    value = _check_real(name, value)
    if math.isfinite(value) and abs(value) > _FLOAT32_MAX:
        raise ValueError(f"{name} is a single-precision float; {value} is out of its range")
    # Stored rounded, so that the attribute says what XLA receives (and round-trips).
    return float32(value)


def _check_list_item(name: str, value: Any) -> str:
    value = check_str(name, value)
    # A list travels to XLA as one comma-separated string (XLA splits it in
    # ApplyOptionFromString), so an item can hold no comma, and an empty one would vanish.
    if "," in value or not value:
        raise ValueError(f"{name} must be a non-empty string without commas (XLA receives the "
                         f"list as one comma-separated string), got {value!r}")
    return value


def _enum_check(enum_type: Optional[Type[enum.IntEnum]]) -> Callable[[str, Any], Any]:
    what = f"a {enum_type.__name__} or an int" if enum_type else "an int (an enum value)"

    def check(name: str, value: Any) -> Any:
        if isinstance(value, enum.Enum) and not (enum_type and isinstance(value, enum_type)):
            raise TypeError(f"{name} must be {what}, got {type(value).__module__}."
                            f"{type(value).__qualname__}.{value.name}")
        if not is_int(value):
            raise TypeError(f"{name} must be {what}, got {type(value).__name__}")
        number = check_int(name, value, INT32_MIN, INT32_MAX)
        if enum_type is None:
            return number
        try:
            return enum_type(number)
        except ValueError:
            # proto3 enums are open: a value the table's XLA does not name (a newer XLA's,
            # read from its message) is kept as its number, as protobuf keeps it.
            return number
    return check


def _check_string_map(name: str, value: Any) -> Dict[str, str]:
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, (list, tuple)) and all(
            isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
        pairs = list(value)  # (key, value) pairs, as a parsed message gives them
    else:
        raise TypeError(f"{name} must be a dict of str to str, got {type(value).__name__}")
    out: Dict[str, str] = {}
    for key, item in pairs:
        out[check_str(f"{name} key", key)] = check_str(f"{name}[{key!r}]", item)
    return out


_SCALAR_CHECKS: Dict[str, Callable[[str, Any], Any]] = {
    "bool": check_bool,
    "int32": lambda n, v: check_int(n, v, INT32_MIN, INT32_MAX),
    "int64": check_int,
    "float": _check_float32,
    "double": _check_real,
    "string": check_str,
    "message": check_bytes,
}


class _DebugOption(Field):
    """One field of [`DebugOptions`][pjrt.compile_options.DebugOptions], made from a row of
    the generated table. Its value lives in the instance's dict of set fields, only while
    set: reading is one dict look-up, and an instance costs what its set fields cost, not
    the table's two hundred-odd rows."""

    def __init__(self, number: int, type_: str, repeated: bool,
                 enum_type: Optional[Type[enum.IntEnum]]):
        check: Callable[[str, Any], Any]
        if type_ == "map<string, string>":
            check = _check_string_map
        else:
            item = _enum_check(enum_type) if type_ == "enum" else _SCALAR_CHECKS[type_]
            if repeated:
                each = _check_list_item if type_ == "string" else item
                check = lambda n, v: check_list(n, v, each)  # noqa: E731
            else:
                check = item
        label = f"{'list of ' if repeated else ''}{enum_type.__name__ if enum_type else type_}"
        super().__init__(number, _DEBUG_KINDS[(type_, repeated)], None, label, check=check,
                         presence="set")
        self.type = type_
        self.repeated = repeated
        self.enum_type = enum_type

    @overload
    def __get__(self, obj: None, objtype: Any = None) -> "Field": ...

    @overload
    def __get__(self, obj: object, objtype: Any = None) -> Any: ...

    def __get__(self, obj: object, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return obj._values.get(self.name)  # pyright: ignore[reportAttributeAccessIssue]

    def __set__(self, obj, value):
        if value is None:
            obj._values.pop(self.name, None)
        else:
            obj._values[self.name] = self.check(self.qualname, value)

    def to_override(self, value: Any) -> OptionOverrideValue:
        """The ``env_option_overrides`` value XLA applies to this field.

        Raises:
            ValueError: a map or message field, which XLA's overrides cannot carry.
        """
        if self.repeated:
            return ",".join(_item_text(value_) for value_ in value)
        if self.type in ("bool", "string"):
            return value
        if self.type in ("int32", "int64", "enum"):
            return int(value)
        if self.type in ("float", "double"):
            # As text: XLA's typed path for a float override refuses 0 and negative values
            # (it range-checks against FLT_MIN, the smallest positive float), while its text
            # path reads any float.
            return repr(float(value))
        raise ValueError(
            f"{self.qualname} is a {self.type} field, which XLA's option overrides cannot "
            f"carry (XLA answers \"is not a valid message value\"); leave it unset and set "
            f"it in XLA_FLAGS where the plugin compiles")

    def from_override(self, value: OptionOverrideValue) -> Any:
        """The attribute value whose override is ``value`` exactly; ``_NOT_MINE`` if none."""
        try:
            if self.repeated:
                if not isinstance(value, str):
                    return _NOT_MINE
                parts = value.split(",") if value else []
                candidate: Any = [_item_from_text(self.type, part) for part in parts]
            elif self.type == "bool" and isinstance(value, bool):
                candidate = value
            elif self.type in ("int32", "int64", "enum") and is_int(value):
                candidate = value
            elif self.type in ("float", "double") and isinstance(value, str):
                candidate = float(value)
            elif self.type == "string" and isinstance(value, str):
                candidate = value
            else:
                return _NOT_MINE
            candidate = self.check(self.qualname, candidate)
            again = self.to_override(candidate)
        except (TypeError, ValueError):
            return _NOT_MINE
        # Taken back only if writing it again gives the same override, so that reading and
        # writing a message changes nothing.
        return candidate if type(again) is type(value) and again == value else _NOT_MINE


_NOT_MINE = object()


def _item_text(value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"  # the words XLA's text path reads
    if isinstance(value, int):
        return str(int(value))  # enums by number: XLA reads numbers and names alike
    return value


def _item_from_text(type_: str, text: str) -> Any:
    if type_ == "bool":
        if text not in ("True", "False"):
            raise ValueError(text)
        return text == "True"
    if type_ in ("int32", "int64", "enum"):
        return int(text)
    return text


class DebugOptions(Message):
    """XLA's ``DebugOptions``: every field of the message, as typed attributes.

    The fields are those of ``xla/xla.proto`` at the openxla/xla commit named in
    `pjrt._wire.debug_options_fields` (``SOURCE``), generated from that file by
    ``scripts/generate-debug-options.py``; ``dir(DebugOptions)`` lists them. Each attribute
    is ``None`` until set, meaning "keep XLA's default" (its ``XLA_FLAGS``-derived value),
    and only attributes set to something else are sent, as ``env_option_overrides``
    entries named after the field (the module docstring says why not as a
    ``DebugOptions`` message). Setting one back to ``None`` unsets it.

    Values by field type: ``bool``; ``int`` (int32 and int64 ranges); ``float`` (a
    single-precision field stores the rounded value); ``str``; an enum field takes its
    ``IntEnum`` member (``DebugOptions.AutotuneCacheMode.READ``; each enum is an attribute
    of this class, as in XLA's message) or its ``int``, and reads back the member; a
    repeated field takes a list of those (an empty list clears XLA's default list; a
    string item may not hold a comma, as XLA receives the list as one comma-separated
    string); a map field a ``dict`` of ``str``; a message field its serialised ``bytes``.
    Map and message fields cannot travel as overrides: serialising
    [`CompileOptions`][pjrt.compile_options.CompileOptions] with one set raises
    ``ValueError``. An option newer than the table goes in
    ``CompileOptions.env_option_overrides``.

    Raises (on assignment):
        TypeError: a value of the wrong type, naming the field.
        ValueError: a value out of range, or a list item that is empty or holds a comma.
        AttributeError: a name that is no field of the table.
    """

    PROTO_NAME = "DebugOptions"
    __slots__ = ("_values",)
    #: Every field by name (filled in from the table below the class).
    _BY_NAME: Dict[str, _DebugOption] = {}

    def __init__(self, **kwargs: Any):
        object.__setattr__(self, "_values", {})
        for key, value in kwargs.items():
            if key not in self._BY_NAME:
                raise TypeError(f"DebugOptions() got an unexpected keyword argument {key!r}"
                                f"{self._hint(key)}")
            setattr(self, key, value)

    # Only assignment goes through Python here, to name an unknown field clearly; reading a
    # field is the descriptor's dict look-up, and __getattr__ runs only when that lookup
    # has already failed.
    def __setattr__(self, name: str, value: Any) -> None:
        if name != "_values" and name not in self._BY_NAME:
            raise AttributeError(f"DebugOptions has no field {name!r}{self._hint(name)}")
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"DebugOptions has no field {name!r}{self._hint(name)}")

    @classmethod
    def _hint(cls, name: str) -> str:
        close = difflib.get_close_matches(name, cls._FIELDS, n=1)
        repository, path, commit = debug_options_fields.SOURCE
        where = (f"; the fields are those of {repository}'s {path} at {commit[:12]}, and an "
                 f"option newer than that goes in CompileOptions.env_option_overrides")
        return f" (did you mean {close[0]!r}?){where}" if close else where

    def _revalidate(self) -> None:
        # Lists are stored as plain lists and may be mutated in place after assignment;
        # check again before writing bytes.
        for name, value in list(self._values.items()):
            field = self._BY_NAME[name]
            self._values[name] = field.check(field.qualname, value)

    def _set_fields(self) -> List[Tuple[_DebugOption, Any]]:
        """The set fields and their values, in field-number order (as protobuf writes)."""
        return sorted(((self._BY_NAME[name], value) for name, value in self._values.items()),
                      key=lambda pair: pair[0].number)

    def _key(self) -> tuple:
        return (self._values,)

    def __repr__(self) -> str:
        parts = ", ".join(f"{field.name}={value!r}" for field, value in self._set_fields())
        return f"DebugOptions({parts})"

    def _serialize_fields(self, **replaced: Any) -> bytes:
        return b"".join(field.kind.encode(field.number, value)
                        for field, value in self._set_fields())

    def to_option_overrides(self) -> List[Tuple[str, OptionOverrideValue]]:
        """The ``(name, value)`` overrides XLA should apply, for set fields, in number order.

        Booleans, strings and integers go as themselves, enums as their number, floats as
        text; a list becomes one comma-separated string, the form XLA's
        ``ApplyOptionFromString`` parses for repeated fields (it clears the field first, so
        ``[]`` means "an empty list").

        Raises:
            TypeError, ValueError: a value mutated in place is invalid, or a map or
                message field is set.
        """
        self._revalidate()
        return [(field.name, field.to_override(value)) for field, value in self._set_fields()]

    @classmethod
    def _models(cls, key: str) -> bool:
        """Whether ``key`` names a field of this class."""
        return key in cls._BY_NAME

    def _absorb_override(self, key: str, value: OptionOverrideValue) -> bool:
        """Take back an override this class would have written; else False."""
        field = self._BY_NAME.get(key)
        if field is None:
            return False
        taken = field.from_override(value)
        if taken is _NOT_MINE:
            return False
        self._values[key] = taken
        return True

    def serialize(self) -> bytes:
        """Serialise the set fields as a (sparse) ``xla.DebugOptions`` message.

        This is **not** what [`CompileOptions.SerializeAsString`][pjrt.compile_options.CompileOptions.SerializeAsString] sends:
        XLA takes a ``DebugOptions`` message as the complete set of debug
        options, so every field missing here would reach the compiler as
        0/false/empty rather than as XLA's default. It exists for tools and
        tests that need the message form itself.

        Raises:
            TypeError, ValueError: a value mutated in place is invalid.
        """
        self._revalidate()
        return self._serialize_fields()

    @classmethod
    def from_serialized(cls, data: bytes) -> "DebugOptions":
        """Read an ``xla.DebugOptions`` message: each field of the table that it holds.

        Fields the table does not have (those of a newer XLA) are skipped; enum values
        the table's XLA does not name are kept as numbers.

        Raises:
            TypeError, ValueError: the message is malformed, or holds a value the
                attributes refuse.
        """
        self = cls()
        for name, value in cls._read_fields(data).items():
            if value is not None:
                setattr(self, name, value)
        return self


def _install_debug_fields() -> None:
    """Make each row of the generated table a field of `DebugOptions`, and each enum a class
    attribute. The class is built from the table (rather than looking names up in
    ``__getattr__`` at each access) so that a field is an ordinary descriptor: reading one
    costs one dict look-up, and ``dir()`` and tab completion see every field."""
    by_name: Dict[str, _DebugOption] = {}
    for name, number, type_, _, repeated, enum_type in debug_options_fields.FIELDS:
        field = _DebugOption(number, type_, repeated, enum_type)
        setattr(DebugOptions, name, field)
        field.__set_name__(DebugOptions, name)
        by_name[name] = field
    DebugOptions._FIELDS = tuple(by_name)
    DebugOptions._BY_NUMBER = {field.number: field for field in by_name.values()}
    DebugOptions._BY_NAME = by_name
    for name, enum_type in debug_options_fields.ENUMS.items():
        setattr(DebugOptions, name, enum_type)


_install_debug_fields()


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
        out.append((key, _normalise_override_value(f"{name}[{key!r}]", val)))
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

"""XLA's ``DebugOptions`` message (``xla/xla.proto``) with every field, built from the table
``debug_options_fields`` generated from that file; public as
`pjrt.compile_options.DebugOptions`. Fields are typed attributes, checked when set (their
type, and the valid range the table's ``RANGES`` knows for some integer fields), and travel
to the plugin as option overrides (see `pjrt.compile_options`)."""
from __future__ import annotations

import difflib
import enum
import math
import numbers
from typing import Any, Callable, Dict, List, Optional, Tuple, Type, Union, overload

from . import debug_options_fields
from . import protowire as pw
from .proto_message import (BOOL, FLOAT, INT32, INT32_MAX, INT32_MIN, INT64, PACKED_BOOL,
                            PACKED_INT64, REPEATED_STRING, STRING, Field, Kind, Message,
                            check_bool, check_bytes, check_int, check_list, check_str, float32,
                            is_bool, is_int)

#: A value of an option override (``CompileOptions.env_option_overrides``).
OptionOverrideValue = Union[str, bool, int, float]


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
                 enum_type: Optional[Type[enum.IntEnum]],
                 valid_range: Optional[Tuple[int, int, str]] = None):
        check: Callable[[str, Any], Any]
        if type_ == "map<string, string>":
            check = _check_string_map
        else:
            item = _enum_check(enum_type) if type_ == "enum" else _SCALAR_CHECKS[type_]
            if repeated:
                each = _check_list_item if type_ == "string" else item
                check = lambda n, v: check_list(n, v, each)  # noqa: E731
            elif valid_range is not None:
                check = _in_range(item, valid_range)
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

#: What a refused value's error adds about the fields without a known range.
ISOLATION_HINT = ("other DebugOptions values XLA cannot take may end the process in the "
                  "plugin's compiler: compile with isolate=True (or PJRT_ISOLATED_COMPILE=1) "
                  "to have such a crash raised as IsolatedCompileCrash")


def _in_range(check: Callable[[str, Any], Any], valid_range: Tuple[int, int, str]
              ) -> Callable[[str, Any], Any]:
    """``check``, then refuse an integer outside ``valid_range`` (a row of the table's
    ``RANGES``: a value XLA ends the compile on rather than failing it)."""
    lowest, highest, why = valid_range

    def checked(name: str, value: Any) -> Any:
        value = check(name, value)
        if not lowest <= value <= highest:
            raise ValueError(f"{name} must be from {lowest} to {highest}, not {value}: {why} "
                             f"(pjrt refuses it before the plugin; {ISOLATION_HINT})")
        return value
    return checked


def check_override(key: str, value: OptionOverrideValue) -> None:
    """Refuse an ``env_option_overrides`` entry that sets a field with a known range (see
    ``RANGES``) to an integer, or integer text, outside it.

    Raises:
        ValueError: naming the field, its range and why.
    """
    valid_range = debug_options_fields.RANGES.get(key)
    if valid_range is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        try:
            value = int(value.strip(), 10)  # XLA parses an option given as text
        except ValueError:
            return  # not a number: the plugin refuses it with an error of its own
    if isinstance(value, int):
        _in_range(lambda n, v: v, valid_range)(f"env_option_overrides[{key!r}]", value)


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

    Some integer fields have a valid range pjrt knows (``RANGES`` in
    `pjrt._wire.debug_options_fields`: ``xla_cpu_parallel_codegen_split_count`` is 1 to
    65536), outside which XLA ends the process instead of failing the compile: such a value
    is refused here, and in ``env_option_overrides``. A value XLA cannot take in another field
    may still end the process in the plugin's compiler; an isolated compile
    (``isolate=True``, ``PJRT_ISOLATED_COMPILE=1``) raises ``IsolatedCompileCrash`` instead.

    Raises (on assignment):
        TypeError: a value of the wrong type, naming the field.
        ValueError: a value out of range (its type's, or the field's valid range, naming it),
            or a list item that is empty or holds a comma.
        AttributeError: a name that is no field of the table.
    """

    @classmethod
    def install_fields(cls) -> None:
        """Make each row of the generated table a field of the class, and each enum a class
        attribute (called once, below). The class is built from the table (rather than
        looking names up in ``__getattr__`` at each access) so that a field is an ordinary
        descriptor: reading one costs one dict look-up, and ``dir()`` and tab completion see
        every field."""
        by_name: Dict[str, _DebugOption] = {}
        ranges = debug_options_fields.RANGES
        for name, number, type_, _, repeated, enum_type in debug_options_fields.FIELDS:
            field = _DebugOption(number, type_, repeated, enum_type, ranges.get(name))
            setattr(cls, name, field)
            field.__set_name__(cls, name)
            by_name[name] = field
        cls._FIELDS = tuple(by_name)
        cls._BY_NUMBER = {field.number: field for field in by_name.values()}
        cls._BY_NAME = by_name
        for name, enum_type in debug_options_fields.ENUMS.items():
            setattr(cls, name, enum_type)

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


DebugOptions.install_fields()

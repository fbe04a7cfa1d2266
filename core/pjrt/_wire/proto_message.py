"""Protobuf messages described by one table of fields, for [`pjrt.compile_options`][pjrt.compile_options].

A message class lists its fields once, as `Field` entries (name, proto number, kind,
default, docstring). That table drives everything else: the validated Python attributes,
keyword construction, equality and repr, serialisation (in field-number order, as protobuf
writes) and parsing, and the "Attributes" section of the class docstring. Adding a field is
adding one line.

Presence, per field, says when a value is written:

* ``"nonzero"``: proto3's implicit presence; the zero value (0, false, empty, a float whose
  bits are all zero) is not written.
* ``"always"``: written even when zero, for fields whose proto3 zero is not what the reader
  takes as unset (XLA's ``num_replicas`` reads 0, not 1, when absent).
* ``"set"``: explicit presence (``optional`` fields); ``None`` means unset and is not
  written, any other value is, zero included.
* ``"never"``: read when parsing, never written (the message carries it another way).

Parsing starts from what an absent field reads as (its ``absent`` value, by default the
kind's proto3 zero), not from the Python default, so a parsed message shows what the
receiver would see; every parsed value then goes through the attribute's validation.
"""
from __future__ import annotations

import numbers
import struct
from typing import (TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, TypeGuard,
                    overload)

import numpy as np

from . import protowire as pw

if TYPE_CHECKING:  # typing.Self is Python 3.11+; annotations are not evaluated at run time
    from typing import Self

__all__ = ["INT64_MIN", "INT64_MAX", "INT32_MIN", "INT32_MAX", "Kind", "Field", "Message",
           "BOOL", "INT64", "INT32", "FLOAT", "BYTES", "STRING", "PACKED_INT64", "PACKED_BOOL",
           "REPEATED_STRING", "UNMODELLED", "message_kind", "is_bool", "is_int", "check_bool",
           "check_int", "check_str", "check_list", "check_bytes", "float32", "slots"]

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


# --------------------------------------------------------------------------
# Validators. Each returns the normalised value or raises naming the
# attribute, so errors point at the line the user wrote.
# --------------------------------------------------------------------------


def is_bool(value: Any) -> bool:
    """Whether ``value`` is a Python or numpy bool."""
    return isinstance(value, (bool, np.bool_))


def is_int(value: Any) -> TypeGuard[int]:
    """Whether ``value`` is an integer and not a bool (a stray True for a count is a bug)."""
    return isinstance(value, numbers.Integral) and not is_bool(value)


def check_bool(name: str, value: Any) -> bool:
    """A bool; TypeError naming ``name`` otherwise."""
    if not is_bool(value):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def check_int(name: str, value: Any, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
    """An int in ``[lo, hi]``; TypeError or ValueError naming ``name`` otherwise."""
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    value = int(value)
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")
    return value


def check_str(name: str, value: Any) -> str:
    """A str; TypeError naming ``name`` otherwise."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    return value


def check_bytes(name: str, value: Any) -> bytes:
    """Bytes-like, returned as bytes; TypeError naming ``name`` otherwise."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"{name} must be bytes, got {type(value).__name__}")
    return bytes(value)


def check_list(name: str, value: Any, item: Callable[[str, Any], Any]) -> list:
    """A list (or tuple/array) whose items pass ``item``; returned as a new list."""
    # A bare str/bytes is a sequence too, but never what the user meant.
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, np.ndarray)):
        raise TypeError(f"{name} must be a list, got {type(value).__name__}")
    return [item(f"{name}[{i}]", v) for i, v in enumerate(value)]


def float32(value: float) -> float:
    """``value`` rounded to single precision, as a float32 proto field stores it."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


# --------------------------------------------------------------------------
# Kinds: how one field type is checked, written and read.
# --------------------------------------------------------------------------


class Kind:
    """One protobuf field type.

    Attributes:
        name: the type as the schema spells it (for messages and errors).
        wire_type: the wire type a singular value uses.
        check: the default validator, ``(qualified name, value) -> value``.
        zero: what an absent field reads as (a factory for mutable values).
        repeated: occurrences accumulate into a list instead of replacing.
    """

    def __init__(self, name: str, wire_type: Optional[int], check, zero, encode, decode,
                 repeated: bool = False, is_zero=None, parse=None):
        self.name = name
        self.wire_type = wire_type
        self.check = check
        self._zero = zero
        self._encode = encode
        self._decode = decode
        self.repeated = repeated
        self._is_zero = is_zero
        # Sub-messages only: (merged payload, list naming unmodelled fields) -> value.
        self.parse = parse

    def zero(self) -> Any:
        """A fresh zero value."""
        return self._zero() if callable(self._zero) else self._zero

    def is_zero(self, value: Any) -> bool:
        """Whether proto3 would leave ``value`` off the wire."""
        return self._is_zero(value) if self._is_zero else not value

    def encode(self, number: int, value: Any) -> bytes:
        """The wire bytes of field ``number`` holding ``value``."""
        return self._encode(number, value)

    def decode(self, wire_type: int, raw: Any, what: str) -> Any:
        """One occurrence as read; a list of items for a repeated kind."""
        if not self.repeated or self.wire_type == pw.LEN:
            pw.expect_wire_type(wire_type, self.wire_type, what)  # pyright: ignore[reportArgumentType]
        return self._decode(wire_type, raw, what)


def _float_is_zero(value: float) -> bool:
    # proto3 writes a float when its bits are non-zero (so -0.0 is sent).
    return struct.pack("<f", value) == b"\0\0\0\0"


BOOL = Kind("bool", pw.VARINT, check_bool, False, pw.bool_field,
            lambda wt, raw, what: bool(raw))
INT64 = Kind("int64", pw.VARINT, check_int, 0, pw.int_field,
             lambda wt, raw, what: pw.to_int64(raw))
INT32 = Kind("int32", pw.VARINT, lambda n, v: check_int(n, v, INT32_MIN, INT32_MAX), 0,
             pw.int_field, lambda wt, raw, what: pw.to_int32(raw))
FLOAT = Kind("float", pw.I32, None, 0.0, pw.float_field,
             lambda wt, raw, what: pw.to_float(raw), is_zero=_float_is_zero)
BYTES = Kind("bytes", pw.LEN, check_bytes, b"", pw.bytes_field,
             lambda wt, raw, what: bytes(raw))
STRING = Kind("string", pw.LEN, check_str, "", pw.string_field,
              lambda wt, raw, what: pw.to_str(raw, what))
PACKED_INT64 = Kind(
    "repeated int64", pw.VARINT, lambda n, v: check_list(n, v, check_int), list,
    pw.packed_varint_field,
    lambda wt, raw, what: [pw.to_int64(v) for v in pw.read_varints(wt, raw, what)],
    repeated=True)
PACKED_BOOL = Kind(
    "repeated bool", pw.VARINT, lambda n, v: check_list(n, v, check_bool), list,
    pw.packed_bool_field,
    lambda wt, raw, what: [bool(v) for v in pw.read_varints(wt, raw, what)],
    repeated=True)
REPEATED_STRING = Kind(
    "repeated string", pw.LEN, lambda n, v: check_list(n, v, check_str), list,
    lambda number, values: b"".join(pw.string_field(number, v) for v in values),
    lambda wt, raw, what: [pw.to_str(raw, what)], repeated=True)
#: A field that exists in the schema but is not read or written here (only named, so a
#: parser can say what it met).
UNMODELLED = Kind("unmodelled", None, None, None, None, None)


def message_kind(cls, parse: Optional[Callable[[bytes, Optional[list]], Any]] = None, *,
                 with_unmodelled: bool = False) -> Kind:
    """The kind of a sub-message field holding a ``cls``.

    ``cls`` provides ``serialize()`` and ``from_serialized(bytes)``; ``parse(payload,
    unmodelled)`` replaces the latter where the sub-message should report its unmodelled
    fields too, and `with_unmodelled=True` does so for a `Message` class (its own wire
    reader). Occurrences of a singular sub-message merge (protobuf's rule: later fields
    win, repeated ones append), which concatenating their payloads before one parse
    reproduces.
    """
    if with_unmodelled:
        parse = cls._from_wire

    def check(name: str, value: Any) -> Any:
        if not isinstance(value, cls):
            raise TypeError(f"{name} must be a {cls.__name__}, got {type(value).__name__}")
        return value
    return Kind(cls.__name__, pw.LEN, check, None,
                lambda number, value: pw.message_field(number, value.serialize()),
                lambda wt, raw, what: bytes(raw),
                parse=parse or (lambda payload, unmodelled: cls.from_serialized(payload)))


# --------------------------------------------------------------------------
# Fields and messages
# --------------------------------------------------------------------------

_NOT_GIVEN = object()


class Field:
    """One row of a message's field table, and the validated attribute it becomes.

    Args:
        number: the proto field number (XLA's wire contract; never changes).
        kind: a `Kind`.
        default: the Python default, or a zero-argument factory for mutable ones.
        doc: one line for the attribute's docstring.
        check: validator replacing the kind's (``(qualified name, value) -> value``).
        presence: ``"nonzero"`` (default), ``"always"``, ``"set"`` or ``"never"``; see
            the module docstring.
        absent: what parsing assumes when the field is not on the wire (a value, or a
            factory); by default the kind's zero (``None`` for ``"set"`` fields and
            sub-messages). For a sub-message, ``Field.PARSE_EMPTY`` parses an empty payload.

    Values live in a ``__slots__`` slot named ``_<name>``; the slots also make a misspelt
    attribute (``opts.num_replica = 2``) an ``AttributeError`` instead of a silently
    ignored setting.
    """

    PARSE_EMPTY = object()

    def __init__(self, number: int, kind: Kind, default: Any, doc: str, *,
                 check: Optional[Callable[[str, Any], Any]] = None, presence: str = "nonzero",
                 absent: Any = _NOT_GIVEN):
        if presence not in ("nonzero", "always", "set", "never"):
            raise ValueError(f"unknown presence {presence!r}")
        self.number = number
        self.kind = kind
        self._default = default
        self.doc = doc
        self.check = check or kind.check
        self.presence = presence
        self._absent = absent
        self.name = self.qualname = self.slot = ""

    def __set_name__(self, owner, name):
        self.name = name
        self.qualname = f"{owner.__name__}.{name}"
        self.slot = "_" + name

    def default(self) -> Any:
        """A fresh default value."""
        return self._default() if callable(self._default) else self._default

    def absent(self, unmodelled: Optional[list] = None) -> Any:
        """What an absent field reads as (see the class docstring)."""
        if self._absent is Field.PARSE_EMPTY:
            return self.kind.parse(b"", unmodelled)
        if self._absent is not _NOT_GIVEN:
            return self._absent() if callable(self._absent) else self._absent
        if self.presence == "set":
            return None
        return self.kind.zero()

    @overload
    def __get__(self, obj: None, objtype: Any = None) -> "Field": ...

    @overload
    def __get__(self, obj: object, objtype: Any = None) -> Any: ...

    def __get__(self, obj: object, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return getattr(obj, self.slot)

    def __set__(self, obj, value):
        setattr(obj, self.slot, self.check(self.qualname, value))

    def written(self, value: Any) -> bool:
        """Whether ``value`` goes on the wire under this field's presence rule."""
        if self.kind is UNMODELLED or value is None or self.presence == "never":
            return False
        return self.presence != "nonzero" or not self.kind.is_zero(value)


def slots(namespace: Dict[str, Any]) -> Tuple[str, ...]:
    """The ``__slots__`` for the `Field` attributes of a class body; call it as
    ``__slots__ = slots(locals())`` after the fields."""
    return tuple("_" + name for name, value in namespace.items() if isinstance(value, Field))


class Message:
    """Base of the table-driven messages: keyword construction, validation, equality, repr,
    serialisation and parsing, all from the class's `Field` attributes.

    Subclasses declare ``PROTO_NAME`` (for messages) and their fields as class attributes;
    ``_FIELDS`` (names, in declaration order) and ``_BY_NUMBER`` are filled in, and an
    "Attributes" section listing the fields is appended to the class docstring.
    """

    __slots__ = ()
    PROTO_NAME = "message"
    #: Fields of the schema that are not modelled at all, ``{number: name}``, so that a
    #: parser can name what it met.
    UNMODELLED_FIELDS: Dict[int, str] = {}
    _FIELDS: Tuple[str, ...] = ()
    _BY_NUMBER: Dict[int, Field] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        fields = {name: value for name, value in cls.__dict__.items()
                  if isinstance(value, Field)}
        if not fields:
            return
        cls._FIELDS = tuple(fields)
        cls._BY_NUMBER = {f.number: f for f in fields.values()}
        lines = [f"        {name}: {f.doc}" for name, f in fields.items()]
        cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n\n    Attributes:\n" + "\n".join(lines)

    @classmethod
    def _field(cls, name: str) -> Field:
        return cls.__dict__[name]

    def __init__(self, **kwargs: Any):
        cls = type(self)
        for name in cls._FIELDS:
            field = cls._field(name)
            setattr(self, field.slot, field.default())
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
        for name in cls._FIELDS:
            field = cls._field(name)
            setattr(self, field.slot, field.check(field.qualname, getattr(self, name)))

    def _key(self) -> tuple:
        return tuple(getattr(self, name) for name in self._FIELDS)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._key() == other._key()

    __hash__ = None  # mutable  # pyright: ignore[reportAssignmentType]

    def __repr__(self) -> str:
        cls = type(self)
        parts = []
        for name in cls._FIELDS:
            value = getattr(self, name)
            if value != cls._field(name).default():
                parts.append(f"{name}={value!r}")
        return f"{cls.__name__}({', '.join(parts)})"

    def _serialize_fields(self, **replaced: Any) -> bytes:
        """The table's fields on the wire, in field-number order (as protobuf writes);
        ``replaced`` gives values to write instead of some attributes'."""
        out = []
        for number in sorted(self._BY_NUMBER):
            field = self._BY_NUMBER[number]
            value = replaced[field.name] if field.name in replaced else getattr(self, field.name)
            if field.written(value):
                out.append(field.kind.encode(number, value))
        return b"".join(out)

    @classmethod
    def _read_fields(cls, data: bytes, unmodelled: Optional[List[str]] = None
                     ) -> Dict[str, Any]:
        """Read ``data`` into ``{attribute: value}`` for every field of the table.

        Absent fields take their ``absent`` value; repeated ones accumulate; singular
        scalars keep the last occurrence; sub-message payloads are merged, then parsed.
        Fields the table does not read are named in ``unmodelled`` when a list is given
        (sub-messages add theirs), and skipped.

        Raises:
            ValueError: malformed data, or a field with the wrong wire type.
        """
        values: Dict[str, Any] = {}
        for number, wire_type, raw in pw.iter_fields(data):
            field = cls._BY_NUMBER.get(number)
            if field is None or field.kind is UNMODELLED:
                if unmodelled is not None:
                    name = field.name if field else cls.UNMODELLED_FIELDS.get(number)
                    unmodelled.append(f"{cls.PROTO_NAME}.{name} ({number})" if name
                                      else f"{cls.PROTO_NAME} field {number}")
                continue
            value = field.kind.decode(wire_type, raw, f"{cls.PROTO_NAME}.{field.name}")
            if field.kind.repeated:
                values.setdefault(field.name, []).extend(value)
            elif field.kind.parse is not None:
                values[field.name] = values.get(field.name, b"") + value
            else:
                values[field.name] = value
        for name in cls._FIELDS:
            field = cls._field(name)
            if field.kind is UNMODELLED:
                continue
            if name not in values:
                values[name] = field.absent(unmodelled)
            elif field.kind.parse is not None:
                values[name] = field.kind.parse(values[name], unmodelled)
        return values

    @classmethod
    def _from_wire(cls, data: bytes, unmodelled: Optional[List[str]] = None) -> Self:
        """A new message holding what ``data`` says, every value validated on the way in.

        Raises:
            TypeError, ValueError: malformed data, or values the attributes refuse.
        """
        self = cls()
        for name, value in cls._read_fields(data, unmodelled).items():
            setattr(self, name, value)
        return self

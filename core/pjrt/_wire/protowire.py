"""A minimal protobuf wire-format writer and reader.

The core ``pjrt`` package deliberately does not depend on ``protobuf``: it
must stay small (numpy, ml_dtypes and cffi only), and the only messages it
needs to speak are XLA's ``CompileOptionsProto`` family, whose schema is
small and whose field numbers never change once assigned. Implementing the
handful of wire-format primitives those messages use is less code, and far
less install weight, than carrying the protobuf runtime plus generated
descriptors for ``xla.proto`` (which would also pin us to one XLA version).

Scope, on purpose:

* Writers for the wire types proto3 scalar, string/bytes, sub-message and
  packed-repeated fields use: VARINT (0), I64 (1), LEN (2) and I32 (5).
* One reader, `iter_fields`, that walks one message level as
  ``(field_number, wire_type, value)`` triples and never guesses at the
  schema, with views over it (`decode`, `group_fields`) and the
  small converters callers interpret values with (packed or unpacked
  repeated varints, signed ints, floats, UTF-8).
* No groups (wire types 3/4: proto2-only and deprecated), no zigzag
  (``sint32``/``sint64``: no field we use has that type).

Everything here is encoding-only and schema-free; the field numbers live
next to the classes that use them ([`pjrt.compile_options`][pjrt.compile_options],
`pjrt._wire.hlo_module`, the ``OpSharding`` reader of [`pjrt.hlo_sharding`][pjrt.hlo_sharding]).
"""

from __future__ import annotations

import struct
from typing import Any, Dict, Iterable, Iterator, List, Tuple

__all__ = [
    "VARINT",
    "I64",
    "LEN",
    "I32",
    "encode_varint",
    "tag",
    "varint_field",
    "bool_field",
    "int_field",
    "double_field",
    "float_field",
    "bytes_field",
    "string_field",
    "message_field",
    "packed_varint_field",
    "packed_bool_field",
    "iter_fields",
    "decode",
    "group_fields",
    "expect_wire_type",
    "read_varints",
    "repeated_varints",
    "to_str",
    "decode_varint",
    "unpack_varints",
    "to_int64",
    "to_int32",
    "to_double",
    "to_float",
]

# Wire types (https://protobuf.dev/programming-guides/encoding/).
VARINT = 0
I64 = 1
LEN = 2
# 3 and 4 are the deprecated start/end-group markers; unsupported here.
I32 = 5

_WIRE_TYPE_NAMES = {VARINT: "VARINT", I64: "I64", LEN: "LEN", I32: "I32"}

# Field numbers are 29-bit; 19000-19999 are reserved by protobuf itself but
# still legal on the wire, so only the hard range is enforced.
_MAX_FIELD_NUMBER = (1 << 29) - 1
_UINT64_LIMIT = 1 << 64
_INT64_MIN = -(1 << 63)


# --------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------


def encode_varint(value: int) -> bytes:
    """Encode an integer as a base-128 varint.

    Negative values are written as their 64-bit two's complement (ten
    bytes), which is how protobuf encodes negative ``int32``/``int64``
    (``int32`` is sign-extended to 64 bits, so both use the same bytes).

    Args:
        value: an ``int`` in ``[-2**63, 2**64)``.

    Returns:
        The varint bytes.

    Raises:
        TypeError: ``value`` is not an ``int`` (``bool`` is accepted as 0/1).
        ValueError: ``value`` does not fit in 64 bits.
    """
    if not isinstance(value, int):
        raise TypeError(f"varint value must be int, got {type(value).__name__}")
    if value < _INT64_MIN or value >= _UINT64_LIMIT:
        raise ValueError(f"varint value {value} does not fit in 64 bits")
    value &= _UINT64_LIMIT - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def tag(field_number: int, wire_type: int) -> bytes:
    """Encode a field key (``field_number << 3 | wire_type``) as a varint.

    Args:
        field_number: 1 .. 2**29 - 1.
        wire_type: one of `VARINT`, `I64`, `LEN`,
            `I32`.

    Raises:
        ValueError: the field number or wire type is out of range.
    """
    if not isinstance(field_number, int) or not 1 <= field_number <= _MAX_FIELD_NUMBER:
        raise ValueError(f"invalid protobuf field number {field_number!r}")
    if wire_type not in _WIRE_TYPE_NAMES:
        raise ValueError(f"unsupported protobuf wire type {wire_type!r}")
    return encode_varint((field_number << 3) | wire_type)


def varint_field(field_number: int, value: int) -> bytes:
    """Encode a VARINT field (``int32``/``int64``/``uint64``/enum/bool).

    Raises:
        TypeError, ValueError: as `encode_varint`.
    """
    return tag(field_number, VARINT) + encode_varint(value)


def bool_field(field_number: int, value: bool) -> bytes:
    """Encode a ``bool`` field (VARINT 0 or 1)."""
    return varint_field(field_number, 1 if value else 0)


def int_field(field_number: int, value: int) -> bytes:
    """Encode an ``int32``/``int64``/enum field; negatives take ten bytes."""
    return varint_field(field_number, int(value))


def double_field(field_number: int, value: float) -> bytes:
    """Encode a ``double`` field (I64, IEEE-754 little endian)."""
    return tag(field_number, I64) + struct.pack("<d", float(value))


def float_field(field_number: int, value: float) -> bytes:
    """Encode a ``float`` field (I32, IEEE-754 single, little endian).

    Raises:
        OverflowError: the value is finite but out of single-precision range.
    """
    return tag(field_number, I32) + struct.pack("<f", float(value))


def bytes_field(field_number: int, value: bytes) -> bytes:
    """Encode a ``bytes`` field (LEN).

    Raises:
        TypeError: ``value`` is not bytes-like.
    """
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"bytes field value must be bytes, got {type(value).__name__}")
    value = bytes(value)
    return tag(field_number, LEN) + encode_varint(len(value)) + value


def string_field(field_number: int, value: str) -> bytes:
    """Encode a ``string`` field (LEN, UTF-8).

    Raises:
        TypeError: ``value`` is not a ``str``.
    """
    if not isinstance(value, str):
        raise TypeError(f"string field value must be str, got {type(value).__name__}")
    return bytes_field(field_number, value.encode("utf-8"))


def message_field(field_number: int, encoded_message: bytes) -> bytes:
    """Encode an already-serialised sub-message as a LEN field.

    An empty ``encoded_message`` still produces the field (key + zero
    length): that is how a *present but empty* sub-message is written, which
    matters to readers that test ``has_...()``.
    """
    return bytes_field(field_number, encoded_message)


def packed_varint_field(field_number: int, values: Iterable[int]) -> bytes:
    """Encode a packed ``repeated`` varint field (proto3's default encoding).

    An empty sequence encodes to nothing (an empty repeated field is absent).
    """
    payload = b"".join(encode_varint(int(v)) for v in values)
    if not payload:
        return b""
    return bytes_field(field_number, payload)


def packed_bool_field(field_number: int, values: Iterable[bool]) -> bytes:
    """Encode a packed ``repeated bool`` field."""
    return packed_varint_field(field_number, (1 if v else 0 for v in values))


# --------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------


def decode_varint(data: bytes, pos: int = 0) -> Tuple[int, int]:
    """Read one varint from ``data`` at ``pos``.

    Returns:
        ``(value, new_pos)``; ``value`` is the raw unsigned 64-bit integer
        (use `to_int64` / `to_int32` for signed fields).

    Raises:
        ValueError: the varint is truncated or longer than ten bytes.
    """
    result = 0
    shift = 0
    n = len(data)
    while True:
        if pos >= n:
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
        if shift >= 70:
            raise ValueError("varint longer than 10 bytes")
    # Bits past 64 are dropped, as protobuf parsers do.
    return result & (_UINT64_LIMIT - 1), pos


def iter_fields(data: bytes) -> Iterator[Tuple[int, int, Any]]:
    """Walk one serialised message level, yielding its fields in wire order.

    This is the one protobuf reader of the package: every decoder (compile
    options, HLO modules, shardings) goes through it. It is schema-free: it
    does not recurse into LEN fields (a LEN value may be a string, bytes, a
    sub-message or a packed array; only the caller knows which).

    Args:
        data: the serialised message.

    Yields:
        ``(field_number, wire_type, value)``. ``value`` is an unsigned
        ``int`` for VARINT, I64 and I32 fields (the raw bits; see
        `to_int64`, `to_double`, `to_float`) and ``bytes``
        for LEN fields. Repeated fields appear once per occurrence.

    Raises:
        TypeError: ``data`` is not bytes-like.
        ValueError: the data is malformed or uses group wire types (raised
            when the iteration reaches the bad bytes).
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"a protobuf message must be bytes, got {type(data).__name__}")
    data = bytes(data)
    pos = 0
    n = len(data)
    while pos < n:
        key, pos = decode_varint(data, pos)
        field_number, wire_type = key >> 3, key & 7
        if field_number == 0 or field_number > _MAX_FIELD_NUMBER:
            raise ValueError(f"invalid field number {field_number} at offset {pos}")
        if wire_type == VARINT:
            value, pos = decode_varint(data, pos)
        elif wire_type == I64:
            if pos + 8 > n:
                raise ValueError(f"truncated fixed64 field {field_number}")
            value = int.from_bytes(data[pos:pos + 8], "little")
            pos += 8
        elif wire_type == LEN:
            length, pos = decode_varint(data, pos)
            if pos + length > n:
                raise ValueError(f"truncated length-delimited field {field_number}")
            value = data[pos:pos + length]
            pos += length
        elif wire_type == I32:
            if pos + 4 > n:
                raise ValueError(f"truncated fixed32 field {field_number}")
            value = int.from_bytes(data[pos:pos + 4], "little")
            pos += 4
        else:
            raise ValueError(
                f"unsupported wire type {wire_type} for field {field_number}"
            )
        yield field_number, wire_type, value


def decode(data: bytes) -> List[Tuple[int, int, Any]]:
    """All fields of one message level as a list (see `iter_fields`).

    Unlike the iterator, this checks the whole message before returning.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"decode() needs bytes, got {type(data).__name__}")
    return list(iter_fields(data))


def group_fields(data: bytes) -> Dict[int, list]:
    """The fields of one message level grouped by number: ``{number: [values]}``.

    For readers that look fields up by number rather than walk them; values
    are as `iter_fields` yields them, occurrences in wire order (so a
    singular field's value is the last one, as protobuf's merge rule says).

    Raises:
        TypeError, ValueError: as `decode`.
    """
    grouped: Dict[int, list] = {}
    for number, _, value in decode(data):
        grouped.setdefault(number, []).append(value)
    return grouped


def expect_wire_type(wire_type: int, expected: int, what: str) -> None:
    """Check that a field came with the wire type its schema says.

    Raises:
        ValueError: naming ``what`` and both wire types.
    """
    if wire_type != expected:
        raise ValueError(
            f"{what}: wire type {_WIRE_TYPE_NAMES.get(wire_type, wire_type)}, "
            f"expected {_WIRE_TYPE_NAMES[expected]}"
        )


def read_varints(wire_type: int, value: Any, what: str = "repeated field") -> List[int]:
    """The raw values of one occurrence of a repeated varint field.

    Parsers must accept both encodings of a repeated scalar: packed (one LEN
    field holding all values) and unpacked (one VARINT field per value).

    Raises:
        ValueError: another wire type, or a malformed packed payload.
    """
    if wire_type == LEN:
        return unpack_varints(value)
    if wire_type == VARINT:
        return [value]
    raise ValueError(f"{what}: wire type {wire_type}, expected a varint list")


def repeated_varints(occurrences: Iterable[Any]) -> List[int]:
    """Concatenate the raw values of a repeated varint field's occurrences,
    as `group_fields` lists them (``bytes`` packed, ``int`` unpacked).

    Raises:
        ValueError: a packed payload is malformed.
    """
    values: List[int] = []
    for occurrence in occurrences:
        if isinstance(occurrence, bytes):
            values.extend(unpack_varints(occurrence))
        else:
            values.append(occurrence)
    return values


def to_str(data: bytes, what: str = "string field") -> str:
    """Decode a ``string`` field's payload.

    Raises:
        ValueError: the payload is not valid UTF-8, naming ``what``.
    """
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what}: not valid UTF-8 ({e})") from None


def unpack_varints(data: bytes) -> List[int]:
    """Decode the payload of a packed repeated varint field.

    Returns:
        The raw unsigned values.

    Raises:
        ValueError: the payload is malformed.
    """
    values = []
    pos = 0
    while pos < len(data):
        v, pos = decode_varint(data, pos)
        values.append(v)
    return values


def to_int64(raw: int) -> int:
    """Reinterpret a raw unsigned varint as a signed ``int64``."""
    return raw - _UINT64_LIMIT if raw >= 1 << 63 else raw


def to_int32(raw: int) -> int:
    """Reinterpret a raw varint as a signed ``int32`` (low 32 bits)."""
    raw &= 0xFFFFFFFF
    return raw - (1 << 32) if raw >= 1 << 31 else raw


def to_double(raw: int) -> float:
    """Reinterpret the raw bits of an I64 field as a ``double``."""
    return struct.unpack("<d", raw.to_bytes(8, "little"))[0]


def to_float(raw: int) -> float:
    """Reinterpret the raw bits of an I32 field as a ``float``."""
    return struct.unpack("<f", raw.to_bytes(4, "little"))[0]

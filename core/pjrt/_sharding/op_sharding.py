"""XLA's ``OpSharding`` proto (``xla/xla_data.proto``): the wire form of an ``HloSharding``.

This module only speaks the message: it writes one from plain values, and reads one into
calls on a *factory* (the [`HloSharding`][pjrt.hlo_sharding.HloSharding] class, passed in by its
caller), so it needs nothing from the module above it. Field numbers::

    type = 1                         (enum Type)
    tile_assignment_dimensions = 3   (repeated int64)
    tile_assignment_devices = 4      (repeated int64)
    tuple_shardings = 5              (repeated OpSharding)
    replicate_on_last_tile_dim = 6   (bool)
    metadata = 7                     (repeated OpMetadata; read and dropped)
    last_tile_dims = 8               (repeated Type)
    iota_reshape_dims = 9            (repeated int64)
    iota_transpose_perm = 10         (repeated int32)
    is_shard_group = 11, shard_group_id = 12, shard_group_type = 13   (refused)
    named_sharding = 14              (refused: XLA's newer "V3" form)
"""
from __future__ import annotations

import enum
import math
from typing import Iterable, Optional, Sequence

import numpy as np

from .._wire import protowire as wire

__all__ = ["OpShardingType", "SUBGROUP_ORDER", "SUBGROUP_NAMES", "SUBGROUP_BY_NAME",
           "subgroup_types", "encode_op_sharding", "decode_op_sharding"]


class OpShardingType(enum.IntEnum):
    """``xla.OpSharding.Type``: the kind of a sharding, and the type of a subgroup."""

    REPLICATED = 0
    MAXIMAL = 1
    TUPLE = 2
    OTHER = 3
    MANUAL = 4
    UNKNOWN = 5
    UNREDUCED = 6


#: Subgroup types a tile assignment may carry, in the order XLA sorts them to.
SUBGROUP_ORDER = (OpShardingType.MANUAL, OpShardingType.UNREDUCED, OpShardingType.REPLICATED)
#: How XLA's text spells each subgroup type (``last_tile_dims={manual, replicated}``).
SUBGROUP_NAMES = {OpShardingType.MANUAL: "manual", OpShardingType.UNREDUCED: "unreduced",
                  OpShardingType.REPLICATED: "replicated"}
SUBGROUP_BY_NAME = {name: kind for kind, name in SUBGROUP_NAMES.items()}


def subgroup_types(values: Iterable) -> tuple[OpShardingType, ...]:
    """Check subgroup types (ints or `OpShardingType`) and return them as the enum.

    Raises:
      ValueError: a value is no ``OpSharding.Type``, or not REPLICATED, MANUAL or UNREDUCED.
    """
    out = []
    for value in values:
        try:
            kind = OpShardingType(int(value))
        except (TypeError, ValueError):
            raise ValueError(f"unknown subgroup type {value!r}") from None
        if kind not in SUBGROUP_NAMES:
            raise ValueError(f"a subgroup type must be REPLICATED, MANUAL or UNREDUCED, "
                             f"got {kind.name}")
        out.append(kind)
    return tuple(out)


class _Field:
    """``OpSharding`` field numbers (xla/xla_data.proto)."""
    TYPE = 1
    TILE_SHAPE = 2
    TILE_ASSIGNMENT_DIMENSIONS = 3
    TILE_ASSIGNMENT_DEVICES = 4
    TUPLE_SHARDINGS = 5
    REPLICATE_ON_LAST_TILE_DIM = 6
    METADATA = 7
    LAST_TILE_DIMS = 8
    IOTA_RESHAPE_DIMS = 9
    IOTA_TRANSPOSE_PERM = 10
    IS_SHARD_GROUP = 11
    SHARD_GROUP_ID = 12
    SHARD_GROUP_TYPE = 13
    NAMED_SHARDING = 14


def encode_op_sharding(kind: OpShardingType, *, tile_dims: Sequence[int] = (),
                       devices: Optional[Iterable[int]] = None,
                       replicate_on_last_tile_dim: bool = False,
                       last_tile_dims: Sequence[OpShardingType] = (),
                       iota: Optional[tuple] = None,
                       tuple_shardings: Sequence[bytes] = ()) -> bytes:
    """Serialise one ``OpSharding``, fields in number order as protobuf writes them.

    Args:
      kind: the sharding's type (REPLICATED, the proto3 default, is not written).
      tile_dims: ``tile_assignment_dimensions`` (tiled shardings only).
      devices: explicit ``tile_assignment_devices``, or None.
      replicate_on_last_tile_dim, last_tile_dims: the subgroup description.
      iota: ``(reshape_dims, transpose_perm)`` of an iota tile assignment, or None.
      tuple_shardings: the serialised elements of a tuple sharding.
    """
    out = []
    if kind != OpShardingType.REPLICATED:
        out.append(wire.int_field(_Field.TYPE, kind))
    out.append(wire.packed_varint_field(_Field.TILE_ASSIGNMENT_DIMENSIONS, tile_dims))
    if devices is not None:
        out.append(wire.packed_varint_field(_Field.TILE_ASSIGNMENT_DEVICES, devices))
    for element in tuple_shardings:
        out.append(wire.message_field(_Field.TUPLE_SHARDINGS, element))
    if replicate_on_last_tile_dim:
        out.append(wire.bool_field(_Field.REPLICATE_ON_LAST_TILE_DIM, True))
    out.append(wire.packed_varint_field(_Field.LAST_TILE_DIMS, last_tile_dims))
    if iota is not None:
        reshape_dims, perm = iota
        out.append(wire.packed_varint_field(_Field.IOTA_RESHAPE_DIMS, reshape_dims))
        out.append(wire.packed_varint_field(_Field.IOTA_TRANSPOSE_PERM, perm))
    return b"".join(out)


def _repeated_ints(occurrences: list, signed32: bool = False) -> list[int]:
    convert = wire.to_int32 if signed32 else wire.to_int64
    return [convert(v) for v in wire.repeated_varints(occurrences)]


def decode_op_sharding(data: bytes, factory):
    """Read a serialised ``OpSharding`` into a call on ``factory``, normalising as XLA's
    ``HloSharding::FromProto`` does (a tile assignment of one device is replicated).

    ``factory`` provides ``replicate``, ``manual``, ``unknown``, ``unreduced``,
    ``maximal``, ``tiled``, ``iota_tile`` and ``tuple_sharding`` with the signatures of
    [`HloSharding`][pjrt.hlo_sharding.HloSharding]'s constructors; what they return is returned.

    Raises:
      ValueError: the message is malformed or inconsistent, or uses shard groups or XLA's
        ``named_sharding`` form, which are not supported.
    """
    try:
        fields = wire.group_fields(data)
    except ValueError as error:
        raise ValueError(f"malformed OpSharding: {error}") from None
    for number in (_Field.IS_SHARD_GROUP, _Field.SHARD_GROUP_ID, _Field.SHARD_GROUP_TYPE):
        if any(fields.get(number, [])):
            raise ValueError("OpSharding shard groups (shard_as / shard_like) are not supported")
    if _Field.NAMED_SHARDING in fields:
        raise ValueError("OpSharding.named_sharding (XLA's V3 sharding) is not supported")

    def scalar(number: int) -> int:
        values = fields.get(number, [0])
        if isinstance(values[-1], bytes):
            raise ValueError(f"malformed OpSharding: field {number} is not a varint")
        return values[-1]

    def ints(number: int, signed32: bool = False) -> list[int]:
        try:
            return _repeated_ints(fields.get(number, []), signed32)
        except ValueError as error:
            raise ValueError(f"malformed OpSharding: field {number}: {error}") from None

    try:
        kind = OpShardingType(wire.to_int32(scalar(_Field.TYPE)))
    except ValueError:
        raise ValueError(f"unknown OpSharding type {scalar(_Field.TYPE)}") from None
    if kind == OpShardingType.TUPLE:
        elements = []
        for chunk in fields.get(_Field.TUPLE_SHARDINGS, []):
            if not isinstance(chunk, bytes):
                raise ValueError("malformed OpSharding: tuple_shardings is not a message")
            element = decode_op_sharding(chunk, factory)
            if element.is_tuple():
                raise ValueError("OpSharding tuple elements cannot be tuples")
            elements.append(element)
        return factory.tuple_sharding(elements)
    simple = {OpShardingType.REPLICATED: factory.replicate,
              OpShardingType.MANUAL: factory.manual,
              OpShardingType.UNKNOWN: factory.unknown,
              OpShardingType.UNREDUCED: factory.unreduced}
    if kind in simple:
        return simple[kind]()
    devices = ints(_Field.TILE_ASSIGNMENT_DEVICES)
    if kind == OpShardingType.MAXIMAL:
        if len(devices) != 1:
            raise ValueError(f"a maximal OpSharding needs exactly one device, got {devices}")
        return factory.maximal(devices[0])
    dims = tuple(ints(_Field.TILE_ASSIGNMENT_DIMENSIONS))
    reshape_dims = tuple(ints(_Field.IOTA_RESHAPE_DIMS))
    perm = tuple(ints(_Field.IOTA_TRANSPOSE_PERM, signed32=True))
    subgroups = subgroup_types(ints(_Field.LAST_TILE_DIMS))
    replicate_last = bool(scalar(_Field.REPLICATE_ON_LAST_TILE_DIM))
    if reshape_dims:
        if devices:
            raise ValueError("an OpSharding cannot have both tile_assignment_devices and "
                             "iota_reshape_dims")
        if len(perm) != len(reshape_dims):
            raise ValueError(f"iota_transpose_perm {list(perm)} does not match "
                             f"iota_reshape_dims {list(reshape_dims)}")
        if all(d == 1 for d in reshape_dims):
            return factory.replicate()
    elif not devices:
        raise ValueError("a tiled OpSharding needs tile_assignment_devices or iota_reshape_dims")
    elif len(devices) == 1:
        return factory.replicate()
    if not dims or any(d <= 0 for d in dims):
        raise ValueError(f"tile_assignment_dimensions must be positive, got {list(dims)}")
    if reshape_dims:
        return factory.iota_tile(dims, reshape_dims, perm, last_tile_dim_replicate=replicate_last,
                                 subgroup_types=subgroups)
    if math.prod(dims) != len(devices):
        raise ValueError(f"tile_assignment_dimensions {list(dims)} hold {math.prod(dims)} "
                         f"devices but {len(devices)} are listed")
    return factory.tiled(np.array(devices, dtype=np.int64).reshape(dims),
                         last_tile_dim_replicate=replicate_last, subgroup_types=subgroups)

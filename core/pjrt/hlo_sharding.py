"""``HloSharding``: how XLA lays one array out over devices, in pure Python.

An :class:`HloSharding` is the compiler's view of a sharding: it names devices by their
*logical* id (a position in an executable's device assignment), never by physical device.
It is one of

* **replicated**: every device holds the whole array;
* **manual**: the program is already per-device (``shard_map``); the partitioner leaves it;
* **maximal**: one device (``{maximal device=3}``) holds the whole array;
* **tiled**: a *tile assignment*, an n-d array of device ids, splits the array. Its leading
  dimensions match the array's rank (dimension ``i`` cut into ``dims[i]`` equal tiles); any
  trailing dimensions are *subgroups* of devices that hold the same tile: the last one is
  replicated (``last_tile_dim_replicate``), or each trailing one has a type
  (``last_tile_dims={manual, replicated}``);
* **tuple**: one sharding per leaf of a tuple-shaped value (``{{replicated}, {manual}}``).

A tile assignment is either an explicit list of ids (``{devices=[2,2]0,2,1,3}``, XLA's "V1"
form) or an *iota* form (``{devices=[2,2]<=[2,2]T(1,0)}``: the ids ``0..n-1`` reshaped to
``[2,2]``, transposed by ``(1,0)`` and reshaped to the tile dimensions, XLA's "V2" form).
Both print as XLA prints them, and equality compares layouts, so the two spellings above
are equal and hash alike.

Every constructor normalises the way XLA's does (``xla/hlo/ir/hlo_sharding.cc`` and
``tile_assignment.cc``): iota shapes are canonicalised, a replicated subgroup of one device
is dropped, subgroup types are merged and ordered (manual, unreduced, replicated), a lone
replicated subgroup becomes ``last_tile_dim_replicate``, and an explicit tile assignment has
its replication groups sorted. That is what makes ``str()`` match XLA's text character for
character, which the tests check against jaxlib.

Serialisation is XLA's ``OpSharding`` proto (``xla/xla_data.proto``), written with
:mod:`pjrt._protowire`. Field numbers::

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

Metadata (``metadata={op_name="..."}`` in text, field 7 in protos) is accepted and dropped:
it does not change the layout and XLA leaves it out of equality too.
"""
from __future__ import annotations

import enum
import math
import re
from typing import Iterable, Optional, Sequence

import numpy as np

from ._tokens import TokenStream
from . import _protowire as wire

__all__ = ["HloSharding", "OpShardingType"]


class OpShardingType(enum.IntEnum):
    """``xla.OpSharding.Type``: the kind of a sharding, and the type of a subgroup."""

    REPLICATED = 0
    MAXIMAL = 1
    TUPLE = 2
    OTHER = 3
    MANUAL = 4
    UNKNOWN = 5
    UNREDUCED = 6


# Subgroup types a tile assignment may carry, in the order XLA sorts them to.
_SUBGROUP_ORDER = (OpShardingType.MANUAL, OpShardingType.UNREDUCED, OpShardingType.REPLICATED)
_SUBGROUP_NAMES = {OpShardingType.MANUAL: "manual", OpShardingType.UNREDUCED: "unreduced",
                   OpShardingType.REPLICATED: "replicated"}
_SUBGROUP_BY_NAME = {name: kind for kind, name in _SUBGROUP_NAMES.items()}


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


# --------------------------------------------------------------------------
# Iota tile assignments: the arithmetic of xla/hlo/ir/tile_assignment.cc.
# --------------------------------------------------------------------------

def _canonical_iota(reshape_dims: Sequence[int], perm: Sequence[int]) -> tuple[tuple, tuple]:
    """Canonical ``(reshape_dims, transpose_perm)`` of an iota tile assignment.

    Drops dimensions of size one and merges runs of dimensions that the transpose keeps in
    major-to-minor order, until nothing changes: ``[2,2,2]T(2,0,1)`` is ``[4,2]T(1,0)`` and
    ``[2,4]T(0,1)`` is ``[8]``. XLA prints and compares the canonical form.
    """
    dims = list(reshape_dims)
    perm = list(perm)
    if len(dims) > 1:
        while True:
            if 1 in dims:
                old_to_new, kept = [], 0
                for size in dims:
                    old_to_new.append(-1 if size == 1 else kept)
                    kept += size != 1
                perm = [old_to_new[p] for p in perm if old_to_new[p] >= 0]
                dims = [size for size in dims if size != 1]
            changed = False
            base = 0
            for i in range(1, len(dims)):
                if perm[base] + (i - base) == perm[i]:
                    dims[perm[base]] *= dims[perm[i]]
                    dims[perm[i]] = 1
                    changed = True
                else:
                    base = i
            if not changed:
                break
    if not dims:
        return (1,), (0,)
    return tuple(dims), tuple(perm)


def _iota_array(dims: Sequence[int], reshape_dims: Sequence[int],
                perm: Sequence[int]) -> np.ndarray:
    ids = np.arange(math.prod(reshape_dims), dtype=np.int64).reshape(reshape_dims)
    return ids.transpose(perm).reshape(dims)


_NOOP, _RESHAPE, _TRANSPOSE = range(3)


def _transpose_kind(dims: Sequence[int], perm: Sequence[int]) -> int:
    # Whether transposing by perm moves data, only moves size-one dimensions, or does nothing.
    kind = _NOOP
    previous = -1
    for i, d in enumerate(perm):
        if dims[d] == 1:
            if d != i and dims[i] != 1:
                kind = _RESHAPE
            continue
        if d <= previous:
            return _TRANSPOSE
        previous = d
    return kind


def _prime_factors(n: int) -> list[int]:
    factors = []
    while n % 2 == 0:
        factors.append(2)
        n //= 2
    f = 3
    while f * f <= n:
        while n % f == 0:
            factors.append(f)
            n //= f
        f += 2
    if n > 1:
        factors.append(n)
    return factors


def _transpose_iota(dims: tuple, reshape_dims: tuple, iota_perm: tuple,
                    perm: Sequence[int]) -> Optional["_Tiles"]:
    """The iota form of an iota tile assignment transposed by ``perm``, or None when XLA
    finds none (the caller then falls back to an explicit list, as XLA does)."""
    kind = _transpose_kind(dims, perm)
    if kind == _NOOP:
        return _Tiles(dims, (reshape_dims, iota_perm))
    new_dims = tuple(dims[p] for p in perm)
    if kind == _RESHAPE:
        return _Tiles.iota(new_dims, reshape_dims, iota_perm)
    if len(reshape_dims) == 1:
        return _Tiles.iota(new_dims, dims, perm)

    # A pure transpose: the non-trivial tile dimensions are the transposed reshape dimensions.
    pure = True
    non_one: list[int] = []
    one_to_non_one = [-1] * len(dims)
    for i, size in enumerate(dims):
        if size == 1:
            continue
        if len(non_one) >= len(reshape_dims) or reshape_dims[iota_perm[len(non_one)]] != size:
            pure = False
        one_to_non_one[i] = len(non_one)
        non_one.append(size)
    if pure:
        new_perm = [iota_perm[one_to_non_one[p]] for p in perm if dims[p] != 1]
        return _Tiles.iota(new_dims, reshape_dims, new_perm)

    # Otherwise split every reshape dimension into prime factors and try to group the factors
    # into the tile dimensions, major to minor, looking ahead within one original dimension
    # when the next factor does not divide what is left.
    factors: list[int] = []
    first_factor = [0]
    for size in reshape_dims:
        factors.extend(_prime_factors(size))
        first_factor.append(len(factors))
    fperm: list[int] = []
    fperm_origin: list[int] = []
    origin_positions: list[list[int]] = [[] for _ in iota_perm]
    for old in iota_perm:
        for j in range(first_factor[old], first_factor[old + 1]):
            fperm.append(j)
            fperm_origin.append(old)
            origin_positions[old].append(len(fperm) - 1)

    def candidate(target: int, position: int) -> Optional[int]:
        index = fperm[position]
        if target % factors[index] == 0:
            return index
        for later in origin_positions[fperm_origin[position]]:
            if later > position:
                later_index = fperm[later]
                if target % factors[later_index] == 0:
                    factors[index], factors[later_index] = factors[later_index], factors[index]
                    return index
        return None

    groups: list[list[int]] = [[] for _ in non_one]
    position = 0
    for i, target in enumerate(non_one):
        if position >= len(factors):
            break
        index = candidate(target, position)
        while index is not None:
            target //= factors[index]
            groups[i].append(index)
            position += 1
            if position >= len(factors):
                break
            index = candidate(target, position)
        if target != 1:
            return None
    flat_perm: list[int] = []
    for p in perm:
        if one_to_non_one[p] >= 0:
            flat_perm.extend(groups[one_to_non_one[p]])
    return _Tiles.iota(new_dims, factors, flat_perm)


def _group_minor_iota_dims_sorted(reshape_dims: Sequence[int], perm: Sequence[int],
                                  group_size: int) -> Optional[tuple[list, list]]:
    """Regroup the minor reshape dimensions of an iota so that its last ``group_size``
    devices are sorted, splitting one dimension if needed; None if that is impossible.

    XLA sorts each replication group of a partially replicated sharding; for an iota this
    keeps the compact form where it can (``[2,4]T(1,0)`` grouped by 4 is ``[2,2,2]T(1,0,2)``).
    """
    grouped = 0
    split: Optional[tuple[int, int]] = None
    for i in range(len(perm) - 1, -1, -1):
        dim = perm[i]
        size = reshape_dims[dim]
        if size <= group_size:
            if group_size % size:
                return None
            group_size //= size
            grouped += 1
        else:
            if size % group_size:
                return None
            split = (dim, size // group_size)
            grouped += 1
            group_size = 1
            break
    if split is None:
        new_dims = list(reshape_dims)
        new_perm = list(perm)
        new_perm[-grouped:] = sorted(new_perm[-grouped:])
        return new_dims, new_perm
    split_dim, split_size = split
    new_dims = list(reshape_dims[:split_dim]) + [split_size, reshape_dims[split_dim] // split_size]
    new_dims += list(reshape_dims[split_dim + 1:])
    new_perm = [0] * (len(perm) + 1)
    perm_split = 0
    for i, p in enumerate(perm):
        new_perm[i] = p if p <= split_dim else p + 1
        if p == split_dim:
            perm_split = i
            break
    new_perm[perm_split + 1] = new_perm[perm_split] + 1
    for i in range(perm_split + 2, len(new_perm)):
        p = perm[i - 1]
        new_perm[i] = p if p <= split_dim else p + 1
    new_perm[-grouped:] = sorted(new_perm[-grouped:])
    return new_dims, new_perm


class _Tiles:
    """A tile assignment: dimensions plus either an iota form or an explicit id array."""

    __slots__ = ("dims", "iota_form", "_array")

    def __init__(self, dims: tuple, iota_form: Optional[tuple] = None,
                 array: Optional[np.ndarray] = None):
        self.dims = tuple(int(d) for d in dims)
        self.iota_form = iota_form          # (reshape_dims, transpose_perm), canonical
        self._array = array

    @classmethod
    def iota(cls, dims: Sequence[int], reshape_dims: Sequence[int],
             perm: Sequence[int]) -> "_Tiles":
        return cls(tuple(dims), _canonical_iota(reshape_dims, perm))

    @classmethod
    def explicit(cls, array: np.ndarray) -> "_Tiles":
        array = np.array(array, dtype=np.int64, copy=True)
        array.setflags(write=False)
        return cls(array.shape, None, array)

    @property
    def array(self) -> np.ndarray:
        if self._array is None:
            array = _iota_array(self.dims, *self.iota_form)
            array.setflags(write=False)
            self._array = array
        return self._array

    @property
    def size(self) -> int:
        return math.prod(self.dims)

    def reshape(self, dims: Sequence[int]) -> "_Tiles":
        if self.iota_form is not None:
            return _Tiles.iota(dims, *self.iota_form)
        return _Tiles.explicit(self.array.reshape(dims))

    def transpose(self, perm: Sequence[int]) -> "_Tiles":
        if _transpose_kind(self.dims, perm) == _NOOP:
            return self
        if self.iota_form is not None:
            transposed = _transpose_iota(self.dims, *self.iota_form, perm)
            if transposed is not None:
                return transposed
        return _Tiles.explicit(self.array.transpose(perm))

    def text(self) -> str:
        dims = ",".join(map(str, self.dims))
        if self.iota_form is not None:
            reshape_dims, perm = self.iota_form
            text = f"devices=[{dims}]<=[{','.join(map(str, reshape_dims))}]"
            if len(reshape_dims) > 1:
                text += f"T({','.join(map(str, perm))})"
            return text
        return f"devices=[{dims}]{','.join(str(int(d)) for d in self.array.flat)}"


# --------------------------------------------------------------------------
# HloSharding
# --------------------------------------------------------------------------

_REPLICATED, _MANUAL, _UNKNOWN, _UNREDUCED, _MAXIMAL, _TILED, _TUPLE = (
    "replicated", "manual", "unknown", "unreduced", "maximal", "tiled", "tuple")


def _int_list(name: str, values: Iterable) -> tuple[int, ...]:
    out = []
    for value in values:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must hold ints, got {value!r}")
        out.append(int(value))
    return tuple(out)


def _subgroup_types(values: Iterable) -> tuple[OpShardingType, ...]:
    out = []
    for value in values:
        try:
            kind = OpShardingType(int(value))
        except (TypeError, ValueError):
            raise ValueError(f"unknown subgroup type {value!r}") from None
        if kind not in _SUBGROUP_NAMES:
            raise ValueError(f"a subgroup type must be REPLICATED, MANUAL or UNREDUCED, "
                             f"got {kind.name}")
        out.append(kind)
    return tuple(out)


class HloSharding:
    """XLA's description of how one value is laid out over logical devices.

    Immutable and hashable; two shardings are equal when they describe the same layout,
    whatever their spelling (an iota form equals the same ids listed explicitly).
    Build one with the class methods (:meth:`replicate`, :meth:`manual`, :meth:`maximal`,
    :meth:`tiled`, :meth:`iota_tile`, :meth:`tuple_sharding`) or parse one with
    :meth:`from_string` / :meth:`from_proto`.

    Queries follow jaxlib's ``HloSharding``, with one deliberate difference in kind:
    ``tile_assignment_dimensions``, ``tile_assignment_devices`` and ``subgroup_types`` are
    properties here, not methods. Like XLA's ``IsTileMaximal``, :meth:`is_maximal` is also
    true for a replicated sharding (the whole array on each device); use
    :meth:`unique_device` for "one device, which one".
    """

    __slots__ = ("_kind", "_tiles", "_replicate_on_last_tile_dim", "_subgroup_types",
                 "_elements", "_hash")

    def __init__(self, *args, **kwargs):
        raise TypeError("build an HloSharding with HloSharding.replicate(), .manual(), "
                        ".maximal(), .tiled(), .iota_tile(), .from_string() or .from_proto()")

    @classmethod
    def _make(cls, kind: str, tiles: Optional[_Tiles] = None, replicate_last: bool = False,
              subgroups: tuple = (), elements: tuple = ()) -> "HloSharding":
        self = object.__new__(cls)
        self._kind = kind
        self._tiles = tiles
        self._replicate_on_last_tile_dim = replicate_last
        self._subgroup_types = tuple(subgroups)
        self._elements = tuple(elements)
        self._hash = None
        return self

    # ----- constructors ---------------------------------------------------

    @classmethod
    def replicate(cls) -> "HloSharding":
        """Every device holds the whole value: ``{replicated}``."""
        return cls._make(_REPLICATED)

    @classmethod
    def manual(cls) -> "HloSharding":
        """The value is already per-device and the partitioner leaves it: ``{manual}``."""
        return cls._make(_MANUAL)

    @classmethod
    def unknown(cls) -> "HloSharding":
        """A placeholder any other sharding may replace: ``{unknown}``."""
        return cls._make(_UNKNOWN)

    @classmethod
    def unreduced(cls) -> "HloSharding":
        """Each device holds a partial value still to be summed: ``{unreduced}``."""
        return cls._make(_UNREDUCED)

    @classmethod
    def maximal(cls, device_id: int) -> "HloSharding":
        """One device holds the whole value: ``{maximal device=N}``.

        Raises:
          TypeError: ``device_id`` is not an int.
          ValueError: it is negative.
        """
        (device_id,) = _int_list("device_id", [device_id])
        if device_id < 0:
            raise ValueError(f"device_id must be >= 0, got {device_id}")
        return cls._make(_MAXIMAL, _Tiles.explicit(np.array([device_id])))

    @classmethod
    def tiled(cls, tile_assignment, *, last_tile_dim_replicate: bool = False,
              subgroup_types: Sequence[OpShardingType] = ()) -> "HloSharding":
        """A tiled sharding from an explicit n-d array of device ids.

        The leading dimensions of ``tile_assignment`` cut the value's dimensions into
        tiles; with ``last_tile_dim_replicate`` its last dimension lists devices holding
        the same tile; with ``subgroup_types`` each of its last ``len(subgroup_types)``
        dimensions is a subgroup of that type. Normalised as XLA does (see the module
        docstring), so the result may be replicated or manual.

        Args:
          tile_assignment: array-like of distinct non-negative ints, at least 1-d.
          last_tile_dim_replicate: the last dimension is a replication group.
          subgroup_types: :class:`OpShardingType` REPLICATED, MANUAL or UNREDUCED per
            trailing dimension.

        Raises:
          TypeError: the ids are not integers.
          ValueError: the array is 0-d or empty, an id is negative or repeated, both
            ``last_tile_dim_replicate`` and ``subgroup_types`` are given, or there are
            more subgroup types than dimensions.
        """
        array = np.asarray(tile_assignment)
        if array.dtype.kind not in "iu":
            raise TypeError(f"tile_assignment must hold integer device ids, got {array.dtype}")
        if array.ndim == 0 or array.size == 0:
            raise ValueError(f"tile_assignment must be an array of at least one dimension "
                             f"and one device, got shape {array.shape}")
        if (array < 0).any():
            raise ValueError(f"device ids must be >= 0, got {int(array.min())}")
        if len(np.unique(array)) != array.size:
            raise ValueError(f"tile_assignment lists a device more than once: "
                             f"{array.ravel().tolist()}")
        return cls._from_tiles(_Tiles.explicit(array), last_tile_dim_replicate,
                               _subgroup_types(subgroup_types))

    @classmethod
    def iota_tile(cls, dims: Sequence[int], reshape_dims: Optional[Sequence[int]] = None,
                  transpose_perm: Optional[Sequence[int]] = None, *,
                  last_tile_dim_replicate: bool = False,
                  subgroup_types: Sequence[OpShardingType] = ()) -> "HloSharding":
        """A tiled sharding whose ids are ``0..n-1`` reshaped to ``reshape_dims``,
        transposed by ``transpose_perm`` and reshaped to ``dims`` (XLA's iota form).

        ``iota_tile((4, 2), (2, 4), (1, 0))`` is ``{devices=[4,2]<=[2,4]T(1,0)}``; without
        ``reshape_dims`` the ids run in order (``{devices=[4,2]<=[8]}``).

        Args:
          dims: the tile assignment's dimensions (as in :meth:`tiled`).
          reshape_dims: dimensions whose product is that of ``dims``; default ``[n]``.
          transpose_perm: a permutation of ``range(len(reshape_dims))``; default identity.
          last_tile_dim_replicate, subgroup_types: as in :meth:`tiled`.

        Raises:
          TypeError: a dimension is not an int.
          ValueError: a dimension is not positive, the products differ, or the
            permutation is not one.
        """
        dims = _int_list("dims", dims)
        if not dims or any(d <= 0 for d in dims):
            raise ValueError(f"dims must be positive, got {list(dims)}")
        if reshape_dims is None:
            if transpose_perm is not None:
                raise ValueError("transpose_perm needs reshape_dims")
            reshape_dims = (math.prod(dims),)
        reshape_dims = _int_list("reshape_dims", reshape_dims)
        perm = (tuple(range(len(reshape_dims))) if transpose_perm is None
                else _int_list("transpose_perm", transpose_perm))
        _check_iota(dims, reshape_dims, perm)
        return cls._from_tiles(_Tiles.iota(dims, reshape_dims, perm), last_tile_dim_replicate,
                               _subgroup_types(subgroup_types))

    @classmethod
    def tuple_sharding(cls, elements: Sequence["HloSharding"]) -> "HloSharding":
        """One sharding per leaf of a tuple-shaped value: ``{{...}, {...}}``.

        Raises:
          TypeError: an element is not a non-tuple HloSharding.
        """
        elements = tuple(elements)
        for element in elements:
            if not isinstance(element, HloSharding) or element._kind == _TUPLE:
                raise TypeError(f"tuple elements must be non-tuple HloShardings, got {element!r}")
        return cls._make(_TUPLE, elements=elements)

    @classmethod
    def _from_tiles(cls, tiles: _Tiles, replicate_last: bool, subgroups: tuple) -> "HloSharding":
        if subgroups:
            if replicate_last:
                raise ValueError("give either last_tile_dim_replicate or subgroup_types, not both")
            if len(subgroups) > len(tiles.dims):
                raise ValueError(f"{len(subgroups)} subgroup types for a tile assignment of "
                                 f"rank {len(tiles.dims)}")
            return cls._subgroup(tiles, subgroups)
        if replicate_last:
            return cls._partial_tile(tiles)
        return cls._make(_TILED, tiles)

    @classmethod
    def _partial_tile(cls, tiles: _Tiles) -> "HloSharding":
        # HloSharding::PartialTile: the last dimension replicates.
        group = tiles.dims[-1]
        if len(tiles.dims) == 1 or group == tiles.size:
            return cls.replicate()
        if group == 1:
            return cls._make(_TILED, tiles.reshape(tiles.dims[:-1]))
        if tiles.iota_form is not None:
            reshape_dims, perm = tiles.iota_form
            if reshape_dims[perm[-1]] == group:
                return cls._make(_TILED, tiles, replicate_last=True)
            regrouped = _group_minor_iota_dims_sorted(reshape_dims, perm, group)
            if regrouped is not None:
                return cls._make(_TILED, _Tiles.iota(tiles.dims, *regrouped), replicate_last=True)
        # Devices within a replication group are interchangeable; XLA lists them sorted.
        array = np.sort(tiles.array.reshape(-1, group), axis=1).reshape(tiles.dims)
        return cls._make(_TILED, _Tiles.explicit(array), replicate_last=True)

    @classmethod
    def _subgroup(cls, tiles: _Tiles, types: tuple) -> "HloSharding":
        # HloSharding::Subgroup: drop size-one subgroups, merge equal types, sort the types.
        data_rank = len(tiles.dims) - len(types)
        if all(t == types[0] for t in types) and math.prod(tiles.dims[:data_rank]) == 1:
            return {OpShardingType.MANUAL: cls.manual, OpShardingType.REPLICATED: cls.replicate,
                    OpShardingType.UNREDUCED: cls.unreduced}[types[0]]()
        perm = list(range(data_rank))
        dims_of: dict[OpShardingType, list[int]] = {}
        removed: list[int] = []
        needs_merging = False
        for i, kind in enumerate(types):
            if tiles.dims[data_rank + i] == 1:
                removed.append(data_rank + i)
                needs_merging = True
                continue
            if kind in dims_of:
                needs_merging = True
            dims_of.setdefault(kind, []).append(data_rank + i)
        needs_merging |= len(dims_of) > 1
        if needs_merging:
            merged_shape = list(tiles.dims[:data_rank])
            merged_types = []
            for kind in _SUBGROUP_ORDER:
                if kind in dims_of:
                    perm.extend(dims_of[kind])
                    merged_shape.append(math.prod(tiles.dims[d] for d in dims_of[kind]))
                    merged_types.append(kind)
            full_perm = perm + removed
            tiles = tiles.transpose(full_perm).reshape(merged_shape)
            types = tuple(merged_types)
        if types == (OpShardingType.REPLICATED,):
            return cls._partial_tile(tiles)
        if types == (OpShardingType.MANUAL,) and tiles.size == tiles.dims[-1]:
            return cls.manual()
        if types and types[-1] == OpShardingType.REPLICATED:
            # Sort the replication groups as PartialTile does, then restore the subgroup types.
            partial = cls._partial_tile(tiles)
            return cls._make(_TILED, partial._tiles, subgroups=types)
        return cls._make(_TILED, tiles, subgroups=types)

    # ----- queries --------------------------------------------------------

    def is_tuple(self) -> bool:
        """Whether this is a tuple sharding (see :meth:`tuple_elements`)."""
        return self._kind == _TUPLE

    def tuple_elements(self) -> tuple["HloSharding", ...]:
        """The per-leaf shardings of a tuple sharding; empty for any other."""
        return self._elements

    def _all(self, kind: str) -> bool:
        if self._kind == _TUPLE:
            return all(e._kind == kind for e in self._elements)
        return self._kind == kind

    def is_replicated(self) -> bool:
        """Every device holds the whole value (for a tuple: every element is replicated)."""
        return self._all(_REPLICATED)

    def is_manual(self) -> bool:
        """The value is manually partitioned (for a tuple: every element is)."""
        return self._all(_MANUAL)

    def is_unknown(self) -> bool:
        """The sharding is the ``{unknown}`` placeholder."""
        return self._all(_UNKNOWN)

    def is_unreduced(self) -> bool:
        """The sharding is ``{unreduced}``."""
        return self._all(_UNREDUCED)

    def is_maximal(self) -> bool:
        """No tiling: the whole value is on one device, or replicated (XLA's
        ``IsTileMaximal``); see :meth:`unique_device` for the single-device case."""
        if self._kind == _TUPLE:
            return all(e.is_maximal() for e in self._elements)
        return self._kind in (_MAXIMAL, _REPLICATED)

    def is_tiled(self) -> bool:
        """The value is split into tiles over a tile assignment."""
        if self._kind == _TUPLE:
            return all(e.is_tiled() for e in self._elements)
        return self._kind == _TILED

    def unique_device(self) -> Optional[int]:
        """The device id of a ``{maximal device=N}`` sharding, else None."""
        return int(self._tiles.array.flat[0]) if self._kind == _MAXIMAL else None

    def is_tile_assignment_iota(self) -> bool:
        """Whether the tile assignment is held (and printed) in the iota form."""
        return self._tiles is not None and self._tiles.iota_form is not None

    def _require_leaf(self, what: str) -> None:
        if self._kind == _TUPLE:
            raise ValueError(f"{what} is not defined for the tuple sharding {self}")

    @property
    def tile_assignment_dimensions(self) -> tuple[int, ...]:
        """Dimensions of the tile assignment (``(1,)`` for maximal, ``(0,)`` when there is no
        tile assignment, as jaxlib reports).

        Raises:
          ValueError: this is a tuple sharding.
        """
        self._require_leaf("tile_assignment_dimensions")
        return self._tiles.dims if self._tiles is not None else (0,)

    @property
    def tile_assignment_devices(self) -> tuple[int, ...]:
        """The tile assignment's device ids in row-major order (empty when there is none).

        Raises:
          ValueError: this is a tuple sharding.
        """
        self._require_leaf("tile_assignment_devices")
        if self._tiles is None:
            return ()
        return tuple(int(d) for d in self._tiles.array.flat)

    @property
    def tile_assignment(self) -> Optional[np.ndarray]:
        """The tile assignment as a read-only int64 array, or None when there is none."""
        self._require_leaf("tile_assignment")
        return None if self._tiles is None else self._tiles.array

    @property
    def iota_reshape_dims(self) -> tuple[int, ...]:
        """The canonical ``reshape_dims`` of an iota tile assignment (empty otherwise)."""
        return self._tiles.iota_form[0] if self.is_tile_assignment_iota() else ()

    @property
    def iota_transpose_perm(self) -> tuple[int, ...]:
        """The canonical ``transpose_perm`` of an iota tile assignment (empty otherwise)."""
        return self._tiles.iota_form[1] if self.is_tile_assignment_iota() else ()

    @property
    def subgroup_types(self) -> tuple[OpShardingType, ...]:
        """The type of each trailing subgroup dimension (``last_tile_dims``); a plain
        ``last_tile_dim_replicate`` is not listed here."""
        return self._subgroup_types

    def replicate_on_last_tile_dim(self) -> bool:
        """Whether the last tile assignment dimension is a replication group."""
        return self._replicate_on_last_tile_dim

    def num_devices(self) -> int:
        """Number of devices in the tile assignment (1 for maximal, 0 for replicated and
        manual, which name no devices).

        Raises:
          ValueError: this is a tuple sharding.
        """
        self._require_leaf("num_devices")
        return 0 if self._tiles is None else self._tiles.size

    def num_dimensions(self) -> int:
        """Rank of the tile assignment, subgroup dimensions included."""
        return len(self.tile_assignment_dimensions)

    def tiled_data_rank(self) -> int:
        """How many leading tile assignment dimensions cut the value (the value's rank).

        Raises:
          ValueError: the sharding is not tiled.
        """
        if self._kind != _TILED:
            raise ValueError(f"{self} is not tiled")
        return (len(self._tiles.dims) - len(self._subgroup_types)
                - int(self._replicate_on_last_tile_dim))

    # ----- text -----------------------------------------------------------

    def __str__(self) -> str:
        if self._kind == _TUPLE:
            parts = []
            for i, element in enumerate(self._elements):
                # XLA marks every fifth element of a long tuple with its index.
                prefix = "" if i == 0 else (f", /*index={i}*/" if i % 5 == 0 else ", ")
                parts.append(prefix + str(element))
            return "{" + "".join(parts) + "}"
        if self._kind in (_REPLICATED, _MANUAL, _UNKNOWN, _UNREDUCED):
            return "{" + self._kind + "}"
        if self._kind == _MAXIMAL:
            return f"{{maximal device={self.unique_device()}}}"
        text = "{" + self._tiles.text()
        if self._replicate_on_last_tile_dim:
            text += " last_tile_dim_replicate"
        if self._subgroup_types:
            text += (" last_tile_dims={"
                     + ", ".join(_SUBGROUP_NAMES[t] for t in self._subgroup_types) + "}")
        return text + "}"

    def __repr__(self) -> str:
        return f"HloSharding({self})"

    def to_string(self) -> str:
        """The text form, as XLA prints it (same as ``str()``)."""
        return str(self)

    @classmethod
    def from_string(cls, text: str) -> "HloSharding":
        """Parse XLA's text form (what ``str()`` prints and ``mhlo.sharding`` holds).

        Accepts every form XLA prints: ``{replicated}``, ``{manual}``, ``{unknown}``,
        ``{unreduced}``, ``{maximal device=N}``, ``{devices=[...]ids}``,
        ``{devices=[...]<=[...]T(...)}`` with ``last_tile_dim_replicate`` or
        ``last_tile_dims={...}``, ``metadata={...}`` (dropped), and tuples ``{{...}, {...}}``
        (with XLA's ``/*index=N*/`` comments), which give a tuple sharding
        (:meth:`is_tuple`, :meth:`tuple_elements`).

        Raises:
          TypeError: ``text`` is not a str.
          ValueError: the text is not a valid sharding; the message shows where.
        """
        if not isinstance(text, str):
            raise TypeError(f"from_string() needs a str, got {type(text).__name__}")
        return _Parser(text).parse()

    # ----- proto ----------------------------------------------------------

    def to_proto(self) -> bytes:
        """Serialise as an ``xla.OpSharding`` proto (fields in number order, as protobuf
        writes them; an iota tile assignment is written in the iota form)."""
        out = []
        if self._kind == _TUPLE:
            out.append(wire.int_field(_Field.TYPE, OpShardingType.TUPLE))
            for element in self._elements:
                out.append(wire.message_field(_Field.TUPLE_SHARDINGS, element.to_proto()))
            return b"".join(out)
        kind = {_REPLICATED: OpShardingType.REPLICATED, _MANUAL: OpShardingType.MANUAL,
                _UNKNOWN: OpShardingType.UNKNOWN, _UNREDUCED: OpShardingType.UNREDUCED,
                _MAXIMAL: OpShardingType.MAXIMAL, _TILED: OpShardingType.OTHER}[self._kind]
        if kind != OpShardingType.REPLICATED:
            out.append(wire.int_field(_Field.TYPE, kind))
        if self._kind == _TILED:
            out.append(wire.packed_varint_field(_Field.TILE_ASSIGNMENT_DIMENSIONS,
                                                self._tiles.dims))
        tiles = self._tiles
        if tiles is not None and tiles.iota_form is None:
            out.append(wire.packed_varint_field(_Field.TILE_ASSIGNMENT_DEVICES,
                                                (int(d) for d in tiles.array.flat)))
        if self._replicate_on_last_tile_dim:
            out.append(wire.bool_field(_Field.REPLICATE_ON_LAST_TILE_DIM, True))
        out.append(wire.packed_varint_field(_Field.LAST_TILE_DIMS, self._subgroup_types))
        if tiles is not None and tiles.iota_form is not None:
            reshape_dims, perm = tiles.iota_form
            out.append(wire.packed_varint_field(_Field.IOTA_RESHAPE_DIMS, reshape_dims))
            out.append(wire.packed_varint_field(_Field.IOTA_TRANSPOSE_PERM, perm))
        return b"".join(out)

    @classmethod
    def from_proto(cls, data: bytes) -> "HloSharding":
        """Parse a serialised ``xla.OpSharding``, normalising as XLA's ``FromProto`` does
        (a tile assignment of one device is replicated).

        Raises:
          TypeError: ``data`` is not bytes.
          ValueError: the message is malformed or inconsistent, or uses shard groups or
            XLA's ``named_sharding`` form, which are not supported.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"from_proto() needs the serialised bytes, got {type(data).__name__}")
        return _from_proto(bytes(data))

    # ----- identity -------------------------------------------------------

    def _key(self) -> tuple:
        if self._kind == _TUPLE:
            return (_TUPLE, self._elements)
        if self._tiles is None:
            return (self._kind,)
        return (self._kind, self._tiles.dims, self._tiles.array.tobytes(),
                self._replicate_on_last_tile_dim, self._subgroup_types)

    def __eq__(self, other) -> bool:
        if not isinstance(other, HloSharding):
            return NotImplemented
        return self is other or self._key() == other._key()

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(self._key())
        return self._hash

    def __reduce__(self):
        return (HloSharding.from_proto, (self.to_proto(),))


def _check_iota(dims: tuple, reshape_dims: tuple, perm: tuple) -> None:
    if not reshape_dims or any(d <= 0 for d in reshape_dims):
        raise ValueError(f"iota reshape_dims must be positive, got {list(reshape_dims)}")
    if math.prod(dims) != math.prod(reshape_dims):
        raise ValueError(f"tile dimensions {list(dims)} hold {math.prod(dims)} devices but "
                         f"reshape_dims {list(reshape_dims)} hold {math.prod(reshape_dims)}")
    if sorted(perm) != list(range(len(reshape_dims))):
        raise ValueError(f"transpose_perm {list(perm)} is not a permutation of "
                         f"range({len(reshape_dims)})")


# --------------------------------------------------------------------------
# OpSharding proto reading
# --------------------------------------------------------------------------

def _repeated_ints(chunks: list, signed32: bool = False) -> list[int]:
    values: list[int] = []
    for chunk in chunks:
        raw = wire.unpack_varints(chunk) if isinstance(chunk, bytes) else [chunk]
        values.extend(wire.to_int32(v) if signed32 else wire.to_int64(v) for v in raw)
    return values


def _from_proto(data: bytes) -> HloSharding:
    fields: dict[int, list] = {}
    try:
        for number, _, value in wire.decode(data):
            fields.setdefault(number, []).append(value)
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

    try:
        kind = OpShardingType(wire.to_int32(scalar(_Field.TYPE)))
    except ValueError:
        raise ValueError(f"unknown OpSharding type {scalar(_Field.TYPE)}") from None
    if kind == OpShardingType.TUPLE:
        elements = []
        for chunk in fields.get(_Field.TUPLE_SHARDINGS, []):
            if not isinstance(chunk, bytes):
                raise ValueError("malformed OpSharding: tuple_shardings is not a message")
            element = _from_proto(chunk)
            if element.is_tuple():
                raise ValueError("OpSharding tuple elements cannot be tuples")
            elements.append(element)
        return HloSharding.tuple_sharding(elements)
    simple = {OpShardingType.REPLICATED: HloSharding.replicate,
              OpShardingType.MANUAL: HloSharding.manual,
              OpShardingType.UNKNOWN: HloSharding.unknown,
              OpShardingType.UNREDUCED: HloSharding.unreduced}
    if kind in simple:
        return simple[kind]()
    devices = _repeated_ints(fields.get(_Field.TILE_ASSIGNMENT_DEVICES, []))
    if kind == OpShardingType.MAXIMAL:
        if len(devices) != 1:
            raise ValueError(f"a maximal OpSharding needs exactly one device, got {devices}")
        return HloSharding.maximal(devices[0])
    dims = tuple(_repeated_ints(fields.get(_Field.TILE_ASSIGNMENT_DIMENSIONS, [])))
    reshape_dims = tuple(_repeated_ints(fields.get(_Field.IOTA_RESHAPE_DIMS, [])))
    perm = tuple(_repeated_ints(fields.get(_Field.IOTA_TRANSPOSE_PERM, []), signed32=True))
    subgroups = _subgroup_types(_repeated_ints(fields.get(_Field.LAST_TILE_DIMS, [])))
    replicate_last = bool(scalar(_Field.REPLICATE_ON_LAST_TILE_DIM))
    if reshape_dims:
        if devices:
            raise ValueError("an OpSharding cannot have both tile_assignment_devices and "
                             "iota_reshape_dims")
        if len(perm) != len(reshape_dims):
            raise ValueError(f"iota_transpose_perm {list(perm)} does not match "
                             f"iota_reshape_dims {list(reshape_dims)}")
        if all(d == 1 for d in reshape_dims):
            return HloSharding.replicate()
    elif not devices:
        raise ValueError("a tiled OpSharding needs tile_assignment_devices or iota_reshape_dims")
    elif len(devices) == 1:
        return HloSharding.replicate()
    if not dims or any(d <= 0 for d in dims):
        raise ValueError(f"tile_assignment_dimensions must be positive, got {list(dims)}")
    if reshape_dims:
        _check_iota(dims, reshape_dims, perm)
        tiles = _Tiles.iota(dims, reshape_dims, perm)
    else:
        if math.prod(dims) != len(devices):
            raise ValueError(f"tile_assignment_dimensions {list(dims)} hold {math.prod(dims)} "
                             f"devices but {len(devices)} are listed")
        return HloSharding.tiled(np.array(devices, dtype=np.int64).reshape(dims),
                                 last_tile_dim_replicate=replicate_last,
                                 subgroup_types=subgroups)
    return HloSharding._from_tiles(tiles, replicate_last, subgroups)


# --------------------------------------------------------------------------
# Text parsing
# --------------------------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<space>\s+|/\*.*?\*/)
  | (?P<punct><=|[{}\[\](),=])
  | (?P<int>-?\d+)
  | (?P<word>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<string>"(?:[^"\\]|\\.)*")
""", re.VERBOSE | re.DOTALL)


class _Parser(TokenStream):
    """Recursive-descent parser for XLA's sharding text."""

    def __init__(self, text: str):
        super().__init__(text, _TOKEN, "sharding")

    def int_list(self, open_: str, close: str) -> list[int]:
        self.expect(open_)
        values = [self.integer()]
        while self.peek() == ",":
            self.next()
            values.append(self.integer())
        self.expect(close)
        return values

    def parse(self) -> HloSharding:
        self.expect("{")
        if self.peek() in ("{", "}"):
            elements = []
            if self.peek() != "}":
                elements.append(self.single(expect_brace=True))
                while self.peek() == ",":
                    self.next()
                    elements.append(self.single(expect_brace=True))
            self.expect("}")
            result = HloSharding.tuple_sharding(elements)
        else:
            result = self.single(expect_brace=False)
        if self.index != len(self.tokens):
            raise self.error(f"unexpected {self.peek()!r} after the sharding")
        return result

    def skip_braced(self) -> None:
        self.expect("{")
        depth = 1
        while depth:
            text = self.next()[1]
            depth += {"{": 1, "}": -1}.get(text, 0)

    def single(self, expect_brace: bool) -> HloSharding:
        if expect_brace:
            self.expect("{")
        start = self.tokens[self.index - 1][2]
        flags: set[str] = set()
        device: Optional[int] = None
        dims: Optional[list[int]] = None
        devices: Optional[list[int]] = None
        iota: Optional[tuple[list[int], list[int]]] = None
        subgroups: Optional[list[OpShardingType]] = None
        while self.peek() != "}":
            kind, text, pos = self.next()
            if text in ("replicated", "manual", "unknown", "unreduced", "maximal",
                        "last_tile_dim_replicate"):
                flags.add(text)
            elif text == "device":
                self.expect("=")
                device = self.integer()
            elif text == "devices":
                self.expect("=")
                dims = self.int_list("[", "]")
                if self.peek() == "<=":
                    self.next()
                    reshape_dims = self.int_list("[", "]")
                    perm = list(range(len(reshape_dims)))
                    if self.peek() == "T":
                        if len(reshape_dims) == 1:
                            raise self.error("a one-dimensional iota takes no transpose")
                        self.next()
                        perm = self.int_list("(", ")")
                    elif len(reshape_dims) > 1:
                        raise self.error("expected 'T(' with the transpose of a multi-"
                                         "dimensional iota")
                    iota = (reshape_dims, perm)
                else:
                    devices = [self.integer()]
                    while self.peek() == ",":
                        self.next()
                        devices.append(self.integer())
            elif text == "last_tile_dims":
                self.expect("=")
                self.expect("{")
                subgroups = []
                while True:
                    kind, name, pos = self.next()
                    if name not in _SUBGROUP_BY_NAME:
                        raise self.error(f"unknown subgroup type {name!r}", pos)
                    subgroups.append(_SUBGROUP_BY_NAME[name])
                    if self.peek() != ",":
                        break
                    self.next()
                self.expect("}")
            elif text == "metadata":
                self.expect("=")
                self.skip_braced()
            elif text in ("shard_as", "shard_like"):
                raise self.error("shard groups (shard_as / shard_like) are not supported", pos)
            else:
                raise self.error(f"unexpected {text!r}", pos)
        self.expect("}")
        return self.build(start, flags, device, dims, devices, iota, subgroups)

    def build(self, start, flags, device, dims, devices, iota, subgroups) -> HloSharding:
        def error(message):
            return self.error(message, start)
        simple = flags & {"replicated", "manual", "unknown", "unreduced"}
        if simple:
            if len(simple) > 1 or "maximal" in flags or dims is not None or device is not None:
                raise error("a replicated, manual, unknown or unreduced sharding takes "
                            "nothing else")
            (name,) = simple
            return {"replicated": HloSharding.replicate, "manual": HloSharding.manual,
                    "unknown": HloSharding.unknown, "unreduced": HloSharding.unreduced}[name]()
        if "maximal" in flags:
            if device is None or dims is not None:
                raise error("a maximal sharding needs exactly 'device=N'")
            if device < 0:
                raise error("device ids must be >= 0")
            return HloSharding.maximal(device)
        if dims is None:
            raise error("expected 'devices=[...]', 'replicated', 'manual' or 'maximal'")
        if device is not None:
            raise error("'device=' belongs to maximal shardings")
        if subgroups is not None and "last_tile_dim_replicate" in flags:
            raise error("give either last_tile_dim_replicate or last_tile_dims, not both")
        if any(d <= 0 for d in dims):
            raise error(f"tile dimensions must be positive, got {dims}")
        replicate_last = "last_tile_dim_replicate" in flags
        types = tuple(subgroups or ())
        if len(types) > len(dims):
            raise error(f"{len(types)} subgroup types for {len(dims)} tile dimensions")
        try:
            if iota is not None:
                reshape_dims, perm = iota
                _check_iota(tuple(dims), tuple(reshape_dims), tuple(perm))
                return HloSharding._from_tiles(_Tiles.iota(dims, reshape_dims, perm),
                                               replicate_last, types)
            if len(devices) <= 1:
                raise ValueError("a tiled sharding needs more than one device")
            if math.prod(dims) != len(devices):
                raise ValueError(f"tile dimensions {dims} hold {math.prod(dims)} devices "
                                 f"but {len(devices)} are listed")
            return HloSharding.tiled(np.array(devices, dtype=np.int64).reshape(dims),
                                     last_tile_dim_replicate=replicate_last,
                                     subgroup_types=types)
        except ValueError as problem:
            raise error(str(problem)) from None

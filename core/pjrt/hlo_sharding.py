"""``HloSharding``: how XLA lays one array out over devices, in pure Python.

An [`HloSharding`][pjrt.hlo_sharding.HloSharding] is the compiler's view of a sharding: it names devices by their
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

Serialisation is XLA's ``OpSharding`` proto (`pjrt._sharding.op_sharding` holds the field
numbers and the reader), the text parser lives in `pjrt._sharding.hlo_text`, and the
tile-assignment arithmetic in `pjrt._sharding.tile_assignment`; this module puts them together.

Metadata (``metadata={op_name="..."}`` in text, field 7 in protos) is accepted and dropped:
it does not change the layout and XLA leaves it out of equality too.
"""
from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence

import numpy as np

from ._sharding.hlo_text import parse_sharding_text
from ._sharding.op_sharding import (SUBGROUP_NAMES, SUBGROUP_ORDER, OpShardingType, decode_op_sharding,
                           encode_op_sharding)
from ._sharding.op_sharding import subgroup_types as _checked_subgroup_types
from ._sharding.tile_assignment import TileAssignment, check_iota, group_minor_iota_dims_sorted

__all__ = ["HloSharding", "OpShardingType"]

_REPLICATED, _MANUAL, _UNKNOWN, _UNREDUCED, _MAXIMAL, _TILED, _TUPLE = (
    "replicated", "manual", "unknown", "unreduced", "maximal", "tiled", "tuple")


def _int_list(name: str, values: Iterable) -> tuple[int, ...]:
    out = []
    for value in values:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must hold ints, got {value!r}")
        out.append(int(value))
    return tuple(out)



    return tuple(out)


class HloSharding:
    """XLA's description of how one value is laid out over logical devices.

    Immutable and hashable; two shardings are equal when they describe the same layout,
    whatever their spelling (an iota form equals the same ids listed explicitly).
    Build one with the class methods (`replicate`, `manual`, `maximal`,
    `tiled`, `iota_tile`, `tuple_sharding`) or parse one with
    `from_string` / `from_proto`.

    Queries follow jaxlib's ``HloSharding``, with one deliberate difference in kind:
    ``tile_assignment_dimensions``, ``tile_assignment_devices`` and ``subgroup_types`` are
    properties here, not methods. Like XLA's ``IsTileMaximal``, `is_maximal` is also
    true for a replicated sharding (the whole array on each device); use
    `unique_device` for "one device, which one".
    """

    __slots__ = ("_kind", "_tiles", "_replicate_on_last_tile_dim", "_subgroup_types",
                 "_elements", "_hash")

    def __init__(self, *args, **kwargs):
        raise TypeError("build an HloSharding with HloSharding.replicate(), .manual(), "
                        ".maximal(), .tiled(), .iota_tile(), .from_string() or .from_proto()")

    @classmethod
    def _make(cls, kind: str, tiles: Optional[TileAssignment] = None, replicate_last: bool = False,
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
        return cls._make(_MAXIMAL, TileAssignment.explicit(np.array([device_id])))

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
          subgroup_types: `OpShardingType` REPLICATED, MANUAL or UNREDUCED per
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
        return cls._from_tiles(TileAssignment.explicit(array), last_tile_dim_replicate,
                               _checked_subgroup_types(subgroup_types))

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
          dims: the tile assignment's dimensions (as in `tiled`).
          reshape_dims: dimensions whose product is that of ``dims``; default ``[n]``.
          transpose_perm: a permutation of ``range(len(reshape_dims))``; default identity.
          last_tile_dim_replicate, subgroup_types: as in `tiled`.

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
        check_iota(dims, reshape_dims, perm)
        return cls._from_tiles(TileAssignment.iota(dims, reshape_dims, perm),
                               last_tile_dim_replicate, _checked_subgroup_types(subgroup_types))

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
    def _from_tiles(cls, tiles: TileAssignment, replicate_last: bool,
                    subgroups: tuple) -> "HloSharding":
        if subgroups:
            if replicate_last:
                raise ValueError("give either last_tile_dim_replicate or subgroup_types, not both")
            if len(subgroups) > len(tiles.dims):
                raise ValueError(f"{len(subgroups)} subgroup types for a tile assignment of "
                                 f"rank {len(tiles.dims)}")
            return _subgroup(tiles, subgroups)
        if replicate_last:
            return _partial_tile(tiles)
        return cls._make(_TILED, tiles)

    # ----- queries --------------------------------------------------------

    def is_tuple(self) -> bool:
        """Whether this is a tuple sharding (see `tuple_elements`)."""
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
        ``IsTileMaximal``); see `unique_device` for the single-device case."""
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
                     + ", ".join(SUBGROUP_NAMES[t] for t in self._subgroup_types) + "}")
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
        (`is_tuple`, `tuple_elements`).

        Raises:
          TypeError: ``text`` is not a str.
          ValueError: the text is not a valid sharding; the message shows where.
        """
        if not isinstance(text, str):
            raise TypeError(f"from_string() needs a str, got {type(text).__name__}")
        return parse_sharding_text(text, cls)

    # ----- proto ----------------------------------------------------------

    def to_proto(self) -> bytes:
        """Serialise as an ``xla.OpSharding`` proto (fields in number order, as protobuf
        writes them; an iota tile assignment is written in the iota form)."""
        if self._kind == _TUPLE:
            return encode_op_sharding(OpShardingType.TUPLE, tuple_shardings=[
                element.to_proto() for element in self._elements])
        kind = {_REPLICATED: OpShardingType.REPLICATED, _MANUAL: OpShardingType.MANUAL,
                _UNKNOWN: OpShardingType.UNKNOWN, _UNREDUCED: OpShardingType.UNREDUCED,
                _MAXIMAL: OpShardingType.MAXIMAL, _TILED: OpShardingType.OTHER}[self._kind]
        tiles = self._tiles
        explicit = tiles is not None and tiles.iota_form is None
        return encode_op_sharding(
            kind,
            tile_dims=tiles.dims if self._kind == _TILED else (),
            devices=(int(d) for d in tiles.array.flat) if explicit else None,
            replicate_on_last_tile_dim=self._replicate_on_last_tile_dim,
            last_tile_dims=self._subgroup_types,
            iota=tiles.iota_form if tiles is not None else None)

    @classmethod
    def from_proto(cls, proto) -> "HloSharding":
        """Parse an ``xla.OpSharding``, normalising as XLA's ``FromProto`` does (a tile
        assignment of one device is replicated).

        Args:
          proto: the serialised message (bytes-like), or a protobuf ``OpSharding`` object
            (anything with a ``SerializeToString()`` method, such as jaxlib's
            ``xla_client.OpSharding``).

        Raises:
          TypeError: ``proto`` is neither bytes nor a protobuf message.
          ValueError: the message is malformed or inconsistent, or uses shard groups or
            XLA's ``named_sharding`` form, which are not supported.
        """
        if not isinstance(proto, (bytes, bytearray, memoryview)):
            serialize = getattr(proto, "SerializeToString", None)
            if not callable(serialize):
                raise TypeError("from_proto() needs the serialised bytes or an OpSharding "
                                f"protobuf message, got {type(proto).__name__}")
            proto = serialize()
            if not isinstance(proto, (bytes, bytearray, memoryview)):
                raise TypeError(f"SerializeToString() returned {type(proto).__name__}, "
                                "not bytes")
        return decode_op_sharding(bytes(proto), cls)

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


# ----- XLA's normal forms of a tiled sharding ------------------------------------------
# (HloSharding::PartialTile and HloSharding::Subgroup; kept out of the class, which holds
# the layout and its queries.)
def _partial_tile(tiles: TileAssignment) -> HloSharding:
    # HloSharding::PartialTile: the last dimension replicates.
    group = tiles.dims[-1]
    if len(tiles.dims) == 1 or group == tiles.size:
        return HloSharding.replicate()
    if group == 1:
        return HloSharding._make(_TILED, tiles.reshape(tiles.dims[:-1]))
    if tiles.iota_form is not None:
        reshape_dims, perm = tiles.iota_form
        if reshape_dims[perm[-1]] == group:
            return HloSharding._make(_TILED, tiles, replicate_last=True)
        regrouped = group_minor_iota_dims_sorted(reshape_dims, perm, group)
        if regrouped is not None:
            return HloSharding._make(_TILED, TileAssignment.iota(tiles.dims, *regrouped),
                             replicate_last=True)
    # Devices within a replication group are interchangeable; XLA lists them sorted.
    array = np.sort(tiles.array.reshape(-1, group), axis=1).reshape(tiles.dims)
    return HloSharding._make(_TILED, TileAssignment.explicit(array), replicate_last=True)

def _subgroup(tiles: TileAssignment, types: tuple) -> HloSharding:
    # HloSharding::Subgroup: drop size-one subgroups, merge equal types, sort the types.
    data_rank = len(tiles.dims) - len(types)
    if all(t == types[0] for t in types) and math.prod(tiles.dims[:data_rank]) == 1:
        return {OpShardingType.MANUAL: HloSharding.manual,
                OpShardingType.REPLICATED: HloSharding.replicate,
                OpShardingType.UNREDUCED: HloSharding.unreduced}[types[0]]()
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
        for kind in SUBGROUP_ORDER:
            if kind in dims_of:
                perm.extend(dims_of[kind])
                merged_shape.append(math.prod(tiles.dims[d] for d in dims_of[kind]))
                merged_types.append(kind)
        full_perm = perm + removed
        tiles = tiles.transpose(full_perm).reshape(merged_shape)
        types = tuple(merged_types)
    if types == (OpShardingType.REPLICATED,):
        return _partial_tile(tiles)
    if types == (OpShardingType.MANUAL,) and tiles.size == tiles.dims[-1]:
        return HloSharding.manual()
    if types and types[-1] == OpShardingType.REPLICATED:
        # Sort the replication groups as PartialTile does, then restore the subgroup types.
        partial = _partial_tile(tiles)
        return HloSharding._make(_TILED, partial._tiles, subgroups=types)
    return HloSharding._make(_TILED, tiles, subgroups=types)

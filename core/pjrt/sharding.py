"""Sharding types: how a global array is split over the devices of a client.

The names and behaviour follow jax's (``jax.sharding``):

* :class:`Mesh`: an n-d array of devices with a name per axis;
* :class:`PartitionSpec` (alias :data:`P`): for each array dimension, the mesh axes that
  split it (``P('x', None)``, ``P(('x', 'y'))``);
* :class:`NamedSharding` (a mesh and a spec), :class:`SingleDeviceSharding` and
  :class:`GSPMDSharding` (devices plus an :class:`~pjrt.hlo_sharding.HloSharding`), all
  :class:`Sharding`\\ s.

Every sharding answers the same questions (which devices, which slice of the array on
each, what shape a shard has) from one representation: its ``HloSharding`` for the array's
rank. A ``NamedSharding`` gets it from :func:`spec_to_hlo_sharding`, a pure cached function,
so ``shard_shape`` and ``devices_indices_map`` cannot disagree with each other or with what
a compiled program is told.

The text forms a StableHLO program carries are here too: Shardy's ``#sdy.sharding<...>``
and ``sdy.mesh`` (:meth:`NamedSharding.to_sdy_text`, :func:`parse_sdy_sharding`), GSPMD's
``mhlo.sharding`` strings (:meth:`Sharding.to_mhlo_text`, :func:`sharding_from_mhlo_text`),
and :func:`parse_program_shardings`, which reads them off a module's ``main`` signature.
"""
from __future__ import annotations

import functools
import itertools
import math
import weakref
from typing import Iterable, Optional, Sequence, Union

import numpy as np

from .device import Device
from .device_list import DeviceList
from .errors import XlaRuntimeError
from .hlo_sharding import HloSharding, OpShardingType

__all__ = [
    "GSPMDSharding", "IndivisibleError", "Mesh", "NamedSharding", "P", "PartitionSpec",
    "PmapSharding", "Sharding", "SingleDeviceSharding", "sharding_from_mhlo_text",
    "spec_to_hlo_sharding",
]

Index = tuple  # of slices, one per array dimension


class IndivisibleError(ValueError):
    """An array dimension is not a multiple of the number of shards along it."""


# --------------------------------------------------------------------------
# PartitionSpec
# --------------------------------------------------------------------------

class _Unconstrained:
    """The ``P.UNCONSTRAINED`` marker: the compiler may shard this dimension as it likes."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCONSTRAINED"

    def __reduce__(self):
        return (_Unconstrained, ())


UNCONSTRAINED = _Unconstrained()


def _canonical_entry(entry):
    # jax's normalisation: a list is a tuple, a one-axis tuple is the axis, () is None.
    if entry is None or entry is UNCONSTRAINED:
        return entry
    if isinstance(entry, str):
        return entry
    if isinstance(entry, (tuple, list)):
        names = tuple(entry)
        for name in names:
            if not isinstance(name, str):
                raise TypeError(f"PartitionSpec axis names are str, got {name!r} in {entry!r}")
        if not names:
            return None
        return names[0] if len(names) == 1 else names
    raise TypeError(f"a PartitionSpec entry is None, an axis name or a tuple of axis names, "
                    f"got {entry!r}")


class PartitionSpec:
    """Which mesh axes split each dimension of an array.

    Entry ``i`` is None (dimension ``i`` is not split), an axis name (split over that mesh
    axis), or a tuple of names (split over their product, the first name major); dimensions
    past the last entry are not split. ``P.UNCONSTRAINED`` leaves the choice to the compiler.

    Entries are normalised as jax does: lists become tuples, a one-name tuple is the name
    and an empty tuple is None, so ``P(('x',)) == P('x')``. Trailing Nones are kept, and
    as in jax ``P('x') != P('x', None)`` (use :meth:`Sharding.is_equivalent_to` to compare
    layouts).

    Raises:
      TypeError: an entry is not None, a str or a tuple of str.
    """

    __slots__ = ("_partitions", "_hash")
    UNCONSTRAINED = UNCONSTRAINED

    def __init__(self, *partitions):
        object.__setattr__(self, "_partitions", tuple(_canonical_entry(p) for p in partitions))
        object.__setattr__(self, "_hash", hash(self._partitions))

    def __setattr__(self, name, value):
        raise AttributeError("PartitionSpec is immutable")

    @property
    def partitions(self) -> tuple:
        """The normalised entries."""
        return self._partitions

    def __len__(self) -> int:
        return len(self._partitions)

    def __iter__(self):
        return iter(self._partitions)

    def __getitem__(self, index):
        return self._partitions[index]

    def __eq__(self, other) -> bool:
        if not isinstance(other, PartitionSpec):
            return NotImplemented
        return self._partitions == other._partitions

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"P({repr(self._partitions)[1:-1]})"

    def __reduce__(self):
        return (PartitionSpec, self._partitions)

    def axis_names(self) -> tuple[str, ...]:
        """The mesh axes this spec uses, in order of appearance."""
        names = []
        for entry in self._partitions:
            if isinstance(entry, str):
                names.append(entry)
            elif isinstance(entry, tuple):
                names.extend(entry)
        return tuple(names)

    def normalized(self, ndim: int) -> "PartitionSpec":
        """This spec padded with None to ``ndim`` entries, UNCONSTRAINED read as None.

        Raises:
          ValueError: the spec has more than ``ndim`` entries.
        """
        if len(self) > ndim:
            raise ValueError(f"PartitionSpec {self} has {len(self)} entries, more than the "
                             f"array's rank {ndim}")
        entries = [None if e is UNCONSTRAINED else e for e in self._partitions]
        return PartitionSpec(*entries, *([None] * (ndim - len(entries))))


P = PartitionSpec


# --------------------------------------------------------------------------
# Mesh
# --------------------------------------------------------------------------

class Mesh:
    """An n-d array of devices with one name per axis.

    Args:
      devices: a numpy array (any rank, dtype object) or nested lists of
        :class:`~pjrt.Device`\\ s of one client, each at most once.
      axis_names: one str per dimension of ``devices`` (a single str for a 1-d mesh).

    A mesh is immutable, hashable, and equal to another with the same names and the same
    devices in the same places. A mesh with no devices is :attr:`empty`.

    Raises:
      TypeError: an element is not a Device, or a name is not a str.
      ValueError: the names repeat or do not match the rank, a device appears twice, the
        devices belong to different clients, or the nested lists are ragged.
    """

    __slots__ = ("_devices", "_axis_names", "_flat", "_hash", "_device_list",
                 "__weakref__")

    def __init__(self, devices, axis_names: Union[str, Sequence[str]]):
        if isinstance(axis_names, str):
            axis_names = (axis_names,)
        axis_names = tuple(axis_names)
        for name in axis_names:
            if not isinstance(name, str):
                raise TypeError(f"mesh axis names must be str, got {name!r} in {axis_names}")
        if len(set(axis_names)) != len(axis_names):
            repeated = sorted({n for n in axis_names if axis_names.count(n) > 1})
            raise ValueError(f"mesh axis names must be unique; {axis_names} repeats "
                             f"{', '.join(map(repr, repeated))}")
        try:
            array = np.array(devices, dtype=object)
        except ValueError as error:
            raise ValueError(f"mesh devices must form a rectangular array: {error}") from None
        if any(isinstance(e, (list, tuple, np.ndarray)) for e in array.flat):
            raise ValueError("mesh devices must form a rectangular array; the nested lists "
                             "are ragged")
        if array.ndim != len(axis_names):
            raise ValueError(f"a mesh needs one axis name per dimension of its devices: the "
                             f"devices have shape {array.shape} ({array.ndim} dimensions) "
                             f"but the axis names are {axis_names}")
        flat = tuple(array.flat)
        if array.ndim == 0 and flat == (None,):
            flat = ()   # jax's spelling of the empty mesh: a 0-d array holding None
        for element in flat:
            if not isinstance(element, Device):
                raise TypeError(f"mesh devices must be pjrt Devices, got "
                                f"{type(element).__name__} ({element!r})")
        if len(set(flat)) != len(flat):
            repeated = sorted({str(d) for d in flat if flat.count(d) > 1})
            raise ValueError(f"a mesh cannot hold a device twice: {', '.join(repeated)} "
                             f"appear more than once")
        if len({id(d.client) for d in flat}) > 1:
            raise ValueError("a mesh cannot mix devices of different clients")
        array.setflags(write=False)
        init = object.__setattr__     # the mesh is immutable once built
        init(self, "_devices", array)
        init(self, "_axis_names", axis_names)
        init(self, "_flat", flat)
        init(self, "_hash", hash((axis_names, array.shape, flat)))
        init(self, "_device_list", None)

    # ----- properties -----------------------------------------------------

    @property
    def devices(self) -> np.ndarray:
        """The devices, a read-only object array shaped like the mesh."""
        return self._devices

    @property
    def axis_names(self) -> tuple[str, ...]:
        """One name per mesh dimension."""
        return self._axis_names

    @property
    def axis_sizes(self) -> tuple[int, ...]:
        """The size of each mesh dimension (the devices' shape)."""
        return self._devices.shape

    @property
    def shape(self) -> dict[str, int]:
        """Axis name to size, in axis order (a fresh dict each time)."""
        return dict(zip(self._axis_names, self.axis_sizes))

    @property
    def shape_tuple(self) -> tuple[tuple[str, int], ...]:
        """``((name, size), ...)`` in axis order."""
        return tuple(zip(self._axis_names, self.axis_sizes))

    @property
    def size(self) -> int:
        """Number of devices."""
        return len(self._flat)

    @property
    def empty(self) -> bool:
        """Whether the mesh has no devices."""
        return not self._flat

    @property
    def device_ids(self) -> np.ndarray:
        """The devices' ids, a read-only int array shaped like the mesh.

        Raises:
          ValueError: the mesh is empty.
        """
        if self.empty:
            raise ValueError("an empty mesh has no device ids")
        ids = np.array([d.id for d in self._flat], dtype=np.int64).reshape(self._devices.shape)
        ids.setflags(write=False)
        return ids

    @property
    def local_devices(self) -> list[Device]:
        """The devices this process can address, in mesh order."""
        return [d for d in self._flat if d.is_addressable]

    @property
    def device_list(self) -> DeviceList:
        """The devices in row-major mesh order, which is the order an executable uses.

        Raises:
          ValueError: the mesh is empty.
        """
        if self._device_list is None:
            object.__setattr__(self, "_device_list", DeviceList(self._flat))
        return self._device_list

    @property
    def _flat_devices_tuple(self) -> tuple[Device, ...]:
        return self._flat

    # ----- identity and text ----------------------------------------------

    def __eq__(self, other) -> bool:
        if not isinstance(other, Mesh):
            return NotImplemented
        return self is other or (self._axis_names == other._axis_names
                                 and self._devices.shape == other._devices.shape
                                 and self._flat == other._flat)

    def __hash__(self) -> int:
        return self._hash

    def __setattr__(self, name, value):
        raise AttributeError("Mesh is immutable")

    def __str__(self) -> str:
        if self.empty:
            return "Mesh()"
        return "Mesh(" + ", ".join(f"{n!r}: {s}" for n, s in self.shape_tuple) + ")"

    def __repr__(self) -> str:
        return f"Mesh(axis_sizes={self.axis_sizes}, axis_names={self._axis_names!r})"

    def to_sdy_text(self, name: str = "mesh") -> str:
        """The Shardy mesh definition, e.g. ``sdy.mesh @mesh = <["x"=2, "y"=4]>``.

        The device order is not part of it: as in jax's lowering, a program names devices
        by mesh position, and the executable's device assignment
        (``NamedSharding._device_assignment``) maps positions to devices.
        """
        from .sharding_text import _sdy_mesh_body, _symbol

        return f"sdy.mesh @{_symbol(name)} = {_sdy_mesh_body(self.shape_tuple, None)}"


# --------------------------------------------------------------------------
# Lowering a spec to an HloSharding
# --------------------------------------------------------------------------

def _spec_error(spec, axis_names, message: str) -> ValueError:
    return ValueError(f"PartitionSpec {spec} {message} (mesh axes: {axis_names})")


def _check_spec(spec: PartitionSpec, axis_names: tuple) -> None:
    seen = set()
    for name in spec.axis_names():
        if name not in axis_names:
            raise _spec_error(spec, axis_names, f"names axis {name!r}, which is not in the mesh")
        if name in seen:
            raise _spec_error(spec, axis_names, f"uses mesh axis {name!r} more than once")
        seen.add(name)


def spec_to_hlo_sharding(axis_names: Sequence[str], axis_sizes: Sequence[int],
                         spec: PartitionSpec, ndim: int, *,
                         unreduced_axes: Iterable[str] = (), manual_axes: Iterable[str] = (),
                         device_ids: Optional[Sequence[int]] = None) -> HloSharding:
    """The HloSharding of a rank-``ndim`` array split by ``spec`` over a mesh, as jax
    lowers a ``NamedSharding``.

    Devices are named by their row-major position in the mesh (the executable's device
    assignment lists the mesh's devices in that order). Axes of size one are dropped
    first. Each array dimension is cut into the product of its axes' sizes; mesh axes the
    spec does not use become one trailing replicated subgroup (manual and unreduced axes
    their own subgroups); the ids are the mesh positions reshaped to the mesh shape and
    transposed so that each dimension's axes come in spec order. On a 2x4 mesh
    ``('x', 'y')``, for a rank-2 array::

        P('x', 'y')  ->  {devices=[2,4]<=[8]}
        P('y', 'x')  ->  {devices=[4,2]<=[2,4]T(1,0)}
        P('x')       ->  {devices=[2,1,4]<=[8] last_tile_dim_replicate}
        P()          ->  {replicated}

    (as jax 0.10.2 prints them). The result is cached: the arguments are plain values.

    Args:
      axis_names, axis_sizes: the mesh's axes.
      spec: a :class:`PartitionSpec` over those axes.
      ndim: the array's rank.
      unreduced_axes, manual_axes: mesh axes in an unreduced or manual subgroup.
      device_ids: a mesh whose positions are not ``0..n-1`` in order (Shardy's
        ``device_ids=[...]``): the id at each position, row-major.

    Raises:
      ValueError: the spec names an axis not in the mesh, uses one twice, or has more
        entries than ``ndim``; or the axis names and sizes do not match.
      TypeError: ``spec`` is not a PartitionSpec.
    """
    if not isinstance(spec, PartitionSpec):
        raise TypeError(f"spec must be a PartitionSpec, got {type(spec).__name__}")
    return _lower(tuple(axis_names), tuple(int(s) for s in axis_sizes), spec, int(ndim),
                  frozenset(unreduced_axes), frozenset(manual_axes),
                  None if device_ids is None else tuple(int(i) for i in device_ids))


@functools.lru_cache(maxsize=4096)
def _lower(axis_names: tuple, axis_sizes: tuple, spec: PartitionSpec, ndim: int,
           unreduced: frozenset, manual: frozenset,
           device_ids: Optional[tuple]) -> HloSharding:
    if len(axis_names) != len(axis_sizes):
        raise ValueError(f"mesh axis names {axis_names} and sizes {axis_sizes} differ in length")
    _check_spec(spec, axis_names)
    if len(spec) > ndim:
        raise _spec_error(spec, axis_names, f"has {len(spec)} entries, more than the array's "
                                            f"rank {ndim}")
    for name in unreduced | manual:
        if name not in axis_names:
            raise ValueError(f"axis {name!r} is not in the mesh axes {axis_names}")
    # Axes of size one split nothing; jax drops them before lowering.
    kept = [(n, s) for n, s in zip(axis_names, axis_sizes) if s != 1]
    position = {name: i for i, (name, _) in enumerate(kept)}
    size_of = dict(kept)

    dims = [1] * ndim
    permutation = []
    for dim, entry in enumerate(spec.partitions):
        if entry is None or entry is UNCONSTRAINED:
            continue
        for name in (entry,) if isinstance(entry, str) else entry:
            if name in size_of:
                dims[dim] *= size_of[name]
                permutation.append(position[name])
    used = set(permutation)
    subgroup_axes: dict[OpShardingType, list[int]] = {}
    for i, (name, _) in enumerate(kept):
        if i in used:
            continue
        kind = (OpShardingType.MANUAL if name in manual else
                OpShardingType.UNREDUCED if name in unreduced else OpShardingType.REPLICATED)
        subgroup_axes.setdefault(kind, []).append(i)
    if not used and set(subgroup_axes) <= {OpShardingType.REPLICATED}:
        if device_ids is not None and not axis_names:
            return HloSharding.maximal(device_ids[0])
        return HloSharding.replicate()
    subgroup_types = []
    for kind in sorted(subgroup_axes):      # by enum value, as jax orders them
        subgroup_types.append(kind)
        dims.append(math.prod(kept[i][1] for i in subgroup_axes[kind]))
        permutation.extend(subgroup_axes[kind])
    reshape_dims = [s for _, s in kept]
    if device_ids is None:
        return HloSharding.iota_tile(dims, reshape_dims, permutation,
                                     subgroup_types=subgroup_types)
    ids = np.asarray(device_ids, dtype=np.int64).reshape(reshape_dims)
    return HloSharding.tiled(ids.transpose(permutation).reshape(dims),
                             subgroup_types=subgroup_types)


# --------------------------------------------------------------------------
# Shapes and indices from an HloSharding (jax's op_shardings rules)
# --------------------------------------------------------------------------

def _is_replicated_like(hlo: HloSharding) -> bool:
    # jax treats a one-device sharding (maximal) as replicated when mapping indices.
    return hlo.is_replicated() or (not hlo.is_tuple() and hlo.num_devices() == 1)


def _partitions(hlo: HloSharding, owner) -> tuple[list[int], int]:
    """(shards per array dimension, devices per shard) of a tiled HloSharding."""
    if hlo.is_manual() or hlo.is_unknown():
        raise ValueError(f"{owner} is {hlo}, which has no per-device layout of the global "
                         f"array")
    if hlo.is_unreduced():
        return [], 1
    dims = list(hlo.tile_assignment_dimensions)
    types = list(hlo.subgroup_types)
    if hlo.replicate_on_last_tile_dim():
        return dims[:-1], dims[-1]
    if types == [OpShardingType.UNREDUCED]:
        return dims[:-1], 1
    if sorted(types) == [OpShardingType.REPLICATED, OpShardingType.UNREDUCED]:
        return dims[:-2], dims[-2:][types.index(OpShardingType.REPLICATED)]
    if types:
        raise ValueError(f"{owner} is {hlo}, whose {', '.join(t.name for t in types)} "
                         f"subgroups have no per-device layout of the global array")
    return dims, 1


def _check_shape(global_shape) -> tuple[int, ...]:
    try:
        shape = tuple(global_shape)
    except TypeError:
        raise TypeError(f"global_shape must be a sequence of ints, got {global_shape!r}") from None
    for size in shape:
        if isinstance(size, (bool, np.bool_)) or not isinstance(size, (int, np.integer)):
            raise TypeError(f"global_shape must hold ints, got {global_shape!r}")
        if size < 0:
            raise ValueError(f"global_shape sizes must be >= 0, got {global_shape!r}")
    return tuple(int(s) for s in shape)


def _shard_shape(hlo: HloSharding, shape: tuple, owner) -> tuple[int, ...]:
    if hlo.is_tuple():
        raise ValueError(f"{owner} has a tuple sharding; shapes are per leaf")
    if _is_replicated_like(hlo) or hlo.is_unreduced():
        return shape
    partitions, _ = _partitions(hlo, owner)
    if len(partitions) != len(shape):
        raise ValueError(f"{owner} tiles {len(partitions)} dimensions but the shape {shape} "
                         f"has {len(shape)}")
    out = []
    for dim, (size, parts) in enumerate(zip(shape, partitions)):
        quotient, remainder = divmod(size, parts)
        if remainder:
            raise IndivisibleError(
                f"{owner} splits dimension {dim} of shape {shape} into {parts} shards, but "
                f"{size} is not a multiple of {parts} (shards per dimension: {partitions})")
        out.append(quotient)
    return tuple(out)


def _indices(hlo: HloSharding, shape: tuple, num_devices: int, owner) -> list[Index]:
    """The slice of the global array held by each logical device ``0..num_devices-1``."""
    if hlo.is_unreduced() or OpShardingType.UNREDUCED in hlo.subgroup_types:
        raise ValueError(f"{owner} is unreduced ({hlo}): devices hold partial sums, not "
                         f"slices")
    if _is_replicated_like(hlo):
        return [(slice(None),) * len(shape)] * num_devices
    partitions, replicas = _partitions(hlo, owner)
    per_dim = []
    for size, parts in zip(shape, partitions):
        if parts == 1:
            per_dim.append([slice(None)])
        else:
            step = size // parts
            per_dim.append([slice(i * step, (i + 1) * step) for i in range(parts)])
    indices: list = [None] * num_devices
    devices = iter(hlo.tile_assignment_devices)
    for index in itertools.product(*per_dim):
        for _ in range(replicas):
            indices[next(devices)] = index
    return indices


# --------------------------------------------------------------------------
# Memory kinds
# --------------------------------------------------------------------------

_device_memory_kinds: "weakref.WeakKeyDictionary[Device, tuple]" = weakref.WeakKeyDictionary()


def _memory_kinds(devices: Iterable[Device]) -> tuple[Optional[str], tuple[str, ...]]:
    """(default kind, all kinds) of the first addressable device; (None, ()) if unknown."""
    for device in devices:
        if not device.is_addressable:
            continue
        kinds = _device_memory_kinds.get(device)
        if kinds is None:
            try:
                default = device.default_memory().kind
                others = [m.kind for m in device.addressable_memories() if m.kind != default]
                kinds = (default, (default, *others))
            except XlaRuntimeError:
                kinds = (None, ())      # a plugin without memory spaces
            _device_memory_kinds[device] = kinds
        return kinds
    return None, ()


def _canonical_memory_kind(kind: Optional[str], devices: Sequence[Device]) -> Optional[str]:
    # As jax does: no kind means the devices' default memory, and a kind must exist.
    if kind is not None and not isinstance(kind, str):
        raise TypeError(f"memory_kind must be a str or None, got {type(kind).__name__}")
    default, kinds = _memory_kinds(devices)
    if kind is None:
        return default
    if kinds and kind not in kinds:
        device = next(d for d in devices if d.is_addressable)
        raise ValueError(f"{device} has no memory of kind {kind!r}; its memory kinds: "
                         f"{', '.join(kinds)}")
    return kind


# --------------------------------------------------------------------------
# Sharding classes
# --------------------------------------------------------------------------

class Sharding:
    """How a global array is laid out over devices (base class).

    Subclasses provide :meth:`to_hlo_sharding`, :attr:`_device_assignment`,
    :attr:`memory_kind`, :meth:`with_memory_kind`, :attr:`is_fully_replicated`; the rest is
    derived here, so every answer comes from the same ``HloSharding``.
    """

    __slots__ = ("_cache", "__weakref__")

    # ----- to provide -----------------------------------------------------

    def to_hlo_sharding(self, ndim: int) -> HloSharding:
        """The HloSharding of a rank-``ndim`` array with this sharding (device ids are
        positions in :attr:`_device_assignment`)."""
        raise NotImplementedError

    @property
    def _device_assignment(self) -> tuple[Device, ...]:
        """The devices in the order an executable uses them (logical id ``i`` is entry ``i``)."""
        raise NotImplementedError

    @property
    def memory_kind(self) -> Optional[str]:
        """The memory kind of the shards (the devices' default when none was given)."""
        raise NotImplementedError

    def with_memory_kind(self, kind: str) -> "Sharding":
        """The same sharding in another memory kind."""
        raise NotImplementedError

    @property
    def is_fully_replicated(self) -> bool:
        """Whether every device holds the whole array."""
        raise NotImplementedError

    # ----- derived ----------------------------------------------------------

    def _to_xla_hlo_sharding(self, num_dimensions: int) -> HloSharding:
        """jax's private name for :meth:`to_hlo_sharding`."""
        return self.to_hlo_sharding(num_dimensions)

    def to_mhlo_text(self, ndim: int) -> str:
        """The ``mhlo.sharding`` attribute string for a rank-``ndim`` array."""
        return str(self.to_hlo_sharding(ndim))

    @property
    def _internal_device_list(self) -> DeviceList:
        return DeviceList(self._device_assignment)

    @property
    def device_set(self) -> set[Device]:
        """The devices holding a shard."""
        return set(self._device_assignment)

    @property
    def addressable_devices(self) -> set[Device]:
        """The devices of :attr:`device_set` this process can address."""
        return {d for d in self._device_assignment if d.is_addressable}

    @property
    def is_fully_addressable(self) -> bool:
        """Whether this process can address every device."""
        return all(d.is_addressable for d in self._device_assignment)

    @property
    def num_devices(self) -> int:
        """Number of devices."""
        return len(self._device_assignment)

    def _cached(self, key, compute):
        try:
            cache = self._cache
        except AttributeError:
            cache = {}
            object.__setattr__(self, "_cache", cache)
        if key not in cache:
            cache[key] = compute()
        return cache[key]

    def shard_shape(self, global_shape: Sequence[int]) -> tuple[int, ...]:
        """The shape of each device's shard of an array of ``global_shape``.

        Raises:
          IndivisibleError (a ValueError): a dimension is not a multiple of its number of
            shards; the message names the dimension, the shape and the factors.
          ValueError: the sharding does not fit the rank, or has no per-device layout
            (manual).
        """
        shape = _check_shape(global_shape)
        return self._cached(("shape", shape), lambda: _shard_shape(
            self.to_hlo_sharding(len(shape)), shape, self))

    def devices_indices_map(self, global_shape: Sequence[int]) -> dict[Device, Index]:
        """The slice of an array of ``global_shape`` each device holds, as jax computes it:
        a tuple with one slice per dimension, ``slice(None)`` where a dimension is whole.

        Raises:
          as :meth:`shard_shape` (an uneven split raises here too, as in jax); ValueError
          for an unreduced sharding.
        """
        shape = _check_shape(global_shape)

        def compute():
            self.shard_shape(shape)
            devices = self._device_assignment
            indices = _indices(self.to_hlo_sharding(len(shape)), shape, len(devices), self)
            return tuple(zip(devices, indices))
        return dict(self._cached(("indices", shape), compute))

    def addressable_devices_indices_map(self, global_shape: Sequence[int]) -> dict[Device, Index]:
        """:meth:`devices_indices_map` restricted to the devices this process addresses."""
        return {d: index for d, index in self.devices_indices_map(global_shape).items()
                if d.is_addressable}

    def is_equivalent_to(self, other: "Sharding", ndim: int) -> bool:
        """Whether both place the same shards of a rank-``ndim`` array on the same devices
        in the same memory kind (jax's rule: replicated layouts match whatever their
        spelling, and the device assignments must be equal, in order)."""
        if not isinstance(other, Sharding):
            return False
        mine, theirs = self.to_hlo_sharding(ndim), other.to_hlo_sharding(ndim)
        same_layout = mine == theirs or (_is_replicated_like(mine) and _is_replicated_like(theirs))
        return (same_layout and self.memory_kind == other.memory_kind
                and self._device_assignment == other._device_assignment)


class NamedSharding(Sharding):
    """A :class:`Mesh` and a :class:`PartitionSpec` over its axes.

    Args:
      mesh: a non-empty :class:`Mesh`.
      spec: a :class:`PartitionSpec` naming axes of ``mesh``.
      memory_kind: the memory the shards live in; None means the devices' default.

    Equal to another NamedSharding with an equal mesh, an equal spec (after
    :class:`PartitionSpec`'s normalisation; trailing Nones count, as in jax) and the same
    memory kind. The HloSharding comes from :func:`spec_to_hlo_sharding`.

    Raises:
      TypeError: ``mesh`` or ``spec`` has the wrong type.
      ValueError: the mesh is empty, the spec names an axis not in the mesh or uses one
        twice, or the memory kind is not one the devices have.
    """

    __slots__ = ("_mesh", "_spec", "_memory_kind", "_hash")

    def __init__(self, mesh: Mesh, spec: PartitionSpec, *, memory_kind: Optional[str] = None):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"mesh must be a pjrt Mesh, got {type(mesh).__name__}")
        if not isinstance(spec, PartitionSpec):
            raise TypeError(f"spec must be a PartitionSpec, got {type(spec).__name__}")
        if mesh.empty:
            raise ValueError("a NamedSharding needs a mesh with devices")
        _check_spec(spec, mesh.axis_names)
        self._mesh = mesh
        self._spec = spec
        self._memory_kind = _canonical_memory_kind(memory_kind, mesh._flat_devices_tuple)
        self._hash = hash((mesh, self._memory_kind, spec))

    @property
    def mesh(self) -> Mesh:
        """The mesh."""
        return self._mesh

    @property
    def spec(self) -> PartitionSpec:
        """The partition spec, as given (not padded to any rank)."""
        return self._spec

    @property
    def memory_kind(self) -> Optional[str]:
        return self._memory_kind

    @property
    def _device_assignment(self) -> tuple[Device, ...]:
        # Row-major mesh order: logical device i is the mesh's i-th device.
        return self._mesh._flat_devices_tuple

    @property
    def _internal_device_list(self) -> DeviceList:
        return self._mesh.device_list

    @property
    def device_set(self) -> set[Device]:
        return set(self._mesh._flat_devices_tuple)

    @property
    def is_fully_replicated(self) -> bool:
        """Whether every device holds the whole array: the spec's axes multiply to one
        (jax's rule; it does not depend on the array's rank)."""
        sizes = self._mesh.shape
        return math.prod(sizes[name] for name in self._spec.axis_names()) == 1

    def to_hlo_sharding(self, ndim: int) -> HloSharding:
        """See :func:`spec_to_hlo_sharding`.

        Raises:
          ValueError: the spec has more entries than ``ndim``.
        """
        return spec_to_hlo_sharding(self._mesh.axis_names, self._mesh.axis_sizes,
                                    self._spec, ndim)

    def with_memory_kind(self, kind: str) -> "NamedSharding":
        return NamedSharding(self._mesh, self._spec, memory_kind=kind)

    def to_sdy_text(self, ndim: Optional[int] = None, *, mesh_name: str = "mesh") -> str:
        """Shardy's form, e.g. ``#sdy.sharding<@mesh, [{"x"}, {}]>``: one ``{...}`` per
        dimension listing its axes, ``{}`` for an unsplit dimension and ``{?}`` for
        ``P.UNCONSTRAINED``. Pair it with ``mesh.to_sdy_text(mesh_name)``.

        Args:
          ndim: the array's rank (default: the spec's length).
          mesh_name: the name of the ``sdy.mesh`` it refers to.

        Raises:
          ValueError: the spec has more entries than ``ndim``.
        """
        from .sharding_text import SdyDim, _symbol

        ndim = len(self._spec) if ndim is None else ndim
        if len(self._spec) > ndim:
            raise _spec_error(self._spec, self._mesh.axis_names,
                              f"has {len(self._spec)} entries, more than the rank {ndim}")
        dims = []
        for entry in list(self._spec) + [None] * (ndim - len(self._spec)):
            if entry is UNCONSTRAINED:
                dims.append(SdyDim((), is_open=True))
            else:
                names = () if entry is None else (entry,) if isinstance(entry, str) else entry
                dims.append(SdyDim(tuple(names), is_open=False))
        return f"#sdy.sharding<@{_symbol(mesh_name)}, [{', '.join(map(str, dims))}]>"

    @classmethod
    def from_sdy_text(cls, text: str, mesh: Mesh, *,
                      memory_kind: Optional[str] = None) -> "NamedSharding":
        """Read ``#sdy.sharding<@name, [...]>`` as a sharding over ``mesh``, whatever the
        mesh's name in the text. An open dimension with axes (``{"x", ?}``) reads as its
        axes; an open empty one (``{?}``) as ``P.UNCONSTRAINED``; ``replicated={...}`` is
        implied and dropped.

        Raises:
          ValueError: the text is malformed, names an axis ``mesh`` lacks, has
            ``unreduced`` axes, or carries an inline mesh different from ``mesh``.
        """
        from .sharding_text import SdyMesh, _SdyParser

        parsed = _SdyParser(text).sharding()
        mesh_def = SdyMesh(mesh.axis_names, mesh.axis_sizes)
        if parsed.inline_mesh is not None and (
                parsed.inline_mesh.axis_names != mesh_def.axis_names
                or parsed.inline_mesh.axis_sizes != mesh_def.axis_sizes
                or parsed.inline_mesh.device_ids is not None):
            raise ValueError(f"the sharding {text!r} carries its own mesh, which is not {mesh}")
        sharding = parsed.resolve({parsed.mesh_name: mesh_def} if parsed.mesh_name else {})
        if sharding.unreduced_axes:
            raise ValueError(f"unreduced axes {sharding.unreduced_axes} cannot be expressed "
                             f"as a PartitionSpec")
        return cls(mesh, sharding.to_partition_spec(), memory_kind=memory_kind)

    def __eq__(self, other) -> bool:
        if not isinstance(other, NamedSharding):
            return NotImplemented
        return self is other or (self._spec == other._spec
                                 and self._memory_kind == other._memory_kind
                                 and self._mesh == other._mesh)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        memory = "" if self._memory_kind is None else f", memory_kind={self._memory_kind}"
        return f"NamedSharding(mesh={self._mesh}, spec={self._spec}{memory})"


class SingleDeviceSharding(Sharding):
    """The whole array on one device.

    Args:
      device: the :class:`~pjrt.Device`.
      memory_kind: as for :class:`NamedSharding`.

    Raises:
      TypeError: ``device`` is not a Device.
      ValueError: the memory kind is not one the device has.
    """

    __slots__ = ("_device", "_memory_kind")

    def __init__(self, device: Device, *, memory_kind: Optional[str] = None):
        if not isinstance(device, Device):
            raise TypeError(f"device must be a pjrt Device, got {type(device).__name__}")
        self._device = device
        self._memory_kind = _canonical_memory_kind(memory_kind, (device,))

    @property
    def memory_kind(self) -> Optional[str]:
        return self._memory_kind

    @property
    def _device_assignment(self) -> tuple[Device, ...]:
        return (self._device,)

    @property
    def is_fully_replicated(self) -> bool:
        return True

    def to_hlo_sharding(self, ndim: int) -> HloSharding:
        return HloSharding.replicate()

    def with_memory_kind(self, kind: str) -> "SingleDeviceSharding":
        return SingleDeviceSharding(self._device, memory_kind=kind)

    def __eq__(self, other) -> bool:
        if not isinstance(other, SingleDeviceSharding):
            return NotImplemented
        return self._device == other._device and self._memory_kind == other._memory_kind

    def __hash__(self) -> int:
        return hash((self._device, self._memory_kind))

    def __repr__(self) -> str:
        memory = "" if self._memory_kind is None else f", memory_kind={self._memory_kind}"
        return f"SingleDeviceSharding(device={self._device!r}{memory})"


def _coerce_hlo_sharding(value) -> HloSharding:
    # Accept our HloSharding, serialised OpSharding bytes, or jaxlib's OpSharding and
    # HloSharding (through their serialised form), so shardings from jax carry over.
    if isinstance(value, HloSharding):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return HloSharding.from_proto(bytes(value))
    if hasattr(value, "SerializeToString"):
        return HloSharding.from_proto(value.SerializeToString())
    if hasattr(value, "to_proto") and hasattr(value.to_proto(), "SerializeToString"):
        return HloSharding.from_proto(value.to_proto().SerializeToString())
    raise TypeError(f"expected an HloSharding or a serialised OpSharding, got "
                    f"{type(value).__name__}")


class GSPMDSharding(Sharding):
    """A list of devices and an :class:`~pjrt.hlo_sharding.HloSharding` whose device ids
    are positions in that list: what a compiled executable reports.

    Args:
      devices: the devices (a sequence or :class:`~pjrt.DeviceList`); device id ``i`` of
        the HloSharding is ``devices[i]``.
      op_sharding: an :class:`~pjrt.hlo_sharding.HloSharding`, or a serialised
        ``OpSharding`` (bytes; jaxlib's ``OpSharding``/``HloSharding`` are accepted too).
      memory_kind: as for :class:`NamedSharding`.

    Equal to another GSPMDSharding with the same devices in the same order, the same
    memory kind and an equal HloSharding, any two replicated ones counting as equal (jax's
    rule).

    Raises:
      TypeError: the arguments have the wrong types.
      ValueError: the device list is empty or repeats a device, the sharding is a tuple,
        or its device ids are not the positions ``0..len(devices)-1``.
    """

    __slots__ = ("_devices", "_hlo", "_memory_kind", "_hash")

    def __init__(self, devices: Union[Sequence[Device], DeviceList], op_sharding, *,
                 memory_kind: Optional[str] = None):
        self._devices = devices if isinstance(devices, DeviceList) else DeviceList(devices)
        hlo = _coerce_hlo_sharding(op_sharding)
        if hlo.is_tuple():
            raise ValueError(f"a GSPMDSharding takes one array's sharding, not the tuple {hlo}")
        count = len(self._devices)
        if hlo.is_tiled() and sorted(hlo.tile_assignment_devices) != list(range(count)):
            raise ValueError(f"the sharding {hlo} must use each device id 0..{count - 1} once "
                             f"for {count} devices")
        if hlo.unique_device() is not None and hlo.unique_device() >= count:
            raise ValueError(f"the sharding {hlo} names device {hlo.unique_device()} but only "
                             f"{count} devices are given")
        self._hlo = hlo
        self._memory_kind = _canonical_memory_kind(memory_kind, tuple(self._devices))
        layout_hash = hash(HloSharding.replicate()) if self.is_fully_replicated else hash(hlo)
        self._hash = hash((self._devices, layout_hash, self._memory_kind))

    @classmethod
    def get_replicated(cls, devices: Union[Sequence[Device], DeviceList], *,
                       memory_kind: Optional[str] = None) -> "GSPMDSharding":
        """A replicated sharding over ``devices``."""
        return cls(devices, HloSharding.replicate(), memory_kind=memory_kind)

    @property
    def memory_kind(self) -> Optional[str]:
        return self._memory_kind

    @property
    def _device_assignment(self) -> tuple[Device, ...]:
        return tuple(self._devices)

    @property
    def _internal_device_list(self) -> DeviceList:
        return self._devices

    @property
    def is_fully_replicated(self) -> bool:
        return _is_replicated_like(self._hlo)

    def to_hlo_sharding(self, ndim: int) -> HloSharding:
        return self._hlo

    def with_memory_kind(self, kind: str) -> "GSPMDSharding":
        return GSPMDSharding(self._devices, self._hlo, memory_kind=kind)

    def __eq__(self, other) -> bool:
        if not isinstance(other, GSPMDSharding):
            return NotImplemented
        if self is other:
            return True
        same_layout = self._hlo == other._hlo or (self.is_fully_replicated
                                                 and other.is_fully_replicated)
        return (same_layout and self._memory_kind == other._memory_kind
                and self._devices == other._devices)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        memory = "" if self._memory_kind is None else f", memory_kind={self._memory_kind}"
        return f"GSPMDSharding({self._hlo}{memory})"


class PmapSharding(Sharding):
    """One slice of a leading (``axis``) dimension per device, that dimension removed.

    What replicated (pmap-style) execution produces: device ``i`` holds ``x[i]``. A rank-``n``
    global array has rank ``n - 1`` shards.
    """

    __slots__ = ("_devices", "_axis", "_memory_kind")

    def __init__(self, devices: Union[Sequence[Device], DeviceList], axis: int = 0, *,
                 memory_kind: Optional[str] = None):
        devices = tuple(devices)
        DeviceList(devices)  # validates: non-empty, distinct, one client
        if axis < 0:
            raise ValueError(f"PmapSharding axis must be >= 0, not {axis}")
        object.__setattr__(self, "_devices", devices)
        object.__setattr__(self, "_axis", axis)
        object.__setattr__(self, "_memory_kind", _canonical_memory_kind(memory_kind, devices))

    @property
    def axis(self) -> int:
        return self._axis

    @property
    def memory_kind(self) -> Optional[str]:
        return self._memory_kind

    @property
    def _device_assignment(self) -> tuple[Device, ...]:
        return self._devices

    @property
    def is_fully_replicated(self) -> bool:
        return len(self._devices) == 1

    def to_hlo_sharding(self, ndim: int) -> HloSharding:
        if ndim <= self._axis:
            raise ValueError(f"a PmapSharding over axis {self._axis} needs rank > {self._axis}")
        dims = [1] * ndim
        dims[self._axis] = len(self._devices)
        return HloSharding.iota_tile(dims)

    def with_memory_kind(self, kind: str) -> "PmapSharding":
        return PmapSharding(self._devices, self._axis, memory_kind=kind)

    def _check(self, global_shape) -> tuple[int, ...]:
        shape = _check_shape(global_shape)
        if len(shape) <= self._axis or shape[self._axis] != len(self._devices):
            raise ValueError(f"a PmapSharding over {len(self._devices)} devices needs dimension "
                             f"{self._axis} of size {len(self._devices)}; shape {shape}")
        return shape

    def shard_shape(self, global_shape: Sequence[int]) -> tuple[int, ...]:
        shape = self._check(global_shape)
        return shape[:self._axis] + shape[self._axis + 1:]

    def devices_indices_map(self, global_shape: Sequence[int]) -> dict[Device, Index]:
        shape = self._check(global_shape)
        whole = (slice(None),) * len(shape)
        return {device: whole[:self._axis] + (i,) + whole[self._axis + 1:]
                for i, device in enumerate(self._devices)}

    def __eq__(self, other) -> bool:
        if not isinstance(other, PmapSharding):
            return NotImplemented
        return (self._devices == other._devices and self._axis == other._axis
                and self._memory_kind == other._memory_kind)

    def __hash__(self) -> int:
        return hash(("pmap", self._devices, self._axis, self._memory_kind))

    def __repr__(self) -> str:
        return f"PmapSharding(devices={list(self._devices)}, axis={self._axis})"


def sharding_from_mhlo_text(text: str, devices: Union[Sequence[Device], DeviceList], *,
                            memory_kind: Optional[str] = None) -> GSPMDSharding:
    """A :class:`GSPMDSharding` from an ``mhlo.sharding`` string such as
    ``"{devices=[2,1,4]<=[8] last_tile_dim_replicate}"`` and the program's devices.

    Raises:
      ValueError: the text is not a valid sharding, or does not fit ``devices``.
    """
    return GSPMDSharding(devices, HloSharding.from_string(text), memory_kind=memory_kind)

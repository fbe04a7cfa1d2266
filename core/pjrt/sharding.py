"""Sharding types: how a global array is split over the devices of a client.

The names and behaviour follow jax's (``jax.sharding``):

* [`Mesh`][pjrt.mesh.Mesh]: an n-d array of devices with a name per axis;
* [`PartitionSpec`][pjrt.mesh.PartitionSpec] (alias [`P`][pjrt.mesh.PartitionSpec]): for each array dimension, the mesh axes that
  split it (``P('x', None)``, ``P(('x', 'y'))``);
* [`NamedSharding`][pjrt.sharding.NamedSharding] (a mesh and a spec), [`SingleDeviceSharding`][pjrt.sharding.SingleDeviceSharding],
  [`GSPMDSharding`][pjrt.sharding.GSPMDSharding] (devices plus an [`HloSharding`][pjrt.hlo_sharding.HloSharding]) and
  [`PmapSharding`][pjrt.sharding.PmapSharding], all [`Sharding`][pjrt.sharding.Sharding]\\ s.

``Mesh`` and ``PartitionSpec`` are defined in [`pjrt.mesh`][pjrt.mesh] and the conversions to and
from program annotations in `pjrt._sharding.annotations`; this module re-exports them,
so ``pjrt.sharding`` is the one place to import sharding names from.

Every sharding answers the same questions (which devices, which slice of the array on
each, what shape a shard has) from one representation: its ``HloSharding`` for the array's
rank. A ``NamedSharding`` gets it from `spec_to_hlo_sharding`, a pure cached function,
so ``shard_shape`` and ``devices_indices_map`` cannot disagree with each other or with what
a compiled program is told.

The text forms a StableHLO program carries: Shardy's ``#sdy.sharding<...>`` and
``sdy.mesh`` ([`NamedSharding.to_sdy_text`][pjrt.sharding.NamedSharding.to_sdy_text], [`NamedSharding.from_sdy_text`][pjrt.sharding.NamedSharding.from_sdy_text]),
GSPMD's ``mhlo.sharding`` strings ([`Sharding.to_mhlo_text`][pjrt.sharding.Sharding.to_mhlo_text],
[`sharding_from_mhlo_text`][pjrt.sharding.sharding_from_mhlo_text]); `pjrt._sharding.program_text` parses them out of a program.
"""
from __future__ import annotations

import itertools
import math
import weakref
from typing import Iterable, Optional, Sequence, Union

import numpy as np

from .device import Device
from .device_list import DeviceList
from .errors import XlaRuntimeError
from .hlo_sharding import HloSharding, OpShardingType
from .mesh import UNCONSTRAINED, Mesh, P, PartitionSpec, check_rank, check_spec_axes
from ._sharding.equivalence import REPLICATED, LayoutToken, layout_token
from ._sharding.annotations import (hlo_sharding_from_sdy, partition_spec_from_sdy,
                                   partition_spec_from_sdy_text, sdy_sharding_from_spec,
                                   spec_to_hlo_sharding)

__all__ = [
    "GSPMDSharding", "IndivisibleError", "Mesh", "NamedSharding", "P", "PartitionSpec",
    "PmapSharding", "Sharding", "SingleDeviceSharding", "UNCONSTRAINED",
    "check_and_canonicalize_memory_kind", "check_spec_axes", "hlo_sharding_from_sdy",
    "partition_spec_from_sdy", "partition_spec_from_sdy_text", "sdy_sharding_from_spec",
    "sharding_from_mhlo_text", "spec_to_hlo_sharding",
]

Index = tuple  # of slices, one per array dimension

#: The one type a cached shape's sizes have (bools and numpy ints go through the checks).
_INT = frozenset({int})


class IndivisibleError(ValueError):
    """An array dimension is not a multiple of the number of shards along it."""


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


def check_and_canonicalize_memory_kind(memory_kind: Optional[str],
                                       device_list: Iterable[Device]) -> Optional[str]:
    """The canonical memory kind of a sharding over ``device_list``, as jaxlib's function
    of this name gives it: None means the devices' default memory kind, and any other
    kind must be one the devices can address.

    The devices' kinds are those of the first addressable device (cached per device). When
    none is addressable, or the plugin has no memory spaces, a given kind is returned as
    is and None stays None.

    Args:
      memory_kind: a memory kind (``"device"``, ``"pinned_host"``...) or None.
      device_list: the sharding's devices, a `DeviceList` or a sequence of
        `Device`.

    Returns:
      ``memory_kind``, or the default kind when it is None.

    Raises:
      TypeError: ``memory_kind`` is neither a str nor None.
      ValueError: the devices have no memory of that kind; the message lists those they
        have.
    """
    if memory_kind is not None and not isinstance(memory_kind, str):
        raise TypeError(f"memory_kind must be a str or None, got {type(memory_kind).__name__}")
    default, kinds = _memory_kinds(device_list)
    if memory_kind is None:
        return default
    if kinds and memory_kind not in kinds:
        device = next(d for d in device_list if d.is_addressable)
        raise ValueError(f"{device} has no memory of kind {memory_kind!r}; its memory kinds: "
                         f"{', '.join(kinds)}")
    return memory_kind


# --------------------------------------------------------------------------
# Sharding classes
# --------------------------------------------------------------------------

class Sharding:
    """How a global array is laid out over devices (base class).

    Subclasses provide `to_hlo_sharding`, `_device_assignment`,
    `memory_kind`, `with_memory_kind`, `is_fully_replicated`; the rest is
    derived here, so every answer comes from the same ``HloSharding``.
    """

    __slots__ = ("_cache", "__weakref__")

    # ----- to provide -----------------------------------------------------

    def to_hlo_sharding(self, ndim: int) -> HloSharding:
        """The HloSharding of a rank-``ndim`` array with this sharding (device ids are
        positions in `_device_assignment`)."""
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
        """jax's private name for `to_hlo_sharding`."""
        return self.to_hlo_sharding(num_dimensions)

    def to_mhlo_text(self, ndim: int) -> str:
        """The ``mhlo.sharding`` attribute string for a rank-``ndim`` array."""
        return str(self.to_hlo_sharding(ndim))

    @property
    def ordered_devices(self) -> tuple[Device, ...]:
        """The devices in the order an executable uses them: jax's `_device_assignment`, by
        the name pjrt's own modules use."""
        return self._device_assignment

    @property
    def _internal_device_list(self) -> DeviceList:
        return DeviceList(self._device_assignment)

    @property
    def device_set(self) -> set[Device]:
        """The devices holding a shard."""
        return set(self._device_assignment)

    @property
    def addressable_devices(self) -> set[Device]:
        """The devices of `device_set` this process can address."""
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
        if type(global_shape) is tuple and _INT.issuperset(map(type, global_shape)):
            try:  # a shape of plain ints asked before (a program call asks on every call)
                return self._cache[("shape", global_shape)]
            except (AttributeError, KeyError):
                pass
        shape = _check_shape(global_shape)
        return self._cached(("shape", shape), lambda: _shard_shape(
            self.to_hlo_sharding(len(shape)), shape, self))

    def devices_indices_map(self, global_shape: Sequence[int]) -> dict[Device, Index]:
        """The slice of an array of ``global_shape`` each device holds, as jax computes it:
        a tuple with one slice per dimension, ``slice(None)`` where a dimension is whole.

        Raises:
          ValueError: for an unreduced sharding; and as `shard_shape` does (an uneven
            split raises here too, as in jax).
        """
        shape = _check_shape(global_shape)

        def compute():
            self.shard_shape(shape)
            devices = self._device_assignment
            indices = _indices(self.to_hlo_sharding(len(shape)), shape, len(devices), self)
            return tuple(zip(devices, indices))
        return dict(self._cached(("indices", shape), compute))

    def addressable_devices_indices_map(self, global_shape: Sequence[int]) -> dict[Device, Index]:
        """`devices_indices_map` restricted to the devices this process addresses."""
        return {d: index for d, index in self.devices_indices_map(global_shape).items()
                if d.is_addressable}

    def is_equivalent_to(self, other: "Sharding", ndim: int) -> bool:
        """Whether both place the same shards of a rank-``ndim`` array on the same devices
        in the same memory kind (jax's rule: replicated layouts match whatever their
        spelling, and the device assignments must be equal, in order).

        pjrt's own sharding types answer from a token each computes once per rank (see
        `pjrt._sharding.equivalence`), so asking again costs two dictionary lookups."""
        try:  # both tokens computed already (only pjrt's own types have int keys there)
            return self._cache[ndim] is other._cache[ndim]
        except (AttributeError, KeyError, TypeError):
            pass
        if not isinstance(other, Sharding):
            return False
        if type(self) in _FROZEN and type(other) in _FROZEN:
            return self._layout_token(ndim) is other._layout_token(ndim)
        mine, theirs = self.to_hlo_sharding(ndim), other.to_hlo_sharding(ndim)
        same_layout = mine == theirs or (_is_replicated_like(mine) and _is_replicated_like(theirs))
        return (same_layout and self.memory_kind == other.memory_kind
                and self._device_assignment == other._device_assignment)

    def _layout_token(self, ndim: int) -> LayoutToken:
        """The token of this sharding's layout of a rank-``ndim`` array: the same object for
        every equivalent sharding alive (computed once per rank; the sharding cannot change)."""
        try:
            return self._cache[ndim]
        except (AttributeError, KeyError):
            pass
        hlo = self.to_hlo_sharding(ndim)
        layout = REPLICATED if _is_replicated_like(hlo) else hlo
        token = layout_token((layout, self.memory_kind, tuple(self._device_assignment)))
        return self._cached(ndim, lambda: token)

    def __setattr__(self, name: str, value) -> None:
        # pjrt's sharding types are immutable once built (each attribute is set once, in
        # __init__): the cached layouts, shapes and tokens describe them for good.
        if type(self) in _FROZEN and hasattr(self, name):
            raise AttributeError(f"{type(self).__name__} is immutable")
        object.__setattr__(self, name, value)


class NamedSharding(Sharding):
    """A [`Mesh`][pjrt.mesh.Mesh] and a [`PartitionSpec`][pjrt.mesh.PartitionSpec] over its axes.

    Args:
      mesh: a non-empty [`Mesh`][pjrt.mesh.Mesh].
      spec: a [`PartitionSpec`][pjrt.mesh.PartitionSpec] naming axes of ``mesh``.
      memory_kind: the memory the shards live in; None means the devices' default.

    Equal to another NamedSharding with an equal mesh, an equal spec (after
    [`PartitionSpec`][pjrt.mesh.PartitionSpec]'s normalisation; trailing Nones count, as in jax) and the same
    memory kind. The HloSharding comes from `spec_to_hlo_sharding`.

    Raises:
      TypeError: ``mesh`` or ``spec`` has the wrong type.
      ValueError: the mesh is empty, the spec names an axis not in the mesh or uses one
        twice, or the memory kind is not one the devices have.
    """

    __slots__ = ("_mesh", "_spec", "_devices", "_memory_kind", "_hash")

    def __init__(self, mesh: Mesh, spec: PartitionSpec, *, memory_kind: Optional[str] = None):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"mesh must be a pjrt Mesh, got {type(mesh).__name__}")
        if not isinstance(spec, PartitionSpec):
            raise TypeError(f"spec must be a PartitionSpec, got {type(spec).__name__}")
        if mesh.empty:
            raise ValueError("a NamedSharding needs a mesh with devices")
        check_spec_axes(spec, mesh.axis_names)
        self._mesh = mesh
        self._spec = spec
        # Row-major mesh order: logical device i is the mesh's i-th device.
        self._devices = tuple(mesh.device_list)
        self._memory_kind = check_and_canonicalize_memory_kind(memory_kind, self._devices)
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
        return self._devices

    @property
    def _internal_device_list(self) -> DeviceList:
        return self._mesh.device_list

    @property
    def device_set(self) -> set[Device]:
        return set(self._devices)

    @property
    def is_fully_replicated(self) -> bool:
        """Whether every device holds the whole array: the spec's axes multiply to one
        (jax's rule; it does not depend on the array's rank)."""
        sizes = self._mesh.shape
        return math.prod(sizes[name] for name in self._spec.axis_names()) == 1

    def to_hlo_sharding(self, ndim: int) -> HloSharding:
        """See `spec_to_hlo_sharding`.

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
        return str(sdy_sharding_from_spec(self._mesh, self._spec, ndim, mesh_name=mesh_name))

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
        return cls(mesh, partition_spec_from_sdy_text(text, mesh), memory_kind=memory_kind)

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
      device: the `Device`.
      memory_kind: as for [`NamedSharding`][pjrt.sharding.NamedSharding].

    Raises:
      TypeError: ``device`` is not a Device.
      ValueError: the memory kind is not one the device has.
    """

    __slots__ = ("_device", "_memory_kind")

    def __init__(self, device: Device, *, memory_kind: Optional[str] = None):
        if not isinstance(device, Device):
            raise TypeError(f"device must be a pjrt Device, got {type(device).__name__}")
        self._device = device
        self._memory_kind = check_and_canonicalize_memory_kind(memory_kind, (device,))

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
        check_rank(ndim)
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
    """A list of devices and an [`HloSharding`][pjrt.hlo_sharding.HloSharding] whose device ids
    are positions in that list: what a compiled executable reports.

    Args:
      devices: the devices (a sequence or `DeviceList`); device id ``i`` of
        the HloSharding is ``devices[i]``.
      op_sharding: an [`HloSharding`][pjrt.hlo_sharding.HloSharding], or a serialised
        ``OpSharding`` (bytes; jaxlib's ``OpSharding``/``HloSharding`` are accepted too).
      memory_kind: as for [`NamedSharding`][pjrt.sharding.NamedSharding].

    Equal to another GSPMDSharding with the same devices in the same order, the same
    memory kind and an equal HloSharding, any two replicated ones counting as equal (jax's
    rule).

    Raises:
      TypeError: the arguments have the wrong types.
      ValueError: the device list is empty or repeats a device, the sharding is a tuple,
        or its device ids are not the positions ``0..len(devices)-1``.
    """

    __slots__ = ("_devices", "_assignment", "_hlo", "_memory_kind", "_hash")

    def __init__(self, devices: Union[Sequence[Device], DeviceList], op_sharding, *,
                 memory_kind: Optional[str] = None):
        self._devices = devices if isinstance(devices, DeviceList) else DeviceList(devices)
        self._assignment = tuple(self._devices)
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
        self._memory_kind = check_and_canonicalize_memory_kind(memory_kind, self._assignment)
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
        return self._assignment

    @property
    def _internal_device_list(self) -> DeviceList:
        return self._devices

    @property
    def is_fully_replicated(self) -> bool:
        return _is_replicated_like(self._hlo)

    def to_hlo_sharding(self, ndim: int) -> HloSharding:
        check_rank(ndim)
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
        object.__setattr__(self, "_memory_kind", check_and_canonicalize_memory_kind(memory_kind, devices))

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
        ndim = check_rank(ndim)
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


#: The sharding types whose instances cannot change, so that their equivalence tokens hold.
_FROZEN = frozenset({NamedSharding, SingleDeviceSharding, GSPMDSharding, PmapSharding})


def sharding_from_mhlo_text(text: str, devices: Union[Sequence[Device], DeviceList], *,
                            memory_kind: Optional[str] = None) -> GSPMDSharding:
    """A [`GSPMDSharding`][pjrt.sharding.GSPMDSharding] from an ``mhlo.sharding`` string such as
    ``"{devices=[2,1,4]<=[8] last_tile_dim_replicate}"`` and the program's devices.

    Raises:
      ValueError: the text is not a valid sharding, or does not fit ``devices``.
    """
    return GSPMDSharding(devices, HloSharding.from_string(text), memory_kind=memory_kind)


def global_shape_of_shards(sharding: Sharding, shard_shape: Sequence[int]) -> tuple[int, ...]:
    """The global shape of an array whose per-device shards, laid out by ``sharding``, have
    ``shard_shape`` (evenly split, as every pjrt Array is)."""
    if isinstance(sharding, PmapSharding):
        return (len(sharding._device_assignment),) + tuple(shard_shape)
    hlo = sharding.to_hlo_sharding(len(shard_shape))
    if not hlo.is_tiled():
        return tuple(shard_shape)
    tiles = hlo.tile_assignment_dimensions[:len(shard_shape)]
    return tuple(int(n) * int(t) for n, t in zip(shard_shape, tiles))

"""Meshes and partition specs: the names a program's sharding is written in.

* [`Mesh`][pjrt.mesh.Mesh]: an n-d array of devices with a name per axis;
* [`PartitionSpec`][pjrt.mesh.PartitionSpec] (alias [`P`][pjrt.mesh.PartitionSpec]): for each array dimension, the mesh axes that
  split it (``P('x', None)``, ``P(('x', 'y'))``), with `UNCONSTRAINED` for a
  dimension the compiler may split as it likes;
* [`check_spec_axes`][pjrt.mesh.check_spec_axes]: whether a spec fits a mesh's axes.

Both types are immutable, hashable and validated in their constructors; their names and
behaviour follow jax's (``jax.sharding``). [`pjrt.sharding`][pjrt.sharding] builds the Sharding
classes on them and re-exports them.
"""
from __future__ import annotations

from typing import Sequence, Union

import numpy as np

from .device import Device
from .device_list import DeviceList
from ._sharding.program_text import SdyMesh
from ._wire.proto_message import check_int

__all__ = ["Mesh", "P", "PartitionSpec", "UNCONSTRAINED", "check_spec_axes"]

# --------------------------------------------------------------------------
# PartitionSpec
# --------------------------------------------------------------------------

#: The highest array rank a spec or sharding is worked out for (DLPack's bound, far above what
#: any program uses): a rank is the length of lists built here.
MAX_RANK = 64


def check_rank(ndim) -> int:
    """``ndim`` as an int from 0 to `MAX_RANK`; TypeError or ValueError otherwise."""
    return check_int("ndim", ndim, 0, MAX_RANK)


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
    as in jax ``P('x') != P('x', None)`` (use `Sharding.is_equivalent_to` to compare
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
        ndim = check_rank(ndim)
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
        `Device`\\ s of one client, each at most once.
      axis_names: one str per dimension of ``devices`` (a single str for a 1-d mesh).

    A mesh is immutable, hashable, and equal to another with the same names and the same
    devices in the same places. A mesh with no devices is `empty`.

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
        return self._device_list  # pyright: ignore[reportReturnType]

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

        Raises:
          ValueError: ``name`` is not a non-empty str.
        """
        return SdyMesh(self._axis_names, self.axis_sizes).to_definition(name)


def check_spec_axes(spec: PartitionSpec, axis_names: Sequence[str]) -> None:
    """Check that ``spec`` names only axes in ``axis_names``, each at most once.

    Args:
      spec: a [`PartitionSpec`][pjrt.mesh.PartitionSpec].
      axis_names: the mesh's axis names.

    Raises:
      ValueError: the spec names an axis not in the mesh or uses one twice; the message
        names the spec, the axis and the mesh axes.
    """
    axis_names = tuple(axis_names)
    seen = set()
    for name in spec.axis_names():
        if name not in axis_names:
            raise ValueError(f"PartitionSpec {spec} names axis {name!r}, which is not in the "
                             f"mesh (mesh axes: {axis_names})")
        if name in seen:
            raise ValueError(f"PartitionSpec {spec} uses mesh axis {name!r} more than once "
                             f"(mesh axes: {axis_names})")
        seen.add(name)



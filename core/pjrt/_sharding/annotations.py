"""Sharding annotations of programs from meshes and partition specs, and back.

A program tells the compiler how each value is split in one of two forms: GSPMD's
``HloSharding`` (``mhlo.sharding = "{devices=[2,4]<=[8]}"``) or Shardy's
``#sdy.sharding<@mesh, [{"x"}, {"y"}]>`` over an ``sdy.mesh``. This module converts a
[`PartitionSpec`][pjrt.mesh.PartitionSpec] over a mesh's axes to both forms
(`spec_to_hlo_sharding`, `sdy_sharding_from_spec`) and a parsed Shardy sharding
back to a spec (`partition_spec_from_sdy`, `partition_spec_from_sdy_text`) or to
GSPMD's form (`hlo_sharding_from_sdy`).

It sits between the text layer (`pjrt._sharding.program_text`, plain data) and the Sharding
classes ([`pjrt.sharding`][pjrt.sharding], which re-exports these names).
"""
from __future__ import annotations

import functools
import math
from typing import Iterable, Optional, Sequence

import numpy as np

from ..hlo_sharding import HloSharding, OpShardingType
from ..mesh import UNCONSTRAINED, Mesh, PartitionSpec, check_rank, check_spec_axes
from .program_text import SdyDim, SdyMesh, SdySharding, parse_sdy_sharding_for_mesh

__all__ = ["hlo_sharding_from_sdy", "partition_spec_from_sdy", "partition_spec_from_sdy_text",
           "sdy_sharding_from_spec", "spec_to_hlo_sharding"]


def _rank_error(spec: PartitionSpec, axis_names: Sequence[str], ndim: int) -> ValueError:
    return ValueError(f"PartitionSpec {spec} has {len(spec)} entries, more than the array's "
                      f"rank {ndim} (mesh axes: {tuple(axis_names)})")


# --------------------------------------------------------------------------
# GSPMD: a spec over a mesh to an HloSharding
# --------------------------------------------------------------------------

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
      spec: a [`PartitionSpec`][pjrt.mesh.PartitionSpec] over those axes.
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
    return _lower(tuple(axis_names), tuple(int(s) for s in axis_sizes), spec, check_rank(ndim),
                  frozenset(unreduced_axes), frozenset(manual_axes),
                  None if device_ids is None else tuple(int(i) for i in device_ids))


@functools.lru_cache(maxsize=4096)
def _lower(axis_names: tuple, axis_sizes: tuple, spec: PartitionSpec, ndim: int,
           unreduced: frozenset, manual: frozenset,
           device_ids: Optional[tuple]) -> HloSharding:
    if len(axis_names) != len(axis_sizes):
        raise ValueError(f"mesh axis names {axis_names} and sizes {axis_sizes} differ in length")
    check_spec_axes(spec, axis_names)
    if len(spec) > ndim:
        raise _rank_error(spec, axis_names, ndim)
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
# Shardy: a spec over a mesh to and from #sdy.sharding
# --------------------------------------------------------------------------

def sdy_sharding_from_spec(mesh: Mesh, spec: PartitionSpec, ndim: Optional[int] = None, *,
                           mesh_name: str = "mesh") -> SdySharding:
    """The Shardy sharding of a rank-``ndim`` array split by ``spec`` over ``mesh``:
    one dimension per array dimension listing its axes, an empty closed one for an unsplit
    dimension and an empty open one (``{?}``) for ``P.UNCONSTRAINED``. ``str()`` of the
    result is the attribute text, e.g. ``#sdy.sharding<@mesh, [{"x"}, {}]>``; pair it with
    ``mesh.to_sdy_text(mesh_name)``.

    Args:
      mesh: the [`Mesh`][pjrt.mesh.Mesh] the spec is over.
      spec: a [`PartitionSpec`][pjrt.mesh.PartitionSpec] naming axes of ``mesh``.
      ndim: the array's rank (default: the spec's length).
      mesh_name: the name of the ``sdy.mesh`` the sharding refers to.

    Raises:
      ValueError: the spec has more entries than ``ndim``, names an axis the mesh lacks or
        uses one twice, or ``mesh_name`` is empty.
    """
    check_spec_axes(spec, mesh.axis_names)
    ndim = len(spec) if ndim is None else check_rank(ndim)
    if len(spec) > ndim:
        raise _rank_error(spec, mesh.axis_names, ndim)
    dims = []
    for entry in list(spec) + [None] * (ndim - len(spec)):
        if entry is UNCONSTRAINED:
            dims.append(SdyDim((), is_open=True))
        else:
            names = () if entry is None else (entry,) if isinstance(entry, str) else entry
            dims.append(SdyDim(tuple(names), is_open=False))
    if not isinstance(mesh_name, str) or not mesh_name:
        raise ValueError(f"a mesh name must be a non-empty str, got {mesh_name!r}")
    return SdySharding(mesh_name, SdyMesh(mesh.axis_names, mesh.axis_sizes), tuple(dims))


def partition_spec_from_sdy(sharding: SdySharding) -> PartitionSpec:
    """The spec of a Shardy sharding's dimensions: closed empty dimensions are None, open
    empty ones ``P.UNCONSTRAINED``, others their axes (openness is a propagation hint and
    is dropped). Explicitly replicated and unreduced axes are not part of a spec.

    Raises:
      TypeError: ``sharding`` is not an `SdySharding`.
    """
    if not isinstance(sharding, SdySharding):
        raise TypeError(f"expected an SdySharding, got {type(sharding).__name__}")
    entries = []
    for dim in sharding.dims:
        if not dim.axes:
            entries.append(UNCONSTRAINED if dim.is_open else None)
        else:
            entries.append(dim.axes if len(dim.axes) > 1 else dim.axes[0])  # pyright: ignore[reportGeneralTypeIssues]
    return PartitionSpec(*entries)


def hlo_sharding_from_sdy(sharding: SdySharding) -> HloSharding:
    """The GSPMD form of a Shardy sharding, as XLA converts it (see
    `spec_to_hlo_sharding`): unreduced axes become an unreduced subgroup, and a mesh
    with ``device_ids`` names its devices by those ids.

    Raises:
      TypeError: ``sharding`` is not an `SdySharding`.
      ValueError: an axis is not in the mesh or is used twice.
    """
    spec = partition_spec_from_sdy(sharding)
    mesh = sharding.mesh
    return spec_to_hlo_sharding(mesh.axis_names, mesh.axis_sizes, spec, len(sharding.dims),
                                unreduced_axes=sharding.unreduced_axes,
                                device_ids=mesh.device_ids)


def partition_spec_from_sdy_text(text: str, mesh: Mesh) -> PartitionSpec:
    """Read ``#sdy.sharding<@name, [...]>`` as a spec over ``mesh``, whatever the mesh's
    name in the text. An open dimension with axes (``{"x", ?}``) reads as its axes; an
    open empty one (``{?}``) as ``P.UNCONSTRAINED``; ``replicated={...}`` is implied and
    dropped.

    Raises:
      ValueError: the text is malformed, names an axis ``mesh`` lacks, has ``unreduced``
        axes, or carries an inline mesh different from ``mesh``.
      TypeError: ``text`` is not a str.
    """
    sharding = parse_sdy_sharding_for_mesh(text, SdyMesh(mesh.axis_names, mesh.axis_sizes))
    if sharding.unreduced_axes:
        raise ValueError(f"the sharding {text!r} has unreduced axes "
                         f"{sharding.unreduced_axes}, which a PartitionSpec cannot express")
    return partition_spec_from_sdy(sharding)

"""Tile assignments: the n-d arrays of device ids a tiled ``HloSharding`` cuts a value by.

A tile assignment is either an explicit array of ids (XLA's "V1" form) or an *iota* form: the
ids ``0..n-1`` reshaped to ``reshape_dims``, transposed by ``transpose_perm`` and reshaped to
the tile dimensions (XLA's "V2" form). The arithmetic here is that of XLA's
``xla/hlo/ir/tile_assignment.cc``: canonical iota shapes, transposes that keep the iota form
where XLA finds one, and regrouping an iota so that a replication group's ids are sorted.
Nothing here knows about shardings; [`pjrt.hlo_sharding`][pjrt.hlo_sharding] builds on it.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import numpy as np

__all__ = ["TileAssignment", "check_iota", "group_minor_iota_dims_sorted"]


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
                    perm: Sequence[int]) -> Optional["TileAssignment"]:
    """The iota form of an iota tile assignment transposed by ``perm``, or None when XLA
    finds none (the caller then falls back to an explicit list, as XLA does)."""
    kind = _transpose_kind(dims, perm)
    if kind == _NOOP:
        return TileAssignment(dims, (reshape_dims, iota_perm))
    new_dims = tuple(dims[p] for p in perm)
    if kind == _RESHAPE:
        return TileAssignment.iota(new_dims, reshape_dims, iota_perm)
    if len(reshape_dims) == 1:
        return TileAssignment.iota(new_dims, dims, perm)

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
        return TileAssignment.iota(new_dims, reshape_dims, new_perm)

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
    return TileAssignment.iota(new_dims, factors, flat_perm)


def group_minor_iota_dims_sorted(reshape_dims: Sequence[int], perm: Sequence[int],
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


class TileAssignment:
    """A tile assignment: dimensions plus either an iota form or an explicit id array.

    Immutable; build one with `iota` or `explicit`.
    """

    __slots__ = ("dims", "iota_form", "_array")

    def __init__(self, dims: tuple, iota_form: Optional[Tuple[tuple, tuple]] = None,
                 array: Optional[np.ndarray] = None):
        self.dims = tuple(int(d) for d in dims)
        self.iota_form = iota_form          # (reshape_dims, transpose_perm), canonical
        self._array = array

    @classmethod
    def iota(cls, dims: Sequence[int], reshape_dims: Sequence[int],
             perm: Sequence[int]) -> "TileAssignment":
        return cls(tuple(dims), _canonical_iota(reshape_dims, perm))

    @classmethod
    def explicit(cls, array: np.ndarray) -> "TileAssignment":
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

    def reshape(self, dims: Sequence[int]) -> "TileAssignment":
        if self.iota_form is not None:
            return TileAssignment.iota(dims, *self.iota_form)
        return TileAssignment.explicit(self.array.reshape(dims))

    def transpose(self, perm: Sequence[int]) -> "TileAssignment":
        if _transpose_kind(self.dims, perm) == _NOOP:
            return self
        if self.iota_form is not None:
            transposed = _transpose_iota(self.dims, *self.iota_form, perm)
            if transposed is not None:
                return transposed
        return TileAssignment.explicit(self.array.transpose(perm))

    def text(self) -> str:
        dims = ",".join(map(str, self.dims))
        if self.iota_form is not None:
            reshape_dims, perm = self.iota_form
            text = f"devices=[{dims}]<=[{','.join(map(str, reshape_dims))}]"
            if len(reshape_dims) > 1:
                text += f"T({','.join(map(str, perm))})"
            return text
        return f"devices=[{dims}]{','.join(str(int(d)) for d in self.array.flat)}"


def check_iota(dims: tuple, reshape_dims: tuple, perm: tuple) -> None:
    """Check that an iota form describes ``dims``: positive reshape dimensions holding as
    many devices, and a permutation of them.

    Raises:
      ValueError: naming what does not fit.
    """
    if not reshape_dims or any(d <= 0 for d in reshape_dims):
        raise ValueError(f"iota reshape_dims must be positive, got {list(reshape_dims)}")
    if math.prod(dims) != math.prod(reshape_dims):
        raise ValueError(f"tile dimensions {list(dims)} hold {math.prod(dims)} devices but "
                         f"reshape_dims {list(reshape_dims)} hold {math.prod(reshape_dims)}")
    if sorted(perm) != list(range(len(reshape_dims))):
        raise ValueError(f"transpose_perm {list(perm)} is not a permutation of "
                         f"range({len(reshape_dims)})")
